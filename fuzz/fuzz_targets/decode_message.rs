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
    let pb = all::<PostcopyBlock>(&m);
    let repeat = m.repeat as usize;
    match m.kind {
        CommandType::Error
        | CommandType::Ready
        | CommandType::RegisterFinished
        | CommandType::UnregisterFinished
        | CommandType::PostcopyResume => assert!(m.payload.is_empty()),
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
        CommandType::Postcopy if !m.payload.is_empty() => assert_eq!(pb * PostcopyBlock::SIZE, m.payload.len()),
        CommandType::PostcopyDone => assert_eq!(m.payload.len(), PostcopySummary::SIZE),
        CommandType::PostcopyFaultQp | CommandType::PostcopyFaultQpResult => {
            assert_eq!((m.payload.len(), repeat), (QpEndpoint::SIZE, 1));
            if let Ok(qp) = QpEndpoint::decode(m.payload) {
                assert!(qp.qpn < 1 << 24 && qp.psn < 1 << 24);
            }
        }
        CommandType::PostcopyRecovery => {
            assert_eq!((m.payload.len(), repeat), (PostcopyRecovery::SIZE, 1));
            if let Ok(r) = PostcopyRecovery::decode(m.payload) {
                assert_ne!(r.port, 0);
                let mut b = [0u8; PostcopyRecovery::SIZE];
                r.encode(&mut b);
                assert_eq!(&b[..], m.payload);
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
    for e in m.entries::<PostcopyBlock>().flatten() {
        let mut b = [0u8; PostcopyBlock::SIZE];
        e.encode(&mut b);
        assert_eq!(PostcopyBlock::decode(&b), Ok(e));
        // The payload read as this block's table: accepted only as documented.
        if let Ok((stale, regions)) = postcopy_table(&e, m.payload) {
            assert_eq!(stale.len() as u64, postcopy_bitmap_words(e.length));
            assert_eq!(stale.iter().map(|w| w.count_ones() as u64).sum::<u64>(), e.stale_pages);
            assert_eq!(regions.len(), e.regions as usize);
            let mut end = 0;
            for r in &regions {
                assert!(r.length > 0 && r.offset >= end && r.offset + r.length <= e.length);
                end = r.offset + r.length;
            }
            for p in
                (0..e.length.div_ceil(POSTCOPY_PAGE_SIZE)).filter(|p| stale[(p / 64) as usize] >> (p % 64) & 1 != 0)
            {
                let at = p * POSTCOPY_PAGE_SIZE;
                assert!(regions.iter().any(|r| (r.offset..r.offset + r.length).contains(&at)), "page {p} uncovered");
            }
        }
    }
    for e in m.entries::<PostcopyRegion>().flatten() {
        let mut b = [0u8; PostcopyRegion::SIZE];
        e.encode(&mut b);
        assert_eq!(PostcopyRegion::decode(&b), Ok(e));
    }
    for e in m.entries::<BlockSpec>().flatten() {
        let mut b = [0u8; BlockSpec::SIZE];
        e.encode(&mut b);
        assert_eq!(BlockSpec::decode(&b), Ok(e.clone()));
        assert_eq!(BlockSpec::new(&e.name, e.length), Ok(e));
    }
});
