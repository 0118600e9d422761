//! `rdmamig_ram`: the registry of guest RAM blocks.

use std::os::fd::BorrowedFd;
use std::os::raw::{c_char, c_int, c_void};

use super::args::{handle, handle_mut, opt_out, string};
use super::handle::{free_box, to_boxed_mut_ptr, Castable};
use super::last_error::{record, record_or, Failure};
use super::status::rdmamig_status;
use rdmamig::RamBlocks;

/// The hypervisor's guest RAM: a list of blocks, each a range of host memory
/// with a name (QEMU's RAMBlock idstr), its offset in the hypervisor's RAM
/// address space and its length.
///
/// Create with `rdmamig_ram_new`, add blocks with `rdmamig_ram_add_block`,
/// free with `rdmamig_ram_free`. `rdmamig_connect` and
/// `rdmamig_listener_accept` copy the registry, so it may be changed or freed
/// afterwards without affecting existing connections (but the guest memory the
/// blocks point to may not: see `rdmamig_ram_add_block`).
///
/// Block indexes count from 0 in the order of `rdmamig_ram_add_block` calls.
/// A destination receiving from QEMU must add its blocks in the source's
/// order (QEMU sends no block names over RDMA).
///
/// Thread safety: not synchronised. Any number of threads may use one
/// registry through `const` pointers at the same time (including connecting
/// and accepting with it), but nothing may run concurrently with
/// `rdmamig_ram_add_block` or `rdmamig_ram_free` on the same registry.
pub struct rdmamig_ram {
    _private: [u8; 0],
}

impl Castable for rdmamig_ram {
    type RustType = RamBlocks;
}

/// A new, empty RAM registry.
///
/// Returns NULL only if rdmamig panicked. Free with `rdmamig_ram_free`.
#[no_mangle]
pub extern "C" fn rdmamig_ram_new() -> *mut rdmamig_ram {
    ffi_boundary! {
        to_boxed_mut_ptr::<rdmamig_ram>(RamBlocks::new())
    }
}

/// Frees a RAM registry. NULL is a no-op. Must not be called twice on the
/// same registry. Connections made with it keep their own copy.
#[no_mangle]
pub extern "C" fn rdmamig_ram_free(ram: *mut rdmamig_ram) {
    ffi_boundary! {
        free_box(ram)
    }
}

/// Adds a block of guest RAM: `length` bytes of host memory at `host`, at
/// `offset` in the hypervisor's RAM address space (QEMU's ram_addr_t), named
/// `name` (UTF-8, 1 to 247 bytes, unique in the registry).
///
/// On `RDMAMIG_OK` the block's index is stored in `*index_out`, which may be
/// NULL when the caller does not need it; indexes count from 0 in the order
/// blocks were added.
///
/// Memory: `host .. host + length` must stay mapped, readable and writable
/// for as long as any connection created with this registry exists (until
/// its `rdmamig_conn_free`): the library reads it (source) or writes into it
/// (destination, including with RDMA from the peer) in its own threads. The
/// guest may keep running and writing to it on a source.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER` when `ram` or `name` is
/// NULL; `RDMAMIG_ERR_INVALID_ARGUMENT` for a bad name (empty, too long, not
/// UTF-8, already added), a NULL `host`, a zero `length` or a range that
/// wraps around. The message of a failure is available from
/// `rdmamig_last_error_message`.
///
/// Thread safety: needs exclusive use of `ram`.
#[no_mangle]
pub extern "C" fn rdmamig_ram_add_block(
    ram: *mut rdmamig_ram,
    name: *const c_char,
    host: *mut c_void,
    offset: u64,
    length: u64,
    index_out: *mut u32,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_ram_add_block";
        record(|| {
            let ram = handle_mut(ram, F, "ram")?;
            let name = string(name, F, "name")?;
            // SAFETY: the C contract above: the memory outlives every connection using it.
            let index = unsafe { ram.add(name, host.cast::<u8>(), offset, length) }?;
            if let Some(out) = opt_out(index_out) {
                *out = index;
            }
            Ok(())
        })
    }
}

/// Gives block `block_index` its backing file: `fd` is an open descriptor of
/// the file that holds the block's memory, the block's first byte at file
/// offset `file_offset`, mapped shared (MAP_SHARED of a memfd, a /dev/shm or
/// hugetlbfs file: the fd of QEMU's memory backend). The file must stay that
/// file, mapped there, for as long as any connection created with this
/// registry exists.
///
/// With it, pages the guest never wrote (the file's holes, `SEEK_HOLE`) are
/// known without reading them, which would allocate them: a source sends
/// them as zero ranges unread, a destination asked to zero them leaves them
/// as they are. Without it, only private anonymous memory is known this way
/// (from /proc/self/pagemap); other memory is read.
///
/// The registry keeps a descriptor of its own (a read-only reopening through
/// /proc/self/fd; where that is impossible a duplicate made with
/// F_DUPFD_CLOEXEC, whose file offset `lseek` moves: the hypervisor must then
/// not depend on `fd`'s offset), closed when the registry and every
/// connection made with it are freed. `fd` stays the caller's.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER` when `ram` is NULL;
/// `RDMAMIG_ERR_INVALID_ARGUMENT` for a block index out of range, a negative
/// or bad `fd`, a file that is not a regular file or is shorter than
/// `file_offset` plus the block's length, a `file_offset` not placed like the
/// block's address within a page, or (where /proc/self/maps is readable) a
/// block whose memory is not the file mapped shared at `file_offset`. The
/// message of a failure is available from `rdmamig_last_error_message`.
///
/// Thread safety: needs exclusive use of `ram`.
#[no_mangle]
pub extern "C" fn rdmamig_ram_set_backing(
    ram: *mut rdmamig_ram,
    block_index: u32,
    fd: c_int,
    file_offset: u64,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_ram_set_backing";
        record(|| {
            let ram = handle_mut(ram, F, "ram")?;
            if fd < 0 {
                return Err(Failure::invalid(format!("{F}: fd {fd} is not a descriptor")));
            }
            // SAFETY: `fd` is not -1 and is the caller's open descriptor for this call (the contract
            // above); a closed one only makes the calls on it fail with EBADF.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            Ok(ram.set_backing(block_index, fd, file_offset)?)
        })
    }
}

/// The number of blocks in the registry; 0 when `ram` is NULL (which also
/// sets `rdmamig_last_error_message`).
///
/// Thread safety: may run concurrently with other `const` uses of `ram`.
#[no_mangle]
pub extern "C" fn rdmamig_ram_block_count(ram: *const rdmamig_ram) -> u32 {
    ffi_boundary! {
        record_or(0, || Ok(handle(ram, "rdmamig_ram_block_count", "ram")?.len() as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::try_from_ptr;
    use rdmamig_status::*;

    #[test]
    fn add_and_count() {
        let ram = rdmamig_ram_new();
        let mut mem = vec![0u8; 8192];
        let host = mem.as_mut_ptr().cast::<c_void>();
        let mut index = 99;
        assert_eq!(rdmamig_ram_block_count(ram), 0);
        assert_eq!(rdmamig_ram_add_block(ram, c"pc.ram".as_ptr(), host, 0, 4096, &mut index), RDMAMIG_OK);
        assert_eq!(index, 0);
        // SAFETY: inside the caller's mapping.
        let host2 = unsafe { host.add(4096) };
        assert_eq!(rdmamig_ram_add_block(ram, c"vga".as_ptr(), host2, 1 << 30, 4096, std::ptr::null_mut()), RDMAMIG_OK);
        assert_eq!(rdmamig_ram_block_count(ram), 2);
        let blocks = try_from_ptr(ram as *const rdmamig_ram).unwrap();
        assert_eq!(blocks.blocks()[1].offset, 1 << 30);
        assert_eq!(blocks.blocks()[1].host, host2 as usize);

        index = 99;
        assert_eq!(rdmamig_ram_add_block(ram, c"vga".as_ptr(), host, 0, 1, &mut index), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(index, 99, "output written only on success");
        assert_eq!(rdmamig_ram_add_block(ram, c"x".as_ptr(), host, 0, 0, &mut index), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_ram_add_block(ram, c"\xff".as_ptr(), host, 0, 1, &mut index), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_ram_add_block(ram, std::ptr::null(), host, 0, 1, &mut index), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_ram_block_count(ram), 2);
        rdmamig_ram_free(ram);
    }

    #[test]
    fn set_backing() {
        use std::os::fd::AsRawFd;
        let ram = rdmamig_ram_new();
        // SAFETY: memfd_create with a NUL-terminated name; the File owns the descriptor.
        let file = unsafe {
            let fd = libc::memfd_create(c"ffi-backing".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
        };
        file.set_len(1 << 20).unwrap();
        // SAFETY: a shared mapping of the memfd, unmapped below.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1 << 20,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(host, libc::MAP_FAILED);
        assert_eq!(rdmamig_ram_add_block(ram, c"pc.ram".as_ptr(), host, 0, 1 << 20, std::ptr::null_mut()), RDMAMIG_OK);
        assert_eq!(rdmamig_ram_set_backing(ram, 0, file.as_raw_fd(), 0), RDMAMIG_OK);
        assert_eq!(rdmamig_ram_set_backing(ram, 1, file.as_raw_fd(), 0), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_ram_set_backing(ram, 0, -1, 0), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_ram_set_backing(ram, 0, file.as_raw_fd(), 4096), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_ram_set_backing(std::ptr::null_mut(), 0, file.as_raw_fd(), 0), RDMAMIG_ERR_NULL_PARAMETER);
        // The registry's own descriptor: the caller's may go.
        drop(file);
        let blocks = try_from_ptr(ram as *const rdmamig_ram).unwrap();
        assert_eq!(blocks.blocks()[0].populated_runs(0, 1 << 20).map(|r| r.len()), Some(1), "one hole");
        rdmamig_ram_free(ram);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(host, 1 << 20) };
    }

    #[test]
    fn null_ram() {
        let n = std::ptr::null_mut();
        assert_eq!(
            rdmamig_ram_add_block(n, c"a".as_ptr(), 8 as *mut c_void, 0, 1, n.cast()),
            RDMAMIG_ERR_NULL_PARAMETER
        );
        assert_eq!(rdmamig_ram_block_count(n), 0);
        rdmamig_ram_free(n);
    }
}
