//! Capabilities::decode, ConnectData::decode, AcceptData::decode and
//! RejectData::decode on arbitrary private data: accepted input re-encodes
//! to its first bytes (8, 40 with a nonce, 56 with a recovery tag; 16, 80
//! with a challenge; 12, or 8 and no cause).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmamig::wire::{AcceptData, Capabilities, ConnectData, RejectData};

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
    if let Ok(r) = RejectData::decode(data) {
        let bytes = r.encode();
        if data.len() >= RejectData::LEN {
            assert_eq!(bytes[..], data[..RejectData::LEN]);
        } else {
            assert_eq!((bytes[..Capabilities::LEN].to_vec(), r.cause), (data[..Capabilities::LEN].to_vec(), 0));
        }
    }
});
