//! `rdmamig_ram`: the registry of guest RAM blocks.

use std::os::raw::{c_char, c_void};

use super::handle::{free_box, to_boxed_mut_ptr, Castable};
use super::last_error::{handle_mut, opt_out, record, set_last_error, string};
use super::status::rdmamig_status;
use crate::engine::RamBlocks;

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

/// The number of blocks in the registry; 0 when `ram` is NULL (which also
/// sets `rdmamig_last_error_message`).
///
/// Thread safety: may run concurrently with other `const` uses of `ram`.
#[no_mangle]
pub extern "C" fn rdmamig_ram_block_count(ram: *const rdmamig_ram) -> u32 {
    ffi_boundary! {
        match super::handle::try_from_ptr(ram) {
            Some(ram) => ram.len() as u32,
            None => {
                set_last_error("rdmamig_ram_block_count: ram is NULL");
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::handle::try_from_ptr;
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
