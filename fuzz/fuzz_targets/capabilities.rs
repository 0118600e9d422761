//! Capabilities::decode on arbitrary private data; accepted input re-encodes to its first 8 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmamig::wire::Capabilities;

fuzz_target!(|data: &[u8]| {
    match Capabilities::decode(data) {
        Ok(c) => assert_eq!(c.encode()[..], data[..8]),
        Err(_) => assert!(data.len() < 8),
    }
});
