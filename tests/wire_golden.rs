//! Golden wire bytes, written by hand from the protocol fact sheet's tables
//! (qemu-rdma-protocol.md §1.4, §2.1, §2.2, §3), not produced by the encoder.
//! Each layout is checked in both directions; decoding also sees garbage in
//! every padding field, as QEMU may leave it.

use rdmamig::wire::*;

/// Encodes `e` into a garbage-filled SIZE buffer and returns it.
fn enc<E: Entry>(e: &E) -> Vec<u8> {
    let mut out = vec![0xa5u8; E::SIZE];
    e.encode(&mut out);
    out
}

// ---- §1.4 private data ----

const CAPS_PIN_ALL: [u8; 8] = [0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01];
const CAPS_EXT: [u8; 8] = [0x00, 0x00, 0x00, 0x01, 0x80, 0x00, 0x00, 0x01];

#[test]
fn capabilities_golden() {
    let c = Capabilities { version: 1, flags: CAP_PIN_ALL };
    assert_eq!(c.encode(), CAPS_PIN_ALL);
    assert_eq!(Capabilities::decode(&CAPS_PIN_ALL), Ok(c));

    let e = Capabilities { version: 1, flags: CAP_PIN_ALL | CAP_RDMAMIG_EXT };
    assert_eq!(e.encode(), CAPS_EXT);
    assert_eq!(Capabilities::decode(&CAPS_EXT), Ok(e));

    // Byte order: version 0x01020304, flags 0x0a0b0c0d (unknown bits preserved).
    let odd = [0x01, 0x02, 0x03, 0x04, 0x0a, 0x0b, 0x0c, 0x0d];
    assert_eq!(Capabilities::decode(&odd), Ok(Capabilities { version: 0x0102_0304, flags: 0x0a0b_0c0d }));
    assert_eq!(Capabilities { version: 0x0102_0304, flags: 0x0a0b_0c0d }.encode(), odd);
}

#[test]
fn capabilities_56_byte_connect_request() {
    // What a real QEMU connect request carries: the whole RDMA_PS_TCP user area.
    let pd: [u8; 56] = [
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, // version 1, PIN_ALL
        0xde, 0xad, 0xbe, 0xef, 0x11, 0x22, 0x33, 0x44, // rest: not ours, ignored
        0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, //
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, //
        0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, //
    ];
    let c = Capabilities::decode(&pd).unwrap();
    assert_eq!(c, Capabilities { version: 1, flags: 1 });
    assert!(c.pin_all());
    assert_eq!(Capabilities::decode(&pd[..8]), Ok(c));
    assert!(Capabilities::decode(&pd[..7]).is_err());
}

// ---- §2.1 header ----

#[test]
fn header_golden() {
    // len 0x00010203, type 7 (REGISTER_REQUEST), repeat 0x04050607, padding 0.
    let golden: [u8; 16] =
        [0x00, 0x01, 0x02, 0x03, 0x00, 0x00, 0x00, 0x07, 0x04, 0x05, 0x06, 0x07, 0x00, 0x00, 0x00, 0x00];
    let h = ControlHeader { len: 0x0001_0203, kind: CommandType::RegisterRequest, repeat: 0x0405_0607 };
    let mut out = [0xffu8; 16];
    encode_header(&h, &mut out);
    assert_eq!(out, golden);
    assert_eq!(decode_header(&golden), Ok(h));

    // Padding garbage is ignored.
    let mut garbage = golden;
    garbage[12..].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(decode_header(&garbage), Ok(h));

    // Every command number (§2.2, 0-based).
    let names = [
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
    for (v, t) in names.iter().enumerate() {
        let b = [0, 0, 0, 0, 0, 0, 0, v as u8, 0, 0, 0, 1, 0, 0, 0, 0];
        assert_eq!(decode_header(&b).unwrap().kind, *t);
    }
}

// ---- §3 entries ----

#[test]
fn register_request_golden() {
    let golden: [u8; 24] = [
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // key (current_addr / chunk)
        0x11, 0x12, 0x13, 0x14, // current_index
        0x00, 0x00, 0x00, 0x00, // padding
        0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, // chunks
    ];
    let e = RegisterRequest { key: 0x0102_0304_0506_0708, block_index: 0x1112_1314, chunks: 0x2122_2324_2526_2728 };
    assert_eq!(enc(&e), golden);
    assert_eq!(RegisterRequest::decode(&golden), Ok(e));
    let mut garbage = golden;
    garbage[12..16].copy_from_slice(&[0x7f, 0x00, 0x13, 0x37]);
    assert_eq!(RegisterRequest::decode(&garbage), Ok(e));

    // A typical QEMU request: chunk start 0x200000 in block 0, no extra chunks.
    let typical: [u8; 24] = [
        0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0xca, 0xfe, 0xba, 0xbe, // index 0, garbage padding
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    assert_eq!(RegisterRequest::decode(&typical), Ok(RegisterRequest { key: 0x20_0000, block_index: 0, chunks: 0 }));
}

#[test]
fn register_result_golden() {
    let golden: [u8; 16] = [
        0x0a, 0x0b, 0x0c, 0x0d, // rkey
        0x00, 0x00, 0x00, 0x00, // padding
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x00, 0x00, // host_addr
    ];
    let e = RegisterResult { rkey: 0x0a0b_0c0d, host_addr: 0x0000_7f12_3456_0000 };
    assert_eq!(enc(&e), golden);
    assert_eq!(RegisterResult::decode(&golden), Ok(e));
    let mut garbage = golden;
    garbage[4..8].copy_from_slice(&[0xff; 4]);
    assert_eq!(RegisterResult::decode(&garbage), Ok(e));
}

#[test]
fn dest_block_golden() {
    let golden: [u8; 32] = [
        0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x00, // remote_host_addr
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // offset
        0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, // length (128 MiB)
        0x12, 0x34, 0x56, 0x78, // remote_rkey
        0x00, 0x00, 0x00, 0x00, // padding
    ];
    let e = DestBlock {
        remote_host_addr: 0x0000_7f00_0000_0000,
        offset: 0x0000_0001_0000_0000,
        length: 0x0800_0000,
        remote_rkey: 0x1234_5678,
    };
    assert_eq!(enc(&e), golden);
    assert_eq!(DestBlock::decode(&golden), Ok(e));
    let mut garbage = golden;
    garbage[28..].copy_from_slice(&[0x01, 0x02, 0x03, 0x04]);
    assert_eq!(DestBlock::decode(&garbage), Ok(e));
}

#[test]
fn compress_golden() {
    let golden: [u8; 24] = [
        0x00, 0x00, 0x00, 0x00, // value (must be 0)
        0x00, 0x00, 0x00, 0x02, // block_idx
        0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, // offset
        0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, // length (64 KiB)
    ];
    let e = Compress { value: 0, block_index: 2, offset: 0x20_0000, length: 0x1_0000 };
    assert_eq!(enc(&e), golden);
    assert_eq!(Compress::decode(&golden), Ok(e));
    let mut nonzero = golden;
    nonzero[0..4].copy_from_slice(&[0x00, 0x00, 0x01, 0x00]);
    assert_eq!(Compress::decode(&nonzero), Err(DecodeError::CompressNonZeroValue { value: 256 }));
}

#[test]
fn block_spec_golden() {
    // rdmamig extension: length (big-endian u64), then the name, NUL-padded to 256 bytes.
    let mut golden = [0u8; 256];
    golden[..14].copy_from_slice(&[
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // length 4 GiB
        0x70, 0x63, 0x2e, 0x72, 0x61, 0x6d, // "pc.ram"
    ]);
    let e = BlockSpec::new("pc.ram", 0x1_0000_0000).unwrap();
    assert_eq!(enc(&e), golden);
    assert_eq!(BlockSpec::decode(&golden), Ok(e.clone()));
    // Bytes after the terminator are ignored.
    let mut garbage = golden;
    garbage[15..].fill(0xee);
    assert_eq!(BlockSpec::decode(&garbage), Ok(e));

    // Byte order: length 0x0102030405060708; the longest name, 247 bytes, ends at byte 254.
    let mut max = [0u8; 256];
    max[..8].copy_from_slice(&[0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08]);
    max[8..255].fill(0x78); // 'x' × 247, then the terminator at byte 255
    let e = BlockSpec::new(&"x".repeat(247), 0x0102_0304_0506_0708).unwrap();
    assert_eq!(enc(&e), max);
    assert_eq!(BlockSpec::decode(&max), Ok(e));
    // Without the terminator the entry is rejected.
    max[255] = 0x78;
    assert_eq!(BlockSpec::decode(&max), Err(DecodeError::UnterminatedBlockName));
}

// ---- whole messages ----

fn write<E: Entry>(kind: CommandType, es: &[E]) -> Vec<u8> {
    let mut buf = vec![0xa5u8; CONTROL_BUFFER_SIZE];
    let mut w = MessageWriter::new(&mut buf, kind);
    for e in es {
        w.push(e).unwrap();
    }
    let n = w.finish();
    buf.truncate(n);
    buf
}

#[test]
fn ready_and_friends_golden() {
    // READY as QEMU sends it: {len 0, type 2, repeat 1}.
    let ready = [0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0];
    assert_eq!(write::<RegisterRequest>(CommandType::Ready, &[]), ready);
    let m = decode_message(&ready).unwrap();
    assert_eq!((m.kind, m.repeat, m.payload.len()), (CommandType::Ready, 1, 0));

    let error = [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
    assert_eq!(write::<RegisterRequest>(CommandType::Error, &[]), error);
    let finished = [0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 0];
    assert_eq!(write::<RegisterRequest>(CommandType::RegisterFinished, &[]), finished);
    let blocks_req = [0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0];
    assert_eq!(write::<BlockSpec>(CommandType::RamBlocksRequest, &[]), blocks_req);

    // UNREGISTER_FINISHED echoes the request's repeat.
    let unreg_fin = [0, 0, 0, 0, 0, 0, 0, 11, 0, 0, 0, 3, 0, 0, 0, 0];
    let mut buf = [0u8; 64];
    let n = MessageWriter::new(&mut buf, CommandType::UnregisterFinished).with_repeat(3).finish();
    assert_eq!(buf[..n], unreg_fin);
    assert_eq!(decode_message(&unreg_fin).unwrap().repeat, 3);

    // Header padding garbage on a received message is ignored.
    let garbage = [0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef];
    assert_eq!(decode_message(&garbage).unwrap().kind, CommandType::Ready);
}

#[test]
fn qemu_file_golden() {
    // "QEVM" stream magic in one QEMU_FILE message, repeat 0 (current QEMU).
    let golden = [0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, b'Q', b'E', b'V', b'M'];
    let mut buf = [0u8; 64];
    let mut w = MessageWriter::new(&mut buf, CommandType::QemuFile);
    w.push_bytes(b"QEVM").unwrap();
    let n = w.finish();
    assert_eq!(buf[..n], golden);
    let m = decode_message(&golden).unwrap();
    assert_eq!((m.kind, m.repeat, m.payload), (CommandType::QemuFile, 0, &b"QEVM"[..]));

    // QEMU 7.2 sends repeat 1; older QEMU sent garbage. Both are accepted.
    let qemu72 = [0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0x80];
    assert_eq!(decode_message(&qemu72).unwrap().payload, &[0x80]);
    let old = [0, 0, 0, 1, 0, 0, 0, 3, 0x7f, 0xfe, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0x80];
    assert_eq!(decode_message(&old).unwrap().repeat, 0x7ffe_1234);
}

#[test]
fn register_request_message_golden() {
    let golden: [u8; 40] = [
        0x00, 0x00, 0x00, 0x18, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // header
        0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x00, 0x00, // key 0x300000
        0x00, 0x00, 0x00, 0x01, // block 1
        0x00, 0x00, 0x00, 0x00, // padding
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // chunks 0
    ];
    let e = RegisterRequest { key: 0x30_0000, block_index: 1, chunks: 0 };
    assert_eq!(write(CommandType::RegisterRequest, &[e]), golden);
    let m = decode_message(&golden).unwrap();
    assert_eq!((m.kind, m.repeat), (CommandType::RegisterRequest, 1));
    assert_eq!(m.collect_entries::<RegisterRequest>(), Ok(vec![e]));

    // The same bytes as UNREGISTER_REQUEST (type 10).
    let mut unreg = golden;
    unreg[7] = 10;
    assert_eq!(write(CommandType::UnregisterRequest, &[e]), unreg);
    assert_eq!(decode_message(&unreg).unwrap().collect_entries::<RegisterRequest>(), Ok(vec![e]));
}

#[test]
fn register_result_message_golden() {
    let golden: [u8; 48] = [
        0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
        0x00, // len 32, repeat 2
        0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x10, 0x00, 0x00, 0x00,
    ];
    let es = [
        RegisterResult { rkey: 0x100, host_addr: 0x7f00_0000_0000 },
        RegisterResult { rkey: 0x200, host_addr: 0x7f00_1000_0000 },
    ];
    assert_eq!(write(CommandType::RegisterResult, &es), golden);
    assert_eq!(decode_message(&golden).unwrap().collect_entries::<RegisterResult>(), Ok(es.to_vec()));
}

#[test]
fn compress_message_golden() {
    let golden: [u8; 40] = [
        0x00, 0x00, 0x00, 0x18, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00,
    ];
    let e = Compress { value: 0, block_index: 0, offset: 0x1000, length: 0x10_0000 };
    assert_eq!(write(CommandType::Compress, &[e]), golden);
    assert_eq!(decode_message(&golden).unwrap().collect_entries::<Compress>(), Ok(vec![e]));
}

#[test]
fn ram_blocks_result_message_golden() {
    // QEMU: repeat 1 for any number of blocks; here 2 blocks, len 64.
    let golden: [u8; 80] = [
        0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x00, // block 0
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // rkey 0 (dynamic), padding
        0x00, 0x00, 0x7f, 0x10, 0x00, 0x00, 0x00, 0x00, // block 1
        0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    let es = [
        DestBlock { remote_host_addr: 0x7f00_0000_0000, offset: 0, length: 0x0800_0000, remote_rkey: 0 },
        DestBlock { remote_host_addr: 0x7f10_0000_0000, offset: 0x0800_0000, length: 0x2_0000, remote_rkey: 0 },
    ];
    assert_eq!(write(CommandType::RamBlocksResult, &es), golden);
    let m = decode_message(&golden).unwrap();
    assert_eq!(m.repeat, 1);
    assert_eq!(m.collect_entries::<DestBlock>(), Ok(es.to_vec()));
}

#[test]
fn ram_blocks_request_with_specs_golden() {
    // rdmamig extension: len = repeat × 256; each entry is length, then name.
    let mut golden = vec![0u8; 16 + 512];
    golden[..16].copy_from_slice(&[0, 0, 0x02, 0x00, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 0]);
    golden[16..24].copy_from_slice(&[0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00]); // 128 MiB
    golden[24..30].copy_from_slice(b"pc.ram");
    golden[272..280].copy_from_slice(&[0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00]); // 256 KiB
    golden[280..287].copy_from_slice(b"pc.bios");
    let specs = [BlockSpec::new("pc.ram", 0x0800_0000).unwrap(), BlockSpec::new("pc.bios", 0x4_0000).unwrap()];
    assert_eq!(write(CommandType::RamBlocksRequest, &specs), golden);
    let m = decode_message(&golden).unwrap();
    assert_eq!((m.kind, m.repeat), (CommandType::RamBlocksRequest, 2));
    assert_eq!(m.collect_entries::<BlockSpec>(), Ok(specs.to_vec()));
}
