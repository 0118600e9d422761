//! Big-endian reads of the decoders.

/// Big-endian u32 at `off`. Callers check the length first.
pub(super) fn be32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_be_bytes(a)
}

/// Big-endian u64 at `off`. Callers check the length first.
pub(super) fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}
