//! The batch save API: `Source::save_ranges` and `Source::save_bitmap`,
//! from several threads at once, and a bitmap spanning several queue
//! entries, migrating byte-identical; and what they refuse.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rdmamig::{Config, Ending, ErrorKind, SaveRange, Source};

use crate::migration::{connect, GuestRam, Layout, Rng, PAGE};

const MIB: u64 = 1 << 20;

/// Ranges covering `len` bytes of block `block` in odd pieces, so that
/// nearly every one straddles a chunk boundary; the last ends at the block's end.
fn odd_ranges(block: u32, len: u64) -> Vec<SaveRange> {
    let mut out = Vec::new();
    let mut offset = 0;
    let mut piece = MIB - 3 * PAGE + 7;
    while offset < len {
        let n = piece.min(len - offset);
        out.push(SaveRange { block, offset, len: n });
        offset += n;
        piece = piece * 3 / 2 % (3 * MIB) + 4097;
    }
    out
}

/// Bits `first..first + count` of `dirty`, as a bitmap whose bit 0 is page `first`.
fn sub_bitmap(dirty: &[bool], first: usize, count: usize) -> Vec<u64> {
    let mut bits = vec![0u64; count.div_ceil(64)];
    for i in (0..count).filter(|&i| dirty[first + i]) {
        bits[i / 64] |= 1 << (i % 64);
    }
    bits
}

fn batch_saves_migrate_byte_identical(config: Config) {
    let layout = Layout::standard();
    let src_ram = Arc::new(layout.source_ram(5));
    let dst_ram = layout.dest_ram();
    let (source, dest) = connect(&layout.registry(&src_ram, 1 << 40), &config, layout.registry(&dst_ram, 0), &config);

    // Refused outside a window, and with nothing queued when one range is bad.
    let whole: Vec<SaveRange> =
        layout.blocks.iter().enumerate().flat_map(|(b, (_, len, _))| odd_ranges(b as u32, *len)).collect();
    assert!(whole.len() >= 50, "{}", whole.len());
    assert_eq!(source.save_ranges(whole.iter().copied()).unwrap_err().kind, ErrorKind::State);
    source.iteration_begin().unwrap();
    let mut bad = whole.clone();
    bad.push(SaveRange { block: 1, offset: 8 * MIB - PAGE, len: PAGE + 1 });
    let e = source.save_ranges(bad).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    let e = source.save_ranges([SaveRange { block: 2, offset: 0, len: 1 }]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");

    // Window 1: every byte, in odd ranges, from three threads at once.
    thread::scope(|s| {
        for part in whole.chunks(whole.len().div_ceil(3)) {
            let source = &source;
            s.spawn(move || source.save_ranges(part.iter().copied()).unwrap());
        }
    });
    source.iteration_end().unwrap();

    // The guest writes ~3 % of its pages; window 2 sends them as bitmaps:
    // pc.ram from four threads over uneven page spans (none a multiple of 64
    // pages long, none starting on a word), vga.vram whole.
    let mut rng = Rng::new(11);
    let dirty: Vec<Vec<bool>> = layout
        .blocks
        .iter()
        .enumerate()
        .map(|(b, (_, len, zeros))| {
            (0..len / PAGE)
                .map(|page| {
                    let in_zeros = zeros.iter().any(|&(z, zl)| page * PAGE + PAGE > z && page * PAGE < z + zl);
                    let hit = !in_zeros && rng.next() % 32 == 0;
                    if hit {
                        src_ram[b].write_u64(page * PAGE + rng.next() % (PAGE / 8) * 8, rng.next());
                    }
                    hit
                })
                .collect()
        })
        .collect();
    let e = source.save_bitmap(0, &[!0], 0, 64, PAGE).unwrap_err();
    assert_eq!(e.kind, ErrorKind::State, "{e}");
    source.iteration_begin().unwrap();
    let pages = dirty[0].len();
    let cuts = [0, 7001, 15003, 22999, pages];
    thread::scope(|s| {
        for w in cuts.windows(2) {
            let (source, dirty) = (&source, &dirty);
            s.spawn(move || {
                let bits = sub_bitmap(&dirty[0], w[0], w[1] - w[0]);
                source.save_bitmap(0, &bits, w[0] as u64, (w[1] - w[0]) as u64, PAGE).unwrap();
            });
        }
    });
    let vga = sub_bitmap(&dirty[1], 0, dirty[1].len());
    // Refused: a bitmap too short, pages past the block, page size 0.
    let errors = [
        source.save_bitmap(1, &vga[..vga.len() - 1], 0, dirty[1].len() as u64, PAGE),
        source.save_bitmap(1, &vga, 1, dirty[1].len() as u64, PAGE),
        source.save_bitmap(1, &vga, 0, dirty[1].len() as u64, 0),
        source.save_bitmap(1, &vga, u64::MAX / 2, 1, PAGE),
    ];
    for e in errors {
        assert_eq!(e.unwrap_err().kind, ErrorKind::InvalidArgument);
    }
    source.save_bitmap(1, &vga, 0, dirty[1].len() as u64, PAGE).unwrap();
    source.iteration_end().unwrap();
    let dirty_pages: usize = dirty.iter().map(|d| d.iter().filter(|&&x| x).count()).sum();
    eprintln!("batch: {} ranges, then {dirty_pages} dirty pages by bitmap", whole.len());
    assert!(dirty_pages > 500, "{dirty_pages}");

    // Window 3: pc.ram as one bitmap of 512-byte pages, 245760 of them: the
    // call queues it as four entries of 65536 pages, and dirty runs cross
    // each boundary between them (the transfer thread merges them again).
    const SMALL: u64 = 512;
    let pages = (layout.blocks[0].1 / SMALL) as usize;
    let mut bits = vec![0u64; pages.div_ceil(64)];
    let boundaries = (1..4).flat_map(|k| k * 65536 - 3..k * 65536 + 2);
    let random: Vec<usize> = (0..pages).filter(|_| rng.next() % 16 == 0).collect();
    for page in boundaries.chain(random) {
        bits[page / 64] |= 1 << (page % 64);
        src_ram[0].write_u64(page as u64 * SMALL + rng.next() % (SMALL / 8) * 8, rng.next());
    }
    source.iteration_begin().unwrap();
    source.save_bitmap(0, &bits, 0, pages as u64, SMALL).unwrap();
    source.iteration_end().unwrap();

    finish(source, dest, &src_ram, &dst_ram);
}

/// Closes the migration and checks every block arrived byte-identical.
fn finish(source: Source, dest: rdmamig::Destination, src_ram: &[GuestRam], dst_ram: &[GuestRam]) {
    let extensions = source.negotiated().extensions;
    let ending = source.close().unwrap();
    assert_eq!(ending, if extensions { Ending::Completed } else { Ending::Unverified });
    assert_eq!(dest.wait_end(Some(Duration::from_secs(30))).unwrap(), ending);
    for (i, (s, d)) in src_ram.iter().zip(dst_ram).enumerate() {
        if let Some(at) = (0..s.bytes().len()).find(|&at| s.bytes()[at] != d.bytes()[at]) {
            panic!("block {i} differs at {at:#x}");
        }
    }
}

#[test]
fn batch_saves_between_rdmamig_peers() {
    batch_saves_migrate_byte_identical(Config::default());
}

#[test]
fn batch_saves_qemu_compatible_pin_all() {
    batch_saves_migrate_byte_identical(Config { extensions: false, pin_all: true, ..Config::default() });
}

#[test]
fn batch_saves_with_a_bound_on_queued_bytes() {
    // Saves wait for the transfer thread past 1 MiB queued: every one still arrives.
    batch_saves_migrate_byte_identical(Config { max_queued_bytes: Some(MIB), ..Config::default() });
}
