//! Thin RAII wrappers over libibverbs/librdmacm; the only place with raw verbs calls.
//!
//! Modelled on jonhoo/rust-ibverbs and rdma-core's naming, but ownership goes
//! through [`Arc`](std::sync::Arc) instead of lifetimes so the engine can keep
//! these objects in long-lived structs. Every child holds an `Arc` of each
//! parent it needs, so destruction order is right by construction:
//!
//! ```text
//! EventChannel <- CmId <- ProtectionDomain <- MemoryRegion
//!                      <- CompletionChannel <- CompletionQueue
//!                      <- QueuePair (also holds the PD and both CQs)
//! CmEvent holds the CmId it is about, so it is always acked before that id is destroyed.
//! ```
//!
//! The verbs context (`ibv_context`) used for PDs/CQs/QPs is the one librdmacm
//! opened for the device the `CmId` is bound to; holding the `CmId` keeps it alive.
//!
//! # Thread safety
//!
//! All types are `Send + Sync`. rdma-core's libibverbs and librdmacm are
//! thread-safe: providers serialise posting and polling on a QP/CQ with their
//! own locks (rxe: per-queue spinlocks), object creation/destruction goes
//! through the kernel's uverbs/ucma command interfaces (which lock per file
//! and per object), and librdmacm protects each id's event accounting with a
//! mutex. The wrappers add no unsynchronised interior state of their own (the
//! CQ's small completion stash is behind a mutex). What the libraries do *not*
//! make safe is destroying an object while it is in use; the `Arc` ownership
//! rules that out.
//!
//! # Errors
//!
//! Every failure is a [`VerbsError`]: the name of the C function that failed
//! and the errno it reported. Posting to a full send queue gives
//! `errno == ENOMEM` ([`VerbsError::is_queue_full`]); wait for completions and retry.

pub mod sys;

mod cm;
mod cq;
mod device;
mod mem;
mod qp;

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

pub use cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel};
pub use cq::{CompletionChannel, CompletionQueue, WorkCompletion};
pub use device::{device_names, Context, DeviceAttr, Gid, GidType, LinkLayer, PortAttr, PortState};
pub use mem::{fork_init, Access, ForkMode, MemoryRegion, ProtectionDomain};
pub use qp::{QpCaps, QueuePair, Sge, WriteList};

/// A failed verbs/rdma_cm call: which function, and the errno it reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VerbsError {
    /// The C function that failed, e.g. `"ibv_reg_mr"`.
    pub op: &'static str,
    /// The errno value (always positive).
    pub errno: i32,
}

impl VerbsError {
    pub fn new(op: &'static str, errno: i32) -> Self {
        VerbsError { op, errno }
    }

    /// The error of a call that failed with -1/NULL and set `errno`.
    pub(crate) fn last(op: &'static str) -> Self {
        VerbsError::new(op, last_errno())
    }

    /// Normalise a return value of a call that returns an errno directly:
    /// providers return a positive errno, some a negative one, some -1 with
    /// `errno` set.
    pub(crate) fn from_ret(op: &'static str, ret: i32) -> Self {
        let errno = match ret {
            -1 => last_errno(),
            r if r < 0 => -r,
            r => r,
        };
        VerbsError::new(op, errno)
    }

    /// No RDMA device (none present, or the named one was not found).
    pub fn is_no_device(&self) -> bool {
        self.errno == libc::ENODEV
    }

    /// `ENOMEM` from a post: the send (or receive) queue is full. Poll for
    /// completions and post again.
    pub fn is_queue_full(&self) -> bool {
        self.errno == libc::ENOMEM
    }

    /// The errno as a `std::io::Error`.
    pub fn to_io_error(self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.errno)
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (errno {})", self.op, strerror(self.errno), self.errno)
    }
}

impl std::error::Error for VerbsError {}

impl From<VerbsError> for std::io::Error {
    fn from(e: VerbsError) -> Self {
        std::io::Error::new(e.to_io_error().kind(), e)
    }
}

pub type Result<T> = std::result::Result<T, VerbsError>;

/// The current thread's errno; never 0 (EIO instead), so an error always has a cause.
pub(crate) fn last_errno() -> i32 {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(0) | None => libc::EIO,
        Some(e) => e,
    }
}

fn strerror(errno: i32) -> String {
    let mut buf = [0 as libc::c_char; 128];
    // SAFETY: buf is writable for buf.len() bytes; the libc crate binds the
    // XSI strerror_r, which NUL-terminates on success.
    let rc = unsafe { libc::strerror_r(errno, buf.as_mut_ptr(), buf.len()) };
    if rc != 0 {
        return format!("Unknown error {errno}");
    }
    // SAFETY: NUL-terminated by strerror_r.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

/// Resolve a host name or IPv4/IPv6 literal (brackets allowed) and a port
/// to socket addresses, in resolver order, waiting at most `timeout`
/// (`TimedOut` after it). A literal is parsed at once; a name is looked up
/// by the system resolver on a helper thread, which cannot be interrupted and
/// is left to finish on its own when the wait gives up.
pub fn resolve(host: &str, port: u16, timeout: std::time::Duration) -> std::io::Result<Vec<SocketAddr>> {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_owned();
    std::thread::Builder::new().name("rdmamig-resolve".into()).spawn(move || {
        let _ = tx.send((name.as_str(), port).to_socket_addrs().map(|a| a.collect()));
    })?;
    rx.recv_timeout(timeout).unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer from the resolver within {timeout:?}"),
        ))
    })
}

/// A `SocketAddr` as a C `sockaddr_storage` (what rdma_cm's calls take).
pub(crate) fn to_sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above.
            let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            sin6.sin6_scope_id = a.scope_id();
        }
    }
    storage
}

/// A C `sockaddr_storage` as a `SocketAddr`, if it holds IPv4 or IPv6.
pub(crate) fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::from((ip, u16::from_be(sin6.sin6_port))))
        }
        _ => None,
    }
}

/// Set O_NONBLOCK on a file descriptor owned by a verbs object.
pub(crate) fn set_nonblocking(fd: libc::c_int, op: &'static str) -> Result<()> {
    // SAFETY: fcntl on a descriptor we own; no memory is passed.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(VerbsError::last(op));
        }
    }
    Ok(())
}

/// poll(2) one fd for POLLIN until `deadline` (None = forever). Ok(true) when
/// readable (or in error/hangup state: the following read will say why),
/// Ok(false) when the deadline passed. EINTR is retried.
/// Waits until `a` or `b` is readable (or `deadline` passes): which of them are.
pub(crate) fn poll_readable_either(
    a: libc::c_int,
    b: libc::c_int,
    deadline: Option<std::time::Instant>,
) -> Result<(bool, bool)> {
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(d) => {
                let rem = d.saturating_duration_since(std::time::Instant::now());
                let ms = rem.as_millis() + u128::from(rem.subsec_nanos() % 1_000_000 != 0);
                ms.min(i32::MAX as u128) as i32
            }
        };
        let mut pfd = [
            libc::pollfd { fd: a, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: b, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: two valid pollfds.
        let rc = unsafe { libc::poll(pfd.as_mut_ptr(), 2, timeout_ms) };
        if rc >= 0 {
            let ready = (pfd[0].revents != 0, pfd[1].revents != 0);
            if rc > 0 || timeout_ms == 0 || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(ready);
            }
            continue;
        }
        let e = last_errno();
        if e != libc::EINTR {
            return Err(VerbsError::new("poll", e));
        }
    }
}

pub(crate) fn poll_readable(fd: libc::c_int, deadline: Option<std::time::Instant>) -> Result<bool> {
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(d) => {
                let now = std::time::Instant::now();
                if now >= d {
                    0
                } else {
                    // Round up so we never wake just before the deadline and spin.
                    let rem = d - now;
                    let ms = rem.as_millis() + u128::from(rem.subsec_nanos() % 1_000_000 != 0);
                    ms.min(i32::MAX as u128) as i32
                }
            }
        };
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if rc > 0 {
            return Ok(true);
        }
        if rc == 0 {
            if timeout_ms == 0 || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(false);
            }
            continue;
        }
        let e = last_errno();
        if e != libc::EINTR {
            return Err(VerbsError::new("poll", e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

    #[test]
    fn error_display() {
        let e = VerbsError::new("ibv_reg_mr", libc::ENOMEM);
        assert_eq!(e.to_string(), "ibv_reg_mr: Cannot allocate memory (errno 12)");
        assert!(e.is_queue_full());
        assert!(!e.is_no_device());
        assert!(VerbsError::new("x", libc::ENODEV).is_no_device());
        let io: std::io::Error = e.into();
        assert_eq!(io.raw_os_error(), None);
        assert!(io.to_string().contains("ibv_reg_mr"));
    }

    #[test]
    fn from_ret_normalises() {
        assert_eq!(VerbsError::from_ret("x", libc::ENOMEM).errno, libc::ENOMEM);
        assert_eq!(VerbsError::from_ret("x", -libc::EINVAL).errno, libc::EINVAL);
    }

    #[test]
    fn no_device_on_host() {
        // The build/CI host has no RDMA device. (On an RDMA host this checks
        // that a bogus name is reported as "no device".)
        let names = device_names().expect("device_names");
        match Context::open(None) {
            Ok(ctx) => assert!(names.contains(&ctx.name())),
            Err(e) => {
                assert!(names.is_empty());
                assert!(e.is_no_device(), "{e}");
            }
        }
        let e = Context::open(Some("no-such-rdma-device")).expect_err("bogus device opened");
        assert!(e.is_no_device(), "{e}");
    }

    #[test]
    fn sockaddr_v4() {
        let a = SocketAddr::from((Ipv4Addr::new(198, 18, 0, 1), 4444));
        let s = to_sockaddr(&a);
        // SAFETY: `to_sockaddr` wrote a sockaddr_in for an IPv4 address.
        let sin = unsafe { &*(&s as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_family, libc::AF_INET as libc::sa_family_t);
        assert_eq!(u16::from_be(sin.sin_port), 4444);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [198, 18, 0, 1]);
    }

    #[test]
    fn sockaddr_v6() {
        let a = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 7, 0, 3));
        let s = to_sockaddr(&a);
        // SAFETY: `to_sockaddr` wrote a sockaddr_in6 for an IPv6 address.
        let sin6 = unsafe { &*(&s as *const _ as *const libc::sockaddr_in6) };
        assert_eq!(sin6.sin6_family, libc::AF_INET6 as libc::sa_family_t);
        assert_eq!(u16::from_be(sin6.sin6_port), 7);
        assert_eq!(sin6.sin6_addr.s6_addr, Ipv6Addr::LOCALHOST.octets());
        assert_eq!(sin6.sin6_scope_id, 3);
    }

    #[test]
    fn resolve_literals() {
        let t = std::time::Duration::from_secs(5);
        // Literals need no resolver: they resolve even with no time at all.
        let zero = std::time::Duration::ZERO;
        assert_eq!(resolve("198.18.0.1", 5, zero).unwrap(), vec![SocketAddr::from(([198, 18, 0, 1], 5))]);
        assert_eq!(resolve("::1", 6, zero).unwrap(), vec![SocketAddr::from((Ipv6Addr::LOCALHOST, 6))]);
        assert_eq!(resolve("[::1]", 6, zero).unwrap(), vec![SocketAddr::from((Ipv6Addr::LOCALHOST, 6))]);
        assert!(!resolve("localhost", 7, t).unwrap().is_empty());
        assert!(resolve("no-such-host.invalid", 7, t).is_err());
    }

    #[test]
    fn poll_times_out() {
        let mut fds = [0; 2];
        // SAFETY: two ints for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let t = std::time::Instant::now();
        let d = t + std::time::Duration::from_millis(30);
        assert!(!poll_readable(fds[0], Some(d)).unwrap());
        assert!(t.elapsed() >= std::time::Duration::from_millis(30));
        // SAFETY: one byte from a static.
        assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
        assert!(poll_readable(fds[0], None).unwrap());
        // SAFETY: the pipe made above, closed once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
