//! What the fuzz targets share with the generators of their seeds (`examples/`).

/// The `dispatch` target's input.
pub mod dispatch {
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;

    /// The RAM blocks, as (name, RAM offset, length): one of three chunks (the
    /// last partial), one of exactly one chunk, one shorter than a chunk.
    pub const BLOCKS: [(&str, u64, usize); 3] =
        [("pc.ram", 0, 2 * MIB + 4 * KIB), ("vga.vram", 0x1000_0000, MIB), ("pc.rom", 0x4000_0000, 12 * KIB)];

    /// Input byte 0: the negotiated mode and the fake registrar's budget.
    pub const MODE_EXTENSIONS: u8 = 1;
    pub const MODE_PIN_ALL: u8 = 2;
    /// Bits 2-3 of the mode byte pick one of these pin budgets.
    pub const BUDGET_SHIFT: u8 = 2;
    pub const BUDGETS: [Option<u64>; 4] = [None, Some(MIB as u64), Some(3 * MIB as u64 / 2), Some(4 * MIB as u64)];
    /// Post-copy recovery negotiated (with the extensions only).
    pub const MODE_RECOVERY: u8 = 16;
}
