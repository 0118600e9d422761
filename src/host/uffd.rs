//! A minimal userfaultfd (Linux `<linux/userfaultfd.h>`): MISSING-mode
//! registration, fault messages, UFFDIO_COPY / ZEROPAGE / WAKE. The libc
//! crate has the system call number but not the structures or ioctls.
//!
//! A userfaultfd is the library's own (`new`) or the hypervisor's
//! (`supplied`): then the hypervisor registered guest RAM with it, reads its
//! faults, and may be another process, so addresses are in that process's
//! address space (the kernel copies from this process to that one).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::GuestRange;
use crate::{Error, ErrorKind, Result};

const UFFD_API: u64 = 0xaa;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;

// _IOWR/_IOR(0xaa, nr, size) on the common ioctl layout (x86, arm64, riscv).
const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (0xaa << 8) | nr
}
const UFFDIO_API: u64 = ioc(3, 0x3f, 24);
const UFFDIO_REGISTER: u64 = ioc(3, 0x00, 32);
const UFFDIO_WAKE: u64 = ioc(2, 0x02, 16);
const UFFDIO_COPY: u64 = ioc(3, 0x03, 40);
const UFFDIO_ZEROPAGE: u64 = ioc(3, 0x04, 32);

#[repr(C)]
struct ApiArg {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
struct RegisterArg {
    range: Range,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct CopyArg {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct ZeroArg {
    range: Range,
    mode: u64,
    zeropage: i64,
}

const _: () = assert!(std::mem::size_of::<CopyArg>() == 40 && std::mem::size_of::<ZeroArg>() == 32);

fn os_error(what: &str) -> Error {
    let e = std::io::Error::last_os_error();
    Error::new(ErrorKind::Verbs, format!("{what}: {e}"))
}

/// What an install found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Installed {
    /// Every page of the range was missing and is installed now.
    All,
    /// `n` pages were installed; others were present already and are left as they are.
    Some { installed: u64 },
}

pub struct Userfault {
    fd: OwnedFd,
}

impl Userfault {
    /// A non-blocking userfaultfd with the API handshake done. Needs
    /// CAP_SYS_PTRACE or `vm.unprivileged_userfaultfd = 1` (faults from the
    /// kernel, e.g. a `read()` into guest RAM, must be served too).
    pub fn new() -> Result<Userfault> {
        // SAFETY: a system call with flags only; it returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            return Err(os_error("userfaultfd (needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1)"));
        }
        // SAFETY: a new fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let mut api = ApiArg { api: UFFD_API, features: 0, ioctls: 0 };
        // SAFETY: a valid uffdio_api for this ioctl.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
            return Err(os_error("UFFDIO_API"));
        }
        Ok(Userfault { fd })
    }

    /// The hypervisor's userfaultfd `fd` (its API handshake done), as a
    /// descriptor of this side's own: the hypervisor keeps `fd`.
    pub fn supplied(fd: BorrowedFd<'_>) -> Result<Userfault> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| Error::new(ErrorKind::InvalidArgument, format!("not an open descriptor: {e}")))?;
        if link.as_os_str() != "anon_inode:[userfaultfd]" {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("descriptor {} is no userfaultfd ({})", fd.as_raw_fd(), link.display()),
            ));
        }
        let fd = fd.try_clone_to_owned().map_err(|e| Error::new(ErrorKind::InvalidArgument, format!("dup: {e}")))?;
        Ok(Userfault { fd })
    }

    /// Fails unless `[dst, dst + page)` is registered with a userfaultfd
    /// (the kernel refuses to fill an unregistered range with ENOENT). A
    /// missing page there becomes a zero page: call it only where that is
    /// right (guest RAM about to be dropped, or never sent).
    pub fn check_registered(&self, dst: u64, page: u64) -> Result<()> {
        self.zero_page(dst, page).map(drop).map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "guest RAM at {dst:#x} is not registered with the hypervisor's userfaultfd in missing mode \
                     (UFFDIO_ZEROPAGE: {e})"
                ),
            )
        })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Registers `guest` (page-aligned) in MISSING mode: only guest RAM is
    /// ever registered, so only guest RAM is ever written by `copy`.
    pub fn register(&self, guest: &GuestRange) -> Result<()> {
        let range = Range { start: guest.addr(), len: guest.len() };
        let mut arg = RegisterArg { range, mode: UFFDIO_REGISTER_MODE_MISSING, ioctls: 0 };
        // SAFETY: a valid uffdio_register for this ioctl.
        if unsafe { libc::ioctl(self.fd(), UFFDIO_REGISTER as _, &mut arg) } != 0 {
            return Err(os_error("UFFDIO_REGISTER"));
        }
        Ok(())
    }

    /// Up to `out.len()` fault addresses (page faults only), without blocking.
    pub fn read_faults(&self, out: &mut Vec<u64>) -> Result<()> {
        let mut msgs = [[0u8; 32]; 16];
        // SAFETY: reads whole 32-byte uffd_msg records into our buffer.
        let n = unsafe { libc::read(self.fd(), msgs.as_mut_ptr().cast(), std::mem::size_of_val(&msgs)) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(Error::new(ErrorKind::Verbs, format!("read(userfaultfd): {e}")));
        }
        for m in &msgs[..n as usize / 32] {
            if m[0] == UFFD_EVENT_PAGEFAULT {
                out.push(u64::from_ne_bytes(m[16..24].try_into().expect("8 bytes")));
            }
        }
        Ok(())
    }

    /// Copies `len` bytes at address `src` into the missing pages of
    /// `[dst, dst + len)` and wakes the threads waiting on them. Pages
    /// already present are left as they are (never overwritten: the kernel
    /// fails them with EEXIST).
    pub fn copy(&self, dst: u64, src: u64, len: u64, page: u64) -> Result<Installed> {
        let (mut pos, mut installed, mut skipped) = (0u64, 0u64, false);
        while pos < len {
            let mut arg = CopyArg { dst: dst + pos, src: src + pos, len: len - pos, mode: 0, copy: 0 };
            // SAFETY: a valid uffdio_copy for this ioctl. The kernel reads
            // `src` as user memory (EFAULT if it is not), and writes only
            // missing pages of ranges registered with this userfaultfd:
            // guest RAM (`register`), which the library never borrows.
            if unsafe { libc::ioctl(self.fd(), UFFDIO_COPY as _, &mut arg) } == 0 {
                installed += (len - pos) / page;
                break;
            }
            match arg.copy {
                // Some pages copied, then one was not missing (-EAGAIN from the ioctl).
                n if n > 0 => {
                    pos += n as u64;
                    installed += n as u64 / page;
                }
                n if n == -(libc::EEXIST as i64) => {
                    // Present: whoever installed it woke its waiters; late ones too.
                    self.wake(dst + pos, page)?;
                    pos += page;
                    skipped = true;
                }
                n if n == -(libc::EAGAIN as i64) => {}
                _ => return Err(os_error("UFFDIO_COPY")),
            }
        }
        Ok(if skipped { Installed::Some { installed } } else { Installed::All })
    }

    /// Installs a zero page at `dst` if it is missing (a page nobody has to
    /// read: it was never sent and is not stale, so it is zero).
    pub fn zero(&self, dst: u64, page: u64) -> Result<()> {
        match self.zero_page(dst, page) {
            Ok(true) => Ok(()),
            // Present: whoever installed it woke its waiters; late ones too.
            Ok(false) => self.wake(dst, page),
            Err(e) => Err(Error::new(ErrorKind::Verbs, format!("UFFDIO_ZEROPAGE: {e}"))),
        }
    }

    /// UFFDIO_ZEROPAGE of `[dst, dst + page)`: whether it installed a zero
    /// page (`false`: one was present, EEXIST).
    fn zero_page(&self, dst: u64, page: u64) -> std::io::Result<bool> {
        let mut arg = ZeroArg { range: Range { start: dst, len: page }, mode: 0, zeropage: 0 };
        // SAFETY: a valid uffdio_zeropage for this ioctl; the kernel fills
        // only a missing page of a range registered with a userfaultfd.
        if unsafe { libc::ioctl(self.fd(), UFFDIO_ZEROPAGE as _, &mut arg) } == 0 {
            return Ok(true);
        }
        if arg.zeropage == -(libc::EEXIST as i64) {
            return Ok(false);
        }
        Err(std::io::Error::last_os_error())
    }

    /// Wakes the threads waiting on `[dst, dst + len)` (a page found present).
    pub fn wake(&self, dst: u64, len: u64) -> Result<()> {
        let mut arg = Range { start: dst, len };
        // SAFETY: a valid uffdio_range for this ioctl.
        if unsafe { libc::ioctl(self.fd(), UFFDIO_WAKE as _, &mut arg) } != 0 {
            return Err(os_error("UFFDIO_WAKE"));
        }
        Ok(())
    }

    /// Leaves the fd open for the life of the process: closing it would let
    /// threads blocked on a page that was never installed run on a zero page.
    pub fn leak(self) {
        std::mem::forget(self.fd);
    }
}
