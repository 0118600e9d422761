//! decode_header on arbitrary bytes; accepted headers re-encode to the same 12 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmamig::wire::{decode_header, encode_header};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = decode_header(data) {
        let mut out = [0u8; 16];
        encode_header(&h, &mut out);
        assert_eq!(out[..12], data[..12]);
        assert_eq!(out[12..], [0u8; 4]);
    }
});
