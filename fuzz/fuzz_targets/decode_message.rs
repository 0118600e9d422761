//! decode_message on arbitrary bytes, then every entry decoder on the payload.
//! Accepted messages must satisfy the documented rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmamig::wire::*;

fn all<E: Entry>(m: &Message<'_>) -> usize {
    let mut n = 0;
    for e in m.entries::<E>() {
        let _ = e;
        n += 1;
    }
    n
}

fuzz_target!(|data: &[u8]| {
    let Ok(m) = decode_message(data) else { return };
    assert_eq!(m.payload.len() + CONTROL_HEADER_LEN, data.len());
    assert!(m.payload.len() <= MAX_PAYLOAD);
    assert_ne!(m.kind, CommandType::None);
    if m.kind != CommandType::QemuFile {
        assert!(m.repeat <= MAX_REPEAT);
    }
    let rr = all::<RegisterRequest>(&m);
    let rs = all::<RegisterResult>(&m);
    let db = all::<DestBlock>(&m);
    let _ = all::<Compress>(&m);
    let bs = all::<BlockSpec>(&m);
    let _ = all::<PostcopySummary>(&m);
    let repeat = m.repeat as usize;
    match m.kind {
        CommandType::Error
        | CommandType::Ready
        | CommandType::RegisterFinished
        | CommandType::UnregisterFinished => assert!(m.payload.is_empty()),
        CommandType::RegisterRequest | CommandType::UnregisterRequest | CommandType::Compress => {
            assert!(repeat >= 1);
            assert_eq!(rr, repeat);
        }
        CommandType::RegisterResult => {
            assert!(repeat >= 1);
            assert_eq!(rs, repeat);
        }
        CommandType::RamBlocksResult => assert_eq!(db * DestBlock::SIZE, m.payload.len()),
        CommandType::RamBlocksRequest if !m.payload.is_empty() => assert_eq!(bs, repeat),
        CommandType::Postcopy => {
            // Accepted: the blocks and bitmaps add up exactly, each bitmap holds its count.
            let blocks = postcopy_blocks(m.payload, m.repeat).expect("decode_message checked the layout");
            assert_eq!(blocks.len(), if m.payload.is_empty() { 0 } else { repeat });
            let bytes: u64 = blocks
                .iter()
                .map(|(b, w)| {
                    assert_eq!(w.len() as u64, postcopy_bitmap_words(b.length));
                    assert_eq!(w.iter().map(|x| x.count_ones() as u64).sum::<u64>(), b.stale_pages);
                    PostcopyBlock::SIZE as u64 + 8 * w.len() as u64
                })
                .sum();
            assert_eq!(bytes, m.payload.len() as u64);
        }
        CommandType::PostcopyDone => assert_eq!(m.payload.len(), PostcopySummary::SIZE),
        CommandType::PostcopyFaultQp | CommandType::PostcopyFaultQpResult => {
            assert_eq!((m.payload.len(), repeat), (QpEndpoint::SIZE, 1));
            if let Ok(qp) = QpEndpoint::decode(m.payload) {
                assert!(qp.qpn < 1 << 24 && qp.psn < 1 << 24);
            }
        }
        _ => {}
    }
    // Re-encoding accepted entries reproduces them.
    for e in m.entries::<RegisterRequest>().flatten() {
        let mut b = [0u8; RegisterRequest::SIZE];
        e.encode(&mut b);
        assert_eq!(RegisterRequest::decode(&b), Ok(e));
    }
    for e in m.entries::<BlockSpec>().flatten() {
        let mut b = [0u8; BlockSpec::SIZE];
        e.encode(&mut b);
        assert_eq!(BlockSpec::decode(&b), Ok(e.clone()));
        assert_eq!(BlockSpec::new(&e.name, e.length), Ok(e));
    }
});
