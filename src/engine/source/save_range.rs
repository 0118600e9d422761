//! One range of a batch save.

/// A range of guest RAM for `Source::save_ranges`: `len` bytes at `offset` of block `block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveRange {
    pub block: u32,
    pub offset: u64,
    pub len: u64,
}
