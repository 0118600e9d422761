//! What the benchmark examples share (each includes it with `#[path]`):
//! perftest's anchors, guest RAM, a mixing function. Each program uses part
//! of it, so the parts another program uses are dead code in this one.
#![allow(dead_code)]

pub mod perftest;
mod ram;

pub use ram::Ram;

/// splitmix64's finaliser: a well-mixed 64-bit value of `z`.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
