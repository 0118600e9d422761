//! Capabilities::decode, ConnectData::decode and AcceptData::decode on
//! arbitrary private data: accepted input re-encodes to its first bytes (8,
//! 40 with a nonce, 56 with a recovery tag; 16, 80 with a challenge).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmamig::wire::{AcceptData, Capabilities, ConnectData};

fuzz_target!(|data: &[u8]| {
    match Capabilities::decode(data) {
        Ok(c) => assert_eq!(c.encode()[..], data[..8]),
        Err(_) => assert!(data.len() < 8),
    }
    if let Ok(c) = ConnectData::decode(data) {
        let bytes = c.encode();
        assert_eq!(bytes[..], data[..bytes.len()]);
    }
    if let Ok(a) = AcceptData::decode(data) {
        if data.len() >= AcceptData::LEN {
            let bytes = a.encode();
            assert_eq!(bytes[..], data[..bytes.len()]);
        } else {
            assert_eq!((a.pin_budget, a.auth), (None, None));
        }
    }
});
