//! Capabilities::decode and AcceptData::decode on arbitrary private data:
//! accepted input re-encodes to its first 8 (or 16) bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmamig::wire::{AcceptData, Capabilities};

fuzz_target!(|data: &[u8]| {
    match Capabilities::decode(data) {
        Ok(c) => assert_eq!(c.encode()[..], data[..8]),
        Err(_) => assert!(data.len() < 8),
    }
    if let Ok(a) = AcceptData::decode(data) {
        if data.len() >= AcceptData::LEN {
            assert_eq!(a.encode()[..], data[..16]);
        } else {
            assert_eq!(a.pin_budget, None);
        }
    }
});
