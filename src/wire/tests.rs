//! Unit tests: every validation error, the writer's limits, and property tests.
//! Golden byte layouts written by hand from the fact sheet live in `tests/wire_golden.rs`.

use super::*;
use proptest::prelude::*;

/// A raw message: header fields as given (padding zero) followed by `payload`.
fn raw(len: u32, kind: u32, repeat: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + payload.len());
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&repeat.to_be_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(payload);
    v
}

/// A raw message whose `len` matches the payload.
fn msg(kind: CommandType, repeat: u32, payload: &[u8]) -> Vec<u8> {
    raw(payload.len() as u32, kind as u32, repeat, payload)
}

const ALL_TYPES: [CommandType; 12] = [
    CommandType::None,
    CommandType::Error,
    CommandType::Ready,
    CommandType::QemuFile,
    CommandType::RamBlocksRequest,
    CommandType::RamBlocksResult,
    CommandType::Compress,
    CommandType::RegisterRequest,
    CommandType::RegisterResult,
    CommandType::RegisterFinished,
    CommandType::UnregisterRequest,
    CommandType::UnregisterFinished,
];

#[test]
fn constants() {
    assert_eq!(CONTROL_HEADER_LEN, 16);
    assert_eq!(CONTROL_BUFFER_SIZE, 524288);
    assert_eq!(MAX_PAYLOAD, 524272);
    assert_eq!(MAX_REPEAT, 4096);
    assert_eq!(CHUNK_SHIFT, 20);
    assert_eq!(CHUNK_SIZE, 1 << 20);
    assert_eq!(SEND_INCREMENT, 32768);
    assert_eq!(PROTOCOL_VERSION, 1);
    assert_eq!(CAP_PIN_ALL, 1);
    assert_eq!(CAP_RDMAMIG_EXT, 0x8000_0000);
    assert_eq!(CAP_RDMAMIG_AUTH, 0x4000_0000);
    assert_eq!(CAP_RDMAMIG_RESUME, 0x2000_0000);
    assert_eq!(CAP_RDMAMIG_RECOVERY, 0x1000_0000);
    assert_eq!(KNOWN_CAPS, 0xF000_0001);
    assert_eq!((RECOVERY_TOKEN_LEN, PostcopyRecovery::SIZE), (16, 20));
    assert_eq!((AUTH_NONCE_LEN, AUTH_PROOF_LEN, AuthProof::SIZE), (32, 32, 32));
    assert_eq!(BLOCK_SPEC_LEN, 256);
    assert_eq!(RegisterRequest::SIZE, 24);
    assert_eq!(RegisterResult::SIZE, 16);
    assert_eq!(DestBlock::SIZE, 32);
    assert_eq!(Compress::SIZE, 24);
    assert_eq!(BlockSpec::SIZE, 256);
    assert_eq!(BlockSpec::MAX_NAME_LEN, 247);
}

#[test]
fn command_type_numbers() {
    for (i, t) in ALL_TYPES.iter().enumerate() {
        assert_eq!(t.as_u32(), i as u32);
        assert_eq!(CommandType::try_from(i as u32), Ok(*t));
        assert_eq!(u32::from(*t), i as u32);
    }
    assert_eq!(CommandType::try_from(12), Err(DecodeError::UnknownType(12)));
    assert_eq!(CommandType::try_from(u32::MAX), Err(DecodeError::UnknownType(u32::MAX)));
    // The extension commands sit above QEMU's range, with the capability's bit.
    assert_eq!(CommandType::try_from(0x8000_0001), Ok(CommandType::End));
    assert_eq!(CommandType::try_from(0x8000_0002), Ok(CommandType::EndAck));
    assert_eq!(CommandType::try_from(0x8000_0000), Err(DecodeError::UnknownType(0x8000_0000)));
    assert_eq!(CommandType::try_from(0x8000_0003), Ok(CommandType::Auth));
    // 0x8000_0004 was rdmamig 0.8's POSTCOPY (bitmaps in the message): unknown now.
    assert_eq!(CommandType::try_from(0x8000_0004), Err(DecodeError::UnknownType(0x8000_0004)));
    assert_eq!(CommandType::try_from(0x8000_0005), Ok(CommandType::PostcopyDone));
    assert_eq!(CommandType::try_from(0x8000_0006), Ok(CommandType::PostcopyFaultQp));
    assert_eq!(CommandType::try_from(0x8000_0007), Ok(CommandType::PostcopyFaultQpResult));
    assert_eq!(CommandType::try_from(0x8000_0008), Ok(CommandType::Postcopy));
    assert_eq!(CommandType::try_from(0x8000_0009), Ok(CommandType::PostcopyRecovery));
    assert_eq!(CommandType::try_from(0x8000_000A), Ok(CommandType::PostcopyResume));
    assert_eq!(CommandType::try_from(0x8000_000B), Err(DecodeError::UnknownType(0x8000_000B)));
}

#[test]
fn postcopy_messages() {
    // 130 pages: 3 words; 1 MiB: 256 pages, 4 words.
    let a = PostcopyBlock {
        block_index: 1,
        regions: 2,
        length: 130 * 4096,
        stale_pages: 3,
        table_addr: 0x5500_0000_1000,
        table_rkey: 0x99,
    };
    let b = PostcopyBlock { block_index: 0, regions: 1, length: 1 << 20, stale_pages: 1, ..a };
    assert_eq!((postcopy_bitmap_words(a.length), postcopy_bitmap_words(b.length)), (3, 4));
    assert_eq!(postcopy_bitmap_words(4097), 1);
    assert_eq!((postcopy_table_len(&a), postcopy_table_len(&b)), (3 * 8 + 2 * 32, 4 * 8 + 32));
    let mut buf = vec![0u8; 256];
    let mut w = MessageWriter::new(&mut buf, CommandType::Postcopy);
    w.push(&a).unwrap();
    w.push(&b).unwrap();
    let n = w.finish();
    assert_eq!(n, 16 + 2 * 40);
    assert_eq!(&buf[4..12], &[0x80, 0, 0, 8, 0, 0, 0, 2]);
    let m = decode_message(&buf[..n]).unwrap();
    assert_eq!(m.entries::<PostcopyBlock>().collect::<Result<Vec<_>, _>>().unwrap(), vec![a, b]);
    assert_eq!(
        decode_message(&buf[..n - 8]).map(|m| m.kind),
        Err(DecodeError::LengthMismatch { len: 80, received: 80 + 8 })
    );
    let mut reserved = buf[..n].to_vec();
    reserved[16 + 39] = 1;
    let m = decode_message(&reserved).unwrap();
    assert_eq!(m.entries::<PostcopyBlock>().next(), Some(Err(DecodeError::ReservedNotZero { value: 1 })));
    // Nothing stale: no entry, as the writer makes it (repeat 1).
    assert_eq!(decode_message(&msg(CommandType::Postcopy, 1, &[])).unwrap().payload, &[] as &[u8]);
    assert_eq!(
        decode_message(&msg(CommandType::Postcopy, 0, &[0; 40])),
        Err(DecodeError::ZeroRepeat { kind: CommandType::Postcopy, len: 40 })
    );
    assert!(matches!(
        decode_message(&msg(CommandType::Postcopy, 2, &[0; 40])),
        Err(DecodeError::PayloadSizeMismatch { .. })
    ));

    // The tables, as read from the source: big-endian bitmap words, then regions.
    let region = |offset: u64, pages: u64| PostcopyRegion {
        offset: offset * 4096,
        length: pages * 4096,
        remote_addr: 0x7f00_0000_0000 + offset * 4096,
        rkey: 7,
    };
    let table = |words: &[u64], regions: &[PostcopyRegion]| {
        let mut v: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        for r in regions {
            let mut e = [0u8; PostcopyRegion::SIZE];
            r.encode(&mut e);
            v.extend_from_slice(&e);
        }
        v
    };
    // Pages 0, 64, 65 of `a`, in regions [0, 1) and [64, 130).
    let regions = [region(0, 1), region(64, 66)];
    let good = table(&[1, 0b11, 0], &regions);
    assert_eq!(postcopy_table(&a, &good), Ok((vec![1, 0b11, 0], regions.to_vec())));
    assert_eq!(postcopy_table(&b, &table(&[0, 0, 0, 1 << 63], &[region(255, 1)])).unwrap().0, vec![0, 0, 0, 1 << 63]);
    // Each rule, broken once.
    assert!(matches!(postcopy_table(&a, &good[..good.len() - 1]), Err(DecodeError::TooShort { .. })), "short");
    let miscounted = PostcopyBlock { stale_pages: 4, ..a };
    assert_eq!(
        postcopy_table(&miscounted, &good),
        Err(DecodeError::PostcopyBitmap { block_index: 1, declared: 4, counted: 3 })
    );
    // Page 130 is past the block's 130 pages.
    let past = PostcopyBlock { stale_pages: 1, ..a };
    assert!(matches!(postcopy_table(&past, &table(&[0, 0, 0b100], &regions)), Err(DecodeError::PostcopyBitmap { .. })));
    let regions_fail = |regions: &[PostcopyRegion]| match postcopy_table(&a, &table(&[1, 0b11, 0], regions)) {
        Err(DecodeError::PostcopyRegions { block_index: 1, why }) => why,
        other => panic!("{regions:?}: {other:?}"),
    };
    assert_eq!(regions_fail(&[region(0, 1), region(65, 65)]), "a stale page lies outside every region");
    assert_eq!(regions_fail(&[region(1, 1), region(64, 66)]), "a stale page lies outside every region");
    assert_eq!(regions_fail(&[region(0, 1), region(64, 67)]), "a region ends past the block");
    assert_eq!(regions_fail(&[region(64, 66), region(0, 1)]), "the regions are not sorted and disjoint");
    assert_eq!(regions_fail(&[region(0, 65), region(64, 66)]), "the regions are not sorted and disjoint");
    assert_eq!(regions_fail(&[region(0, 0), region(64, 66)]), "a region is empty or not page-aligned");
    let unaligned = PostcopyRegion { length: 4095, ..region(0, 1) };
    assert_eq!(regions_fail(&[unaligned, region(64, 66)]), "a region is empty or not page-aligned");
    let wraps = PostcopyRegion { remote_addr: u64::MAX - 4095, ..region(0, 1) };
    assert_eq!(regions_fail(&[wraps, region(64, 66)]), "a region wraps the source's address space");
    let mut bad_reserved = good.clone();
    bad_reserved[24 + 31] = 5;
    assert_eq!(postcopy_table(&a, &bad_reserved), Err(DecodeError::ReservedNotZero { value: 5 }));

    // POSTCOPY_DONE: exactly one summary.
    let summary = PostcopySummary { pages: 5, faults: 2, bytes: 3 << 12 };
    let mut buf = vec![0u8; 64];
    let mut w = MessageWriter::new(&mut buf, CommandType::PostcopyDone);
    w.push(&summary).unwrap();
    let n = w.finish();
    assert_eq!(decode_message(&buf[..n]).unwrap().collect_entries::<PostcopySummary>().unwrap(), vec![summary]);
    assert!(decode_message(&msg(CommandType::PostcopyDone, 1, &[])).is_err());
    assert!(decode_message(&msg(CommandType::PostcopyDone, 1, &[0; 25])).is_err());

    // POSTCOPY_FAULT_QP and its result: one endpoint, 24-bit values.
    for kind in [CommandType::PostcopyFaultQp, CommandType::PostcopyFaultQpResult] {
        let qp = QpEndpoint { qpn: 0x00ab_cdef, psn: 0x0012_3456 };
        let mut w = MessageWriter::new(&mut buf, kind);
        w.push(&qp).unwrap();
        let n = w.finish();
        assert_eq!(&buf[16..n], &[0, 0xab, 0xcd, 0xef, 0, 0x12, 0x34, 0x56]);
        assert_eq!(decode_message(&buf[..n]).unwrap().collect_entries::<QpEndpoint>().unwrap(), vec![qp]);
        assert!(decode_message(&msg(kind, 1, &[0; 7])).is_err());
        assert!(decode_message(&msg(kind, 2, &[0; 16])).is_err());
        for bad in [[1, 0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0x80, 0, 0, 0]] {
            let bytes = msg(kind, 1, &bad);
            let m = decode_message(&bytes).unwrap();
            assert!(matches!(m.collect_entries::<QpEndpoint>(), Err(DecodeError::QpEndpointRange { .. })));
        }
    }

    // POSTCOPY_RECOVERY: one entry, a port in 1..=65535 and the token.
    let offer = PostcopyRecovery { port: 0xbeef, token: [0x5a; RECOVERY_TOKEN_LEN] };
    let mut w = MessageWriter::new(&mut buf, CommandType::PostcopyRecovery);
    w.push(&offer).unwrap();
    let n = w.finish();
    assert_eq!(&buf[16..20], &[0, 0, 0xbe, 0xef]);
    assert_eq!(&buf[20..n], &[0x5a; 16]);
    assert_eq!(decode_message(&buf[..n]).unwrap().collect_entries::<PostcopyRecovery>().unwrap(), vec![offer]);
    assert!(decode_message(&msg(CommandType::PostcopyRecovery, 1, &[0; 19])).is_err());
    assert!(decode_message(&msg(CommandType::PostcopyRecovery, 2, &[0; 40])).is_err());
    for port in [0u32, 0x1_0000] {
        let mut bad = [0u8; 20];
        bad[..4].copy_from_slice(&port.to_be_bytes());
        let bytes = msg(CommandType::PostcopyRecovery, 1, &bad);
        let m = decode_message(&bytes).unwrap();
        assert_eq!(m.collect_entries::<PostcopyRecovery>(), Err(DecodeError::RecoveryPort { port }));
    }
    // POSTCOPY_RESUME: empty.
    assert!(decode_message(&msg(CommandType::PostcopyResume, 0, &[])).is_ok());
    assert!(decode_message(&msg(CommandType::PostcopyResume, 1, &[0; 8])).is_err());
}

#[test]
fn end_messages() {
    let summary = EndSummary { stream_bytes: 0x0102_0304_0506_0708, windows: 42 };
    let mut buf = vec![0u8; 64];
    let mut w = MessageWriter::new(&mut buf, CommandType::End);
    w.push(&summary).unwrap();
    let n = w.finish();
    assert_eq!(n, 32);
    assert_eq!(&buf[..16], &[0, 0, 0, 16, 0x80, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]);
    assert_eq!(&buf[16..32], &[1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 42]);
    let m = decode_message(&buf[..n]).unwrap();
    assert_eq!(m.collect_entries::<EndSummary>().unwrap(), vec![summary]);
    // END carries exactly one summary.
    assert!(decode_message(&msg(CommandType::End, 1, &[])).is_err());
    assert!(decode_message(&msg(CommandType::End, 2, &[0; 32])).is_err());
    assert!(decode_message(&msg(CommandType::End, 1, &[0; 17])).is_err());
    // END_ACK is empty.
    assert!(decode_message(&msg(CommandType::EndAck, 1, &[])).is_ok());
    assert!(decode_message(&msg(CommandType::EndAck, 1, &[0])).is_err());
}

// ---- decode_message: one test per validation error ----

#[test]
fn rejects_short_buffer() {
    for n in 0..16 {
        let b = vec![0u8; n];
        assert_eq!(decode_message(&b), Err(DecodeError::TooShort { what: "control header", needed: 16, got: n }));
        assert!(decode_header(&b).is_err());
    }
}

#[test]
fn rejects_length_mismatch() {
    // Header says 8 bytes, 4 received.
    let b = raw(8, 3, 0, &[1, 2, 3, 4]);
    assert_eq!(decode_message(&b), Err(DecodeError::LengthMismatch { len: 8, received: 20 }));
    // Header says 0, 1 trailing byte received.
    let b = raw(0, 2, 1, &[0]);
    assert_eq!(decode_message(&b), Err(DecodeError::LengthMismatch { len: 0, received: 17 }));
}

#[test]
fn rejects_too_long() {
    let b = raw(524273, 3, 0, &[]);
    assert_eq!(decode_message(&b), Err(DecodeError::TooLong { len: 524273, max: 524272 }));
    let b = raw(u32::MAX, 3, 0, &[]);
    assert_eq!(decode_message(&b), Err(DecodeError::TooLong { len: u32::MAX, max: 524272 }));
    // Even when the buffer really is that long.
    let b = raw(524273, 3, 0, &vec![0; 524273]);
    assert_eq!(decode_message(&b), Err(DecodeError::TooLong { len: 524273, max: 524272 }));
}

#[test]
fn accepts_max_payload() {
    let b = raw(524272, 3, 0, &vec![7; 524272]);
    assert_eq!(b.len(), CONTROL_BUFFER_SIZE);
    let m = decode_message(&b).unwrap();
    assert_eq!(m.payload.len(), MAX_PAYLOAD);
}

#[test]
fn rejects_unknown_and_none_type() {
    for t in [12u32, 13, 0x100, u32::MAX] {
        assert_eq!(decode_message(&raw(0, t, 1, &[])), Err(DecodeError::UnknownType(t)));
        assert_eq!(decode_header(&raw(0, t, 1, &[])), Err(DecodeError::UnknownType(t)));
    }
    assert_eq!(decode_message(&raw(0, 0, 1, &[])), Err(DecodeError::NoneType));
    // decode_header only parses; NONE is a representable type.
    assert_eq!(decode_header(&raw(0, 0, 1, &[])).unwrap().kind, CommandType::None);
}

#[test]
fn rejects_too_many_repeats() {
    for t in ALL_TYPES.iter().skip(1).filter(|t| **t != CommandType::QemuFile) {
        let b = raw(0, *t as u32, 4097, &[]);
        assert_eq!(decode_message(&b), Err(DecodeError::TooManyRepeats { kind: *t, repeat: 4097, max: 4096 }), "{t:?}");
    }
    // Not checked on QEMU_FILE: old QEMU sent garbage there.
    for r in [0, 1, 4097, 0xdead_beef, u32::MAX] {
        let b = msg(CommandType::QemuFile, r, b"QEVM");
        let m = decode_message(&b).unwrap();
        assert_eq!((m.kind, m.repeat, m.payload), (CommandType::QemuFile, r, &b"QEVM"[..]));
    }
    // 4096 entries of 24 bytes is fine.
    let b = msg(CommandType::RegisterRequest, 4096, &vec![0; 4096 * 24]);
    assert_eq!(decode_message(&b).unwrap().entries::<RegisterRequest>().count(), 4096);
}

#[test]
fn empty_types_reject_payload() {
    for t in [CommandType::Error, CommandType::Ready, CommandType::RegisterFinished, CommandType::UnregisterFinished] {
        for r in [0, 1, 7, 4096] {
            let b = msg(t, r, &[]);
            let m = decode_message(&b).unwrap();
            assert_eq!((m.kind, m.repeat, m.payload.len()), (t, r, 0));
        }
        assert_eq!(decode_message(&msg(t, 1, &[0; 24])), Err(DecodeError::UnexpectedPayload { kind: t, len: 24 }));
    }
}

#[test]
fn qemu_file_any_len() {
    assert_eq!(decode_message(&msg(CommandType::QemuFile, 0, &[])).unwrap().payload, &[] as &[u8]);
    let b = msg(CommandType::QemuFile, 1, &[9; 32768]);
    let m = decode_message(&b).unwrap();
    assert_eq!(m.payload.len(), 32768);
}

#[test]
fn ram_blocks_request_rules() {
    let t = CommandType::RamBlocksRequest;
    assert!(decode_message(&msg(t, 1, &[])).is_ok());
    assert!(decode_message(&msg(t, 0, &[])).is_ok());
    let mut names = vec![0u8; 512];
    names[7] = 1;
    names[8] = b'a';
    names[256 + 6] = 2;
    names[256 + 8] = b'b';
    let b = msg(t, 2, &names);
    let m = decode_message(&b).unwrap();
    let got: Vec<BlockSpec> = m.collect_entries().unwrap();
    assert_eq!(got, vec![BlockSpec::new("a", 1).unwrap(), BlockSpec::new("b", 0x200).unwrap()]);
    assert_eq!(
        decode_message(&msg(t, 1, &names)),
        Err(DecodeError::PayloadSizeMismatch { kind: t, len: 512, repeat: 1, entry_size: 256 })
    );
    assert_eq!(decode_message(&msg(t, 0, &names)), Err(DecodeError::ZeroRepeat { kind: t, len: 512 }));
    assert_eq!(
        decode_message(&msg(t, 1, &[0; 100])),
        Err(DecodeError::PayloadSizeMismatch { kind: t, len: 100, repeat: 1, entry_size: 256 })
    );
}

#[test]
fn ram_blocks_result_rules() {
    let t = CommandType::RamBlocksResult;
    // QEMU: repeat 1, n entries.
    let b = msg(t, 1, &[0; 96]);
    let m = decode_message(&b).unwrap();
    assert_eq!(m.collect_entries::<DestBlock>().unwrap().len(), 3);
    assert!(decode_message(&msg(t, 1, &[])).is_ok());
    // QEMU never sends repeat 0 (a hostile destination may).
    assert_eq!(decode_message(&msg(t, 0, &[0; 32])), Err(DecodeError::ZeroRepeat { kind: t, len: 32 }));
    assert_eq!(
        decode_message(&msg(t, 1, &[0; 33])),
        Err(DecodeError::PayloadNotMultiple { kind: t, len: 33, entry_size: 32 })
    );
}

#[test]
fn fixed_entry_rules() {
    for (t, size) in [
        (CommandType::RegisterRequest, 24usize),
        (CommandType::UnregisterRequest, 24),
        (CommandType::Compress, 24),
        (CommandType::RegisterResult, 16),
    ] {
        for r in [1u32, 2, 5] {
            assert!(decode_message(&msg(t, r, &vec![0; r as usize * size])).is_ok(), "{t:?} {r}");
        }
        assert_eq!(decode_message(&msg(t, 0, &[])), Err(DecodeError::ZeroRepeat { kind: t, len: 0 }));
        assert_eq!(
            decode_message(&msg(t, 0, &vec![0; size])),
            Err(DecodeError::ZeroRepeat { kind: t, len: size as u32 })
        );
        assert_eq!(
            decode_message(&msg(t, 2, &vec![0; size])),
            Err(DecodeError::PayloadSizeMismatch { kind: t, len: size as u32, repeat: 2, entry_size: size })
        );
        assert_eq!(
            decode_message(&msg(t, 1, &vec![0; size + 1])),
            Err(DecodeError::PayloadSizeMismatch { kind: t, len: size as u32 + 1, repeat: 1, entry_size: size })
        );
        assert_eq!(
            decode_message(&msg(t, 1, &[])),
            Err(DecodeError::PayloadSizeMismatch { kind: t, len: 0, repeat: 1, entry_size: size })
        );
    }
}

#[test]
fn compress_nonzero_value_rejected() {
    let mut p = [0u8; 24];
    p[3] = 0xff;
    let b = msg(CommandType::Compress, 1, &p);
    let m = decode_message(&b).unwrap();
    let e = m.entries::<Compress>().next().unwrap();
    assert_eq!(e, Err(DecodeError::CompressNonZeroValue { value: 255 }));
    assert_eq!(Compress::decode(&p), Err(DecodeError::CompressNonZeroValue { value: 255 }));
}

#[test]
fn entries_trailing_bytes() {
    // A 48-byte payload read as 32-byte entries: one entry then the remainder.
    let b = msg(CommandType::RegisterRequest, 2, &[0; 48]);
    let m = decode_message(&b).unwrap();
    let it = m.entries::<DestBlock>();
    assert_eq!(it.len(), 2);
    let v: Vec<_> = it.collect();
    assert_eq!(v.len(), 2);
    assert!(v[0].is_ok());
    assert_eq!(v[1], Err(DecodeError::TrailingBytes { entry_size: 32, remaining: 16 }));
    assert_eq!(m.collect_entries::<DestBlock>(), Err(DecodeError::TrailingBytes { entry_size: 32, remaining: 16 }));
}

#[test]
fn entry_decoders_reject_short_input() {
    assert!(matches!(RegisterRequest::decode(&[0; 23]), Err(DecodeError::TooShort { needed: 24, got: 23, .. })));
    assert!(matches!(RegisterResult::decode(&[0; 15]), Err(DecodeError::TooShort { needed: 16, got: 15, .. })));
    assert!(matches!(DestBlock::decode(&[0; 31]), Err(DecodeError::TooShort { needed: 32, got: 31, .. })));
    assert!(matches!(Compress::decode(&[]), Err(DecodeError::TooShort { needed: 24, got: 0, .. })));
    assert!(matches!(BlockSpec::decode(&[0; 255]), Err(DecodeError::TooShort { needed: 256, got: 255, .. })));
    assert!(matches!(Capabilities::decode(&[0; 7]), Err(DecodeError::TooShort { needed: 8, got: 7, .. })));
}

#[test]
fn block_spec_decode_errors() {
    let mut b = [0u8; 256];
    b[..8].copy_from_slice(&[0xff; 8]); // the length does not count
    assert_eq!(BlockSpec::decode(&b), Err(DecodeError::EmptyBlockName));
    b[9] = b'x'; // bytes after the first NUL do not count
    assert_eq!(BlockSpec::decode(&b), Err(DecodeError::EmptyBlockName));
    let mut full = [b'a'; 256];
    full[..8].fill(0); // a NUL in the length is no terminator
    assert_eq!(BlockSpec::decode(&full), Err(DecodeError::UnterminatedBlockName));
    let mut bad = [0u8; 256];
    bad[8..11].copy_from_slice(&[b'o', b'k', 0xff]);
    assert_eq!(BlockSpec::decode(&bad), Err(DecodeError::BlockNameNotUtf8 { valid_up_to: 2 }));
    // 247 bytes + NUL is the longest name.
    let mut max = [b'z'; 256];
    max[255] = 0;
    let spec = BlockSpec::decode(&max).unwrap();
    assert_eq!(spec.name.len(), 247);
    assert_eq!(spec.length, 0x7a7a_7a7a_7a7a_7a7a);
    // Longer input is fine; only the first 256 bytes count.
    let mut longer = [0u8; 300];
    longer[8] = b'a';
    longer[256..].fill(b'b');
    assert_eq!(BlockSpec::decode(&longer), Ok(BlockSpec::new("a", 0).unwrap()));
}

#[test]
fn block_spec_new_errors() {
    assert_eq!(BlockSpec::new("", 1), Err(EncodeError::EmptyBlockName));
    assert_eq!(BlockSpec::new(&"a".repeat(248), 1), Err(EncodeError::BlockNameTooLong { len: 248, max: 247 }));
    assert_eq!(BlockSpec::new(&"a".repeat(1000), 1), Err(EncodeError::BlockNameTooLong { len: 1000, max: 247 }));
    assert_eq!(BlockSpec::new("a\0b", 1), Err(EncodeError::BlockNameContainsNul { at: 1 }));
    assert!(BlockSpec::new(&"a".repeat(247), u64::MAX).is_ok());
    assert_eq!(BlockSpec::new("pc.ram", 42), Ok(BlockSpec { length: 42, name: "pc.ram".into() }));
}

#[test]
fn block_spec_invalid_encode_does_not_panic() {
    // Built directly through the public fields: encode truncates at a char boundary.
    let long = BlockSpec { length: 7, name: "é".repeat(200) }; // 400 bytes
    let mut out = [0xaau8; 256];
    long.encode(&mut out);
    assert_eq!(out[..8], 7u64.to_be_bytes());
    assert_eq!(out[8 + 246..], [0, 0]); // 123 × 2 bytes = 246, then NUL padding
    assert_eq!(BlockSpec::decode(&out).unwrap().name, "é".repeat(123));
    // Cut at the first NUL; all after it is padding.
    BlockSpec { length: 0, name: "a\0b".into() }.encode(&mut out);
    let mut want = [0u8; 256];
    want[8] = b'a';
    assert_eq!(out, want);
    BlockSpec { length: 0, name: String::new() }.encode(&mut out);
    assert_eq!(out, [0; 256]);
    // And the writer refuses them.
    let mut buf = [0u8; 1024];
    let mut w = MessageWriter::new(&mut buf, CommandType::RamBlocksRequest);
    assert_eq!(w.push(&long), Err(EncodeError::BlockNameTooLong { len: 400, max: 247 }));
    assert_eq!(w.push(&BlockSpec { length: 1, name: "a\0".into() }), Err(EncodeError::BlockNameContainsNul { at: 1 }));
    assert_eq!(w.push(&BlockSpec { length: 1, name: String::new() }), Err(EncodeError::EmptyBlockName));
    assert_eq!(w.entry_count(), 0);
    assert_eq!(w.finish(), 16);
}

// ---- MessageWriter ----

#[test]
fn writer_default_repeat() {
    let mut buf = vec![0xeeu8; CONTROL_BUFFER_SIZE];
    for t in [CommandType::Ready, CommandType::Error, CommandType::RegisterFinished, CommandType::RamBlocksRequest] {
        let n = MessageWriter::new(&mut buf, t).finish();
        assert_eq!(n, 16);
        assert_eq!(decode_header(&buf).unwrap(), ControlHeader { len: 0, kind: t, repeat: 1 });
        assert_eq!(buf[12..16], [0; 4]);
    }
    let mut w = MessageWriter::new(&mut buf, CommandType::QemuFile);
    w.push_bytes(b"hello").unwrap();
    assert_eq!(w.finish(), 21);
    assert_eq!(decode_header(&buf).unwrap().repeat, 0);

    let mut w = MessageWriter::new(&mut buf, CommandType::RegisterRequest);
    for i in 0..3 {
        w.push(&RegisterRequest { key: i, block_index: 0, chunks: 0 }).unwrap();
    }
    assert_eq!(w.finish(), 16 + 72);
    assert_eq!(decode_header(&buf).unwrap().repeat, 3);

    let mut w = MessageWriter::new(&mut buf, CommandType::RamBlocksResult);
    for _ in 0..3 {
        w.push(&DestBlock::default()).unwrap();
    }
    assert_eq!(w.finish(), 16 + 96);
    assert_eq!(decode_header(&buf).unwrap(), ControlHeader { len: 96, kind: CommandType::RamBlocksResult, repeat: 1 });

    let n = MessageWriter::new(&mut buf, CommandType::UnregisterFinished).with_repeat(9).finish();
    assert_eq!(decode_message(&buf[..n]).unwrap().repeat, 9);
    let mut w = MessageWriter::new(&mut buf, CommandType::UnregisterFinished);
    w.set_repeat(4);
    let n = w.finish();
    assert_eq!(decode_message(&buf[..n]).unwrap().repeat, 4);
}

#[test]
fn writer_limits() {
    assert_eq!(
        MessageWriter::try_new(&mut [0u8; 15], CommandType::Ready).err(),
        Some(EncodeError::BufferTooSmall { needed: 16, available: 15 })
    );
    // Exactly a header.
    let mut small = [0u8; 16];
    let mut w = MessageWriter::new(&mut small, CommandType::Ready);
    assert_eq!(w.remaining(), 0);
    assert_eq!(w.push_bytes(&[1]), Err(EncodeError::PayloadFull { needed: 1, available: 0 }));
    assert_eq!(w.finish(), 16);

    // Buffer full: 40 bytes of payload room holds one 24-byte entry.
    let mut buf = [0u8; 56];
    let mut w = MessageWriter::new(&mut buf, CommandType::RegisterRequest);
    w.push(&RegisterRequest::default()).unwrap();
    assert_eq!(w.push(&RegisterRequest::default()), Err(EncodeError::PayloadFull { needed: 24, available: 16 }));
    assert_eq!(w.entry_count(), 1);
    assert_eq!(w.payload_len(), 24);
    assert_eq!(w.finish(), 40);

    // Payload capped at MAX_PAYLOAD even with a bigger buffer.
    let mut big = vec![0u8; CONTROL_BUFFER_SIZE + 100];
    let mut w = MessageWriter::new(&mut big, CommandType::QemuFile);
    assert_eq!(w.remaining(), MAX_PAYLOAD);
    w.push_bytes(&vec![1; MAX_PAYLOAD]).unwrap();
    assert_eq!(w.push_bytes(&[1]), Err(EncodeError::PayloadFull { needed: 1, available: 0 }));
    assert_eq!(w.finish(), CONTROL_BUFFER_SIZE);

    // 4096 entries, not 4097.
    let mut buf = vec![0u8; CONTROL_BUFFER_SIZE];
    let mut w = MessageWriter::new(&mut buf, CommandType::RegisterResult);
    for _ in 0..4096 {
        w.push(&RegisterResult::default()).unwrap();
    }
    assert_eq!(w.push(&RegisterResult::default()), Err(EncodeError::TooManyEntries { max: 4096 }));
    let n = w.finish();
    let m = decode_message(&buf[..n]).unwrap();
    assert_eq!(m.repeat, 4096);

    // RAM_BLOCKS_RESULT repeat is 1, so more than 4096 blocks fit.
    let mut w = MessageWriter::new(&mut buf, CommandType::RamBlocksResult);
    while w.push(&DestBlock::default()).is_ok() {}
    assert_eq!(w.entry_count() as usize, MAX_PAYLOAD / 32);
    let n = w.finish();
    assert_eq!(decode_message(&buf[..n]).unwrap().entries::<DestBlock>().count(), 16383);

    // COMPRESS value must be 0.
    let mut w = MessageWriter::new(&mut buf, CommandType::Compress);
    let c = Compress { value: 1, ..Default::default() };
    assert_eq!(w.push(&c), Err(EncodeError::CompressNonZeroValue { value: 1 }));
}

#[test]
fn error_messages_name_the_numbers() {
    let s = DecodeError::LengthMismatch { len: 8, received: 20 }.to_string();
    assert!(s.contains('8') && s.contains("20"), "{s}");
    let s = DecodeError::TooManyRepeats { kind: CommandType::Compress, repeat: 5000, max: 4096 }.to_string();
    assert!(s.contains("5000") && s.contains("4096") && s.contains("Compress"), "{s}");
    let s = EncodeError::PayloadFull { needed: 24, available: 16 }.to_string();
    assert!(s.contains("24") && s.contains("16"), "{s}");
    let _: &dyn std::error::Error = &DecodeError::NoneType;
    let _: &dyn std::error::Error = &EncodeError::EmptyBlockName;
}

// ---- property tests ----

fn arb_type() -> impl Strategy<Value = CommandType> {
    (0u32..12).prop_map(|v| CommandType::try_from(v).unwrap())
}

fn arb_block_spec() -> impl Strategy<Value = BlockSpec> {
    (
        prop_oneof![
            "[a-zA-Z0-9./@_-]{1,247}",
            // Any non-control characters; 61 chars × ≤ 4 bytes ≤ 244 bytes.
            "\\PC{1,61}",
        ],
        any::<u64>(),
    )
        .prop_map(|(s, length)| BlockSpec::new(&s, length).unwrap())
}

fn arb_register_request() -> impl Strategy<Value = RegisterRequest> {
    (any::<u64>(), any::<u32>(), any::<u64>()).prop_map(|(key, block_index, chunks)| RegisterRequest {
        key,
        block_index,
        chunks,
    })
}

fn arb_register_result() -> impl Strategy<Value = RegisterResult> {
    (any::<u32>(), any::<u64>()).prop_map(|(rkey, host_addr)| RegisterResult { rkey, host_addr })
}

fn arb_dest_block() -> impl Strategy<Value = DestBlock> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(a, o, l, k)| DestBlock {
        remote_host_addr: a,
        offset: o,
        length: l,
        remote_rkey: k,
    })
}

fn arb_compress() -> impl Strategy<Value = Compress> {
    (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(block_index, offset, length)| Compress {
        value: 0,
        block_index,
        offset,
        length,
    })
}

/// Encodes into a garbage-filled buffer, checks the size and zeroed padding, decodes.
/// `padding` is the entry's padding range (empty if it has none).
fn entry_round_trip<E: Entry + PartialEq + std::fmt::Debug>(e: &E, padding: std::ops::Range<usize>) {
    let mut out = vec![0xa5u8; E::SIZE + 3];
    e.encode(&mut out);
    assert_eq!(out[E::SIZE..], [0xa5; 3], "wrote past SIZE");
    assert!(out[padding.clone()].iter().all(|&b| b == 0), "padding {padding:?} not zero");
    assert_eq!(&E::decode(&out[..E::SIZE]).unwrap(), e);
    // Garbage in the padding is ignored.
    out[padding].fill(0x5a);
    assert_eq!(&E::decode(&out).unwrap(), e);
}

/// Writes entries with the writer, decodes the message and the entries.
fn message_round_trip<E: Entry + PartialEq + std::fmt::Debug>(kind: CommandType, es: &[E]) {
    let mut buf = vec![0xccu8; CONTROL_BUFFER_SIZE];
    let mut w = MessageWriter::new(&mut buf, kind);
    for e in es {
        w.push(e).unwrap();
    }
    let n = w.finish();
    assert_eq!(n, 16 + es.len() * E::SIZE);
    let m = decode_message(&buf[..n]).unwrap();
    assert_eq!(m.kind, kind);
    let expected_repeat = if kind == CommandType::RamBlocksResult || es.is_empty() { 1 } else { es.len() as u32 };
    assert_eq!(m.repeat, expected_repeat);
    assert_eq!(&m.collect_entries::<E>().unwrap(), es);
}

proptest! {
    #[test]
    fn prop_capabilities_round_trip(version in any::<u32>(), flags in any::<u32>(), tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        let c = Capabilities { version, flags };
        let mut b = c.encode().to_vec();
        prop_assert_eq!(Capabilities::decode(&b).unwrap(), c);
        b.extend_from_slice(&tail);
        prop_assert_eq!(Capabilities::decode(&b).unwrap(), c);
    }

    #[test]
    fn prop_header_round_trip(len in any::<u32>(), kind in arb_type(), repeat in any::<u32>(), pad in any::<[u8; 4]>()) {
        let h = ControlHeader { len, kind, repeat };
        let mut out = [0xffu8; 16];
        encode_header(&h, &mut out);
        prop_assert_eq!(&out[12..16], &[0u8; 4][..]);
        prop_assert_eq!(decode_header(&out).unwrap(), h);
        out[12..16].copy_from_slice(&pad);
        prop_assert_eq!(decode_header(&out).unwrap(), h);
    }

    #[test]
    fn prop_entries_round_trip(
        rr in arb_register_request(),
        rs in arb_register_result(),
        db in arb_dest_block(),
        c in arb_compress(),
        n in arb_block_spec(),
    ) {
        entry_round_trip(&rr, 12..16);
        entry_round_trip(&rs, 4..8);
        entry_round_trip(&db, 28..32);
        entry_round_trip(&c, 0..0);
        // The NUL terminator is not padding; everything after it is.
        entry_round_trip(&n, 8 + n.name.len() + 1..256);
        let mut out = [0xffu8; 256];
        n.encode(&mut out);
        prop_assert_eq!(&out[..8], &n.length.to_be_bytes()[..]);
        prop_assert_eq!(&out[8..8 + n.name.len()], n.name.as_bytes());
        prop_assert!(out[8 + n.name.len()..].iter().all(|&b| b == 0));
    }

    #[test]
    fn prop_messages_round_trip(
        rr in proptest::collection::vec(arb_register_request(), 1..64),
        rs in proptest::collection::vec(arb_register_result(), 1..64),
        db in proptest::collection::vec(arb_dest_block(), 0..64),
        c in proptest::collection::vec(arb_compress(), 1..64),
        specs in proptest::collection::vec(arb_block_spec(), 0..16),
        data in proptest::collection::vec(any::<u8>(), 0..4096),
    ) {
        message_round_trip(CommandType::RegisterRequest, &rr);
        message_round_trip(CommandType::UnregisterRequest, &rr);
        message_round_trip(CommandType::RegisterResult, &rs);
        message_round_trip(CommandType::RamBlocksResult, &db);
        message_round_trip(CommandType::Compress, &c);
        message_round_trip(CommandType::RamBlocksRequest, &specs);

        let mut buf = vec![0u8; 16 + data.len()];
        let mut w = MessageWriter::new(&mut buf, CommandType::QemuFile);
        w.push_bytes(&data).unwrap();
        let n = w.finish();
        let m = decode_message(&buf[..n]).unwrap();
        prop_assert_eq!((m.kind, m.repeat, m.payload), (CommandType::QemuFile, 0, &data[..]));
    }

    #[test]
    fn prop_decode_arbitrary_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..1100)) {
        check_any(&b);
    }

    /// Mostly-valid headers over random payloads, to reach the per-type rules.
    #[test]
    fn prop_decode_structured_never_panics(
        kind in 0u32..14,
        repeat in prop_oneof![Just(0u32), Just(1), Just(2), Just(4096), Just(4097), any::<u32>()],
        payload in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..600),
            (1usize..5, 0usize..5).prop_map(|(n, k)| vec![k as u8; n * [16, 24, 32, 256, 8][k]]),
        ],
        len_delta in prop_oneof![4 => Just(0i64), 1 => -2i64..3],
    ) {
        let len = (payload.len() as i64 + len_delta).max(0) as u32;
        let b = raw(len, kind, repeat, &payload);
        check_any(&b);
        let r = decode_message(&b);
        // A header length that is not the payload's (a negative delta on an
        // empty payload clamps to 0, which is).
        if len as usize != payload.len() {
            prop_assert!(r.is_err());
        }
    }
}

/// Every decoder on `b` must return, and accepted messages must meet the documented rules.
fn check_any(b: &[u8]) {
    let _ = Capabilities::decode(b);
    let _ = RegisterRequest::decode(b);
    let _ = RegisterResult::decode(b);
    let _ = DestBlock::decode(b);
    let _ = Compress::decode(b);
    let _ = BlockSpec::decode(b);
    if let Ok(h) = decode_header(b) {
        // Re-encoding reproduces the first 12 bytes; padding becomes zero.
        let mut out = [0u8; 16];
        encode_header(&h, &mut out);
        assert_eq!(out[..12], b[..12]);
    }
    if let Ok(m) = decode_message(b) {
        assert_eq!(m.payload.len() + 16, b.len());
        assert!(m.payload.len() <= MAX_PAYLOAD);
        assert_ne!(m.kind, CommandType::None);
        if m.kind != CommandType::QemuFile {
            assert!(m.repeat <= MAX_REPEAT);
        }
        let n_rr = m.entries::<RegisterRequest>().count();
        let n_rs = m.entries::<RegisterResult>().count();
        let n_db = m.entries::<DestBlock>().count();
        let _ = m.entries::<Compress>().count();
        let n_bs = m.entries::<BlockSpec>().count();
        match m.kind {
            CommandType::RegisterRequest | CommandType::UnregisterRequest | CommandType::Compress => {
                assert_eq!(n_rr, m.repeat as usize)
            }
            CommandType::RegisterResult => assert_eq!(n_rs, m.repeat as usize),
            CommandType::RamBlocksResult => assert_eq!(n_db * 32, m.payload.len()),
            CommandType::RamBlocksRequest if !m.payload.is_empty() => {
                assert_eq!(n_bs, m.repeat as usize)
            }
            _ => {}
        }
    }
}

#[test]
fn accept_data_carries_the_pin_budget() {
    let a = AcceptData { caps: Capabilities::v1(CAP_RDMAMIG_EXT), pin_budget: Some(64 << 20), auth: None };
    let bytes = a.encode();
    assert_eq!(&bytes[..8], &[0, 0, 0, 1, 0x80, 0, 0, 0]);
    assert_eq!(&bytes[8..], &(64u64 << 20).to_be_bytes());
    assert_eq!(AcceptData::decode(&bytes), Ok(a));
    // rdma_cm pads private data with zeros: an older destination announces nothing.
    let mut padded = [0u8; 196];
    padded[..8].copy_from_slice(&a.caps.encode());
    let nothing = AcceptData { caps: a.caps, pin_budget: None, auth: None };
    assert_eq!(AcceptData::decode(&padded), Ok(nothing));
    // QEMU's 8 bytes alone.
    assert_eq!(AcceptData::decode(&bytes[..8]), Ok(nothing));
    assert!(AcceptData::decode(&bytes[..7]).is_err());
}

#[test]
fn reject_data_carries_a_cause() {
    let r = RejectData { caps: Capabilities::v1(CAP_RDMAMIG_EXT), cause: REJECT_PIN_REFUSED };
    let bytes = r.encode();
    assert_eq!(bytes, [0, 0, 0, 1, 0x80, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(RejectData::decode(&bytes), Ok(r));
    // rdma_cm pads a reject's private data (148 bytes on IB): a reject without a cause says none.
    let mut padded = [0u8; 148];
    padded[..8].copy_from_slice(&r.caps.encode());
    assert_eq!(RejectData::decode(&padded), Ok(RejectData { cause: 0, ..r }));
    assert_eq!(RejectData::decode(&bytes[..8]), Ok(RejectData { cause: 0, ..r }));
    assert!(RejectData::decode(&bytes[..7]).is_err());
}

#[test]
fn authentication_nonces_and_proofs_follow_the_capabilities() {
    let caps = Capabilities::v1(CAP_RDMAMIG_EXT | CAP_RDMAMIG_AUTH);
    let c = ConnectData { caps, nonce: Some([0x11; AUTH_NONCE_LEN]), recovery_tag: None };
    let bytes = c.encode();
    assert_eq!(bytes.len(), 40);
    assert_eq!(&bytes[..8], &[0, 0, 0, 1, 0xC0, 0, 0, 0]);
    let mut padded = bytes.clone();
    padded.resize(56, 0);
    assert_eq!(ConnectData::decode(&padded), Ok(c));
    assert!(ConnectData::decode(&bytes[..39]).is_err(), "the flag promises a nonce");
    let plain = Capabilities::v1(CAP_RDMAMIG_EXT);
    assert_eq!(ConnectData::decode(&plain.encode()), Ok(ConnectData { caps: plain, nonce: None, recovery_tag: None }));

    // A recovery connection's request: a nonce and the tag, 56 bytes in all
    // (rdma_cm's most), with or without authentication.
    for flags in [CAP_RDMAMIG_EXT | CAP_RDMAMIG_AUTH | CAP_RDMAMIG_RESUME, CAP_RDMAMIG_EXT | CAP_RDMAMIG_RESUME] {
        let resume = Capabilities::v1(flags);
        let r = ConnectData {
            caps: resume,
            nonce: Some([0x11; AUTH_NONCE_LEN]),
            recovery_tag: Some([0x44; RECOVERY_TAG_LEN]),
        };
        let bytes = r.encode();
        assert_eq!(bytes.len(), 56);
        assert_eq!(&bytes[40..], &[0x44; 16]);
        assert_eq!(ConnectData::decode(&bytes), Ok(r));
        assert!(ConnectData::decode(&bytes[..55]).is_err(), "the flag promises a tag");
        assert!(ConnectData::decode(&bytes[..39]).is_err(), "the flag promises a nonce");
    }

    let challenge = AuthChallenge { nonce: [0x22; AUTH_NONCE_LEN], proof: [0x33; AUTH_PROOF_LEN] };
    let a = AcceptData { caps, pin_budget: None, auth: Some(challenge) };
    let bytes = a.encode();
    assert_eq!(bytes.len(), 80);
    assert_eq!(&bytes[16..48], &[0x22; 32]);
    assert_eq!(&bytes[48..], &[0x33; 32]);
    assert_eq!(AcceptData::decode(&bytes), Ok(a));
    assert!(AcceptData::decode(&bytes[..79]).is_err(), "the flag promises a challenge");

    let proof = AuthProof { tag: [0x44; AUTH_PROOF_LEN] };
    let mut buf = [0u8; 64];
    let mut w = MessageWriter::new(&mut buf, CommandType::Auth);
    w.push(&proof).unwrap();
    let n = w.finish();
    let m = decode_message(&buf[..n]).unwrap();
    assert_eq!((m.kind, m.repeat), (CommandType::Auth, 1));
    assert_eq!(m.collect_entries::<AuthProof>().unwrap(), [proof]);
    assert!(decode_message(&msg(CommandType::Auth, 2, &[0x44; 64])).is_err(), "one proof only");
    assert!(decode_message(&msg(CommandType::Auth, 1, &[0x44; 31])).is_err());
    assert_eq!(CommandType::try_from(0x8000_0003), Ok(CommandType::Auth));
}
