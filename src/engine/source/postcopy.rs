//! The source's post-copy, on its transfer thread: expose the parts of the
//! blocks that hold stale pages and the blocks' tables for remote read, set
//! up the fault QP, send POSTCOPY, wait for POSTCOPY_DONE.

use std::time::{Duration, Instant};

use crate::bitmap::{self, for_each_run};
use crate::engine::link::Listener;
use crate::engine::link::{self, Link};
use crate::engine::pin::Pins;
use crate::engine::postcopy;
use crate::engine::postcopy::{LinkWatch, PostcopyLink, StalePages};
use crate::engine::ram::RamBlocks;
use crate::engine::Config;
use crate::host::RegisteredBuffer;
use crate::logging;
use crate::verbs::{Access, MemoryRegion};
use crate::wire::{
    postcopy_bitmap_words, postcopy_table_len, CommandType, EncodeError, Entry, Message, MessageWriter, PostcopyBlock,
    PostcopyRecovery, PostcopyRegion, PostcopySummary, MAX_REPEAT, POSTCOPY_MAX_REGIONS, POSTCOPY_PAGE_SIZE,
    RECOVERY_TOKEN_LEN,
};
use crate::{Error, ErrorKind, Result};

/// Checks the caller's bitmaps against the registry (on the caller's thread):
/// one entry per block at most (and at most a message's entries), each long
/// enough, no bit past the block's last page.
pub(crate) fn check(ram: &RamBlocks, stale: &[StalePages]) -> Result<()> {
    let bad = |why: String| Err(Error::new(ErrorKind::InvalidArgument, why));
    if stale.len() > MAX_REPEAT as usize {
        return bad(format!("{} blocks listed, more than one POSTCOPY message holds ({MAX_REPEAT})", stale.len()));
    }
    let mut seen = vec![false; ram.len()];
    for s in stale {
        let block = ram.get(s.block)?;
        if std::mem::replace(&mut seen[s.block as usize], true) {
            return bad(format!("block {} is listed twice", s.block));
        }
        if block.length % POSTCOPY_PAGE_SIZE != 0 {
            return bad(format!("block '{}' is not a whole number of 4 KiB pages", block.name));
        }
        let pages = block.length / POSTCOPY_PAGE_SIZE;
        let words = postcopy_bitmap_words(block.length);
        if (s.bitmap.len() as u64) < words {
            return bad(format!(
                "block '{}' has {pages} pages: a bitmap of {} words is short",
                block.name,
                s.bitmap.len()
            ));
        }
        let past = s.bitmap[words as usize..].iter().any(|&w| w != 0)
            || (pages % 64 != 0 && s.bitmap[words as usize - 1] >> (pages % 64) != 0);
        if past {
            return bad(format!("the bitmap of block '{}' has bits past its {pages} pages", block.name));
        }
    }
    Ok(())
}

/// What post-copy registered for the destination's reads: parts of guest
/// RAM, and the tables (a buffer that owns its memory).
#[derive(Default)]
pub(crate) struct Exposed {
    mrs: Vec<MemoryRegion>,
    tables: Option<RegisteredBuffer>,
}

impl Exposed {
    pub fn release(self, pins: &Pins) {
        let Exposed { mrs, tables } = self;
        for mr in mrs {
            pins.release(mr);
        }
        if let Some(tables) = tables {
            pins.release_buffer(tables);
        }
        pins.settle();
    }
}

/// Registers the parts of the blocks that hold stale pages, and their
/// tables, for remote read (into `exposed`), sends POSTCOPY and waits
/// (while the destination stays alive) for POSTCOPY_DONE, then releases
/// them. On failure they stay in `exposed`, for the caller to release once
/// its QPs are gone: a read in flight then meets a closed connection, not a
/// registration that vanished (a remote access error at the destination).
/// With `config.postcopy_recovery` a lost connection is replaced by the
/// destination's recovery connection (`link::recovery`), if it comes in time.
pub(crate) fn run(
    link: &mut Link,
    pins: &Pins,
    ram: &RamBlocks,
    stale: &[StalePages],
    exposed: &mut Option<Exposed>,
    config: &Config,
    watch: &LinkWatch,
) -> Result<PostcopySummary> {
    let mut blocks: Vec<Table> = Vec::new();
    for s in stale {
        let length = ram.get(s.block)?.length;
        let bitmap = &s.bitmap[..postcopy_bitmap_words(length) as usize];
        let stale_pages: u64 = bitmap::count(bitmap);
        if stale_pages > 0 {
            let entry = PostcopyBlock { block_index: s.block, length, stale_pages, ..PostcopyBlock::default() };
            blocks.push(Table { entry, bitmap, regions: Vec::new() });
        }
    }
    regions(&mut blocks);
    let Exposed { mrs, tables } = exposed.insert(Exposed::default());
    let result = (|| {
        let recovery = match config.postcopy_recovery {
            Some(window) if link.negotiated.postcopy_recovery => Some(Recovery::offer(link, config, window, watch)?),
            _ => None,
        };
        for t in &mut blocks {
            let block = ram.get(t.entry.block_index)?;
            for r in &mut t.regions {
                let what = format!("post-copy's remote read of part of block '{}'", block.name);
                pins.reserve(r.length, &what)?;
                let mr = pins.register_guest(&block.range(r.offset, r.length), Access::REMOTE_READ)?;
                (r.remote_addr, r.rkey) = (mr.addr(), mr.rkey());
                mrs.push(mr);
            }
        }
        // What the destination reads first: each block's table.
        let len = |t: &Table| postcopy_table_len(&PostcopyBlock { regions: t.regions.len() as u32, ..t.entry });
        let size = blocks.iter().map(len).sum::<u64>().next_multiple_of(4096);
        pins.reserve(size, "post-copy's remote read of its tables")?;
        let buf = tables.insert(pins.register_buffer(size as usize, Access::REMOTE_READ)?);
        let mut at = 0;
        for t in &blocks {
            t.write(&mut buf.bytes_mut()[at..]);
            at += len(t) as usize;
        }
        let (mut at, rkey) = (buf.mr().addr(), buf.mr().rkey());
        for t in &mut blocks {
            t.entry.regions = t.regions.len() as u32;
            (t.entry.table_addr, t.entry.table_rkey) = (at, rkey);
            at += len(t);
        }
        let total: u64 = blocks.iter().map(|t| t.entry.stale_pages).sum();
        link::open_fault_qp(link)?;
        logging::info(format_args!(
            "source: post-copy: {total} stale pages in {} blocks, {} regions exposed for remote read",
            blocks.len(),
            mrs.len()
        ));
        let build = |w: &mut MessageWriter| blocks.iter().try_for_each(|t| w.push(&t.entry));
        let summary = match &recovery {
            None => link.request_by(None, CommandType::Postcopy, build, CommandType::PostcopyDone, done)?,
            Some(r) => r.request(link, build)?,
        };
        if summary.pages != total {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("the destination reports {} pages installed of the {total} stale", summary.pages),
            ));
        }
        logging::info(format_args!(
            "source: post-copy done: {} pages, {} faults, {} bytes read",
            summary.pages, summary.faults, summary.bytes
        ));
        Ok(summary)
    })();
    link::close_fault_qp(link);
    if result.is_ok() {
        exposed.take().expect("inserted above").release(pins);
    }
    result
}

/// How long the source's wait for a recovery connection goes without looking at an abort.
const ACCEPT_SLICE: Duration = Duration::from_millis(100);

/// The source's side of post-copy recovery: the listener a lost
/// connection's replacement comes to, and its token.
struct Recovery<'a> {
    listener: Listener,
    token: [u8; RECOVERY_TOKEN_LEN],
    window: Duration,
    watch: &'a LinkWatch,
    /// `Config::postcopy_recovery_by_hypervisor`: admit a recovery only after its go.
    by_hypervisor: bool,
}

impl<'a> Recovery<'a> {
    /// Opens the listener and tells the destination where it is (POSTCOPY_RECOVERY).
    fn offer(link: &mut Link, config: &Config, window: Duration, watch: &'a LinkWatch) -> Result<Recovery<'a>> {
        let listener = link::recovery_listener(link, config)?;
        let mut token = [0u8; RECOVERY_TOKEN_LEN];
        getrandom::getrandom(&mut token)
            .map_err(|e| Error::new(ErrorKind::Verbs, format!("no random bytes for a recovery token: {e}")))?;
        let offer = PostcopyRecovery { port: listener.port(), token };
        link.post_message(CommandType::PostcopyRecovery, |w| w.push(&offer))?;
        logging::debug(format_args!("source: post-copy recovery listener on port {}", offer.port));
        #[cfg(feature = "rdma-tests")]
        {
            *RECOVERY_OFFER.lock() = Some((offer.port, token));
        }
        Ok(Recovery { listener, token, window, watch, by_hypervisor: config.postcopy_recovery_by_hypervisor })
    }

    /// POSTCOPY (`build`) and its POSTCOPY_DONE, over as many connections
    /// as it takes: each one lost is replaced by the destination's recovery
    /// connection (`take_back`), on which a fault QP is set up again and
    /// POSTCOPY_RESUME asks for it. The
    /// destination may reconnect before this side noticed the loss: its
    /// request, once admitted (token, key), replaces the connection at once;
    /// any other request is refused and changes nothing.
    fn request(
        &self,
        link: &mut Link,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<PostcopySummary> {
        link.begin_request_by(None, CommandType::Postcopy, build, CommandType::PostcopyDone)?;
        loop {
            let back = match link::response_or_request(link, heeded(&self.listener), done) {
                Ok(Some(summary)) => return Ok(summary),
                // The destination gave this connection up; its replacement
                // waits for the hypervisor's go.
                Ok(None) if self.by_hypervisor => {
                    let lost = Error::new(ErrorKind::Disconnected, "the destination reconnected");
                    self.take_back(link, lost)?
                }
                Ok(None) => match link::accept_recovery(link, &self.listener, self.token, Instant::now()) {
                    Ok(back) => {
                        logging::warn(format_args!(
                            "source: the destination reconnected: post-copy's connection is replaced"
                        ));
                        link::abandon(link);
                        back
                    }
                    // Refused (the refusal is logged): the connection stays.
                    Err(e) if e.kind == ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                },
                // A destination that recovers sends no disconnect (`Link::abandon`):
                // this one is gone (its process ended), it is not waited for.
                Err(lost) if link.closed_by_peer() => return Err(closed(&lost)),
                Err(lost) if postcopy::recoverable(&lost) => self.take_back(link, lost)?,
                Err(e) => return Err(e),
            };
            *link = back;
            link::open_fault_qp(link)?;
            let resume = CommandType::PostcopyResume;
            link.begin_request_by(None, resume, |_| Ok(()), CommandType::PostcopyDone)?;
        }
    }

    /// The connection was lost (`lost`): gives it up and waits, within the
    /// window, for the destination's recovery connection.
    fn take_back(&self, link: &mut Link, lost: Error) -> Result<Link> {
        logging::warn(format_args!(
            "source: post-copy's connection is lost ({lost}): waiting up to {:?} for the destination to reconnect",
            self.window
        ));
        link::abandon(link);
        self.watch.set(PostcopyLink::Lost);
        let deadline = Instant::now() + self.window;
        // In slices, so that the hypervisor's abort is seen, and the
        // destination's disconnect (it died meanwhile).
        let check = |link: &mut Link| {
            link.check_stop("post-copy's recovery")?;
            match link::closed_by_peer_since(link)? {
                true => Err(closed(&lost)),
                false => Ok(()),
            }
        };
        if self.by_hypervisor {
            self.watch.await_go(deadline, &lost, || check(link))?;
        }
        self.watch.set(PostcopyLink::Recovering);
        loop {
            check(link)?;
            let slice = (Instant::now() + ACCEPT_SLICE).min(deadline);
            let back = match heeded(&self.listener) {
                Some(listener) => link::accept_recovery(link, listener, self.token, slice),
                None => {
                    std::thread::sleep(slice.saturating_duration_since(Instant::now()));
                    Err(Error::new(ErrorKind::Timeout, "the recovery listener is not heeded (test hook)"))
                }
            };
            match back {
                Ok(back) => {
                    logging::info(format_args!("source: post-copy's connection is back"));
                    self.watch.set(PostcopyLink::Up);
                    return Ok(back);
                }
                Err(e) if e.kind == ErrorKind::Timeout && slice < deadline => {}
                Err(e) if e.kind == ErrorKind::Aborted => return Err(e),
                Err(e) => return Err(Error::new(lost.kind, format!("{}; no recovery: {}", lost.message, e.message))),
            }
        }
    }
}

/// The connection was `lost` with the destination's disconnect: no recovery.
fn closed(lost: &Error) -> Error {
    Error::new(lost.kind, format!("{}; the destination closed it: no recovery", lost.message))
}

/// The listener the source's waits watch: none while the test hook
/// `DEAF_TO_RECOVERY` is set.
fn heeded(listener: &Listener) -> Option<&Listener> {
    #[cfg(feature = "rdma-tests")]
    if DEAF_TO_RECOVERY.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    Some(listener)
}

/// Failure injection for the RDMA tests: the source never looks at its
/// recovery listener, as a source host that stopped answering (a
/// destination's recovery request waits unanswered).
#[cfg(feature = "rdma-tests")]
pub static DEAF_TO_RECOVERY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// For the RDMA tests: the last recovery listener's port and token, as a
/// host that reads the control channel learns them (POSTCOPY_RECOVERY).
#[cfg(feature = "rdma-tests")]
pub static RECOVERY_OFFER: parking_lot::Mutex<Option<(u16, [u8; RECOVERY_TOKEN_LEN])>> = parking_lot::Mutex::new(None);

/// POSTCOPY_DONE's summary.
fn done(m: &Message) -> Result<PostcopySummary> {
    let mut e = m.entries::<PostcopySummary>();
    e.next().expect("decode_message checked one entry").map_err(crate::engine::link::protocol_error)
}

/// A block with stale pages, as the destination will read it.
struct Table<'a> {
    entry: PostcopyBlock,
    bitmap: &'a [u64],
    regions: Vec<PostcopyRegion>,
}

impl Table<'_> {
    /// Writes the table the destination reads (`wire::postcopy_table`):
    /// the bitmap's big-endian words, then the regions.
    fn write(&self, out: &mut [u8]) {
        let (map, rest) = out.split_at_mut(self.bitmap.len() * 8);
        for (word, o) in self.bitmap.iter().zip(map.chunks_exact_mut(8)) {
            o.copy_from_slice(&word.to_be_bytes());
        }
        for (r, o) in self.regions.iter().zip(rest.chunks_exact_mut(PostcopyRegion::SIZE)) {
            r.encode(o);
        }
    }
}

/// Registered parts are whole `REGION_ALIGN` windows (2 MiB) around stale pages.
const REGION_ALIGN: u64 = 2 << 20;

// One region per block always fits: so `regions` ends.
const _: () = assert!(MAX_REPEAT <= POSTCOPY_MAX_REGIONS);

/// The parts of each block to register: the `REGION_ALIGN` windows that
/// hold stale pages, runs of them merged when at most a gap apart (adjacent
/// ones always); the gap doubles from none until there are at most
/// `POSTCOPY_MAX_REGIONS` (at the latest one per block: `check` allows at
/// most `MAX_REPEAT` blocks). Whole blocks would do, but registering memory
/// backs every page of it, and a guest's never-touched memory should stay so.
fn regions(blocks: &mut [Table]) {
    let align = REGION_ALIGN / POSTCOPY_PAGE_SIZE;
    let mut gap = 0;
    loop {
        for t in blocks.iter_mut() {
            let pages = t.entry.length / POSTCOPY_PAGE_SIZE;
            t.regions.clear();
            let _ = for_each_run(t.bitmap, pages, |first, n| {
                let (start, end) = (first / align * align, ((first + n).div_ceil(align) * align).min(pages));
                match t.regions.last_mut() {
                    Some(r) if start <= (r.offset + r.length) / POSTCOPY_PAGE_SIZE + gap => {
                        r.length = end * POSTCOPY_PAGE_SIZE - r.offset;
                    }
                    _ => t.regions.push(PostcopyRegion {
                        offset: start * POSTCOPY_PAGE_SIZE,
                        length: (end - start) * POSTCOPY_PAGE_SIZE,
                        ..PostcopyRegion::default()
                    }),
                }
                Ok::<(), ()>(())
            });
        }
        if blocks.iter().map(|t| t.regions.len()).sum::<usize>() <= POSTCOPY_MAX_REGIONS as usize {
            return;
        }
        gap = (gap * 2).max(align);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::postcopy_table;

    /// The regions `regions` makes for each block, as the destination checks its table.
    fn table_of(tables: &mut [Table]) -> Vec<Vec<PostcopyRegion>> {
        regions(tables);
        tables
            .iter()
            .map(|t| {
                let entry = PostcopyBlock { regions: t.regions.len() as u32, ..t.entry };
                let mut bytes = vec![0u8; postcopy_table_len(&entry) as usize];
                t.write(&mut bytes);
                postcopy_table(&entry, &bytes).expect("the destination accepts the table").1
            })
            .collect()
    }

    fn table(bitmap: &[u64], pages: u64) -> Table<'_> {
        let stale_pages = bitmap::count(bitmap);
        let entry = PostcopyBlock { length: pages * POSTCOPY_PAGE_SIZE, stale_pages, ..PostcopyBlock::default() };
        Table { entry, bitmap, regions: Vec::new() }
    }

    #[test]
    fn regions_cover_the_stale_pages_in_2_mib_windows() {
        // Pages per window.
        const W: u64 = 512;
        // Pages 0, W + 3 (the next window: merged), 10 W - 1 and 10 W (two windows), the block's last.
        let pages = 40 * W + 100;
        let mut bitmap = vec![0u64; pages.div_ceil(64) as usize];
        for p in [0, W + 3, 10 * W - 1, 10 * W, pages - 1] {
            bitmap[(p / 64) as usize] |= 1 << (p % 64);
        }
        let got = table_of(&mut [table(&bitmap, pages)]);
        let span = |r: &PostcopyRegion| (r.offset / 4096, (r.offset + r.length) / 4096);
        assert_eq!(got[0].iter().map(span).collect::<Vec<_>>(), vec![(0, 2 * W), (9 * W, 11 * W), (40 * W, pages)]);
    }

    #[test]
    fn more_windows_than_allowed_are_merged_until_they_fit() {
        // Two 64 GiB blocks with a stale page in every other window.
        const W: u64 = 512;
        let pages = 32768 * W;
        let mut bitmap = vec![0u64; (pages / 64) as usize];
        for w in (0..32768).step_by(2) {
            bitmap[(w * W / 64) as usize] |= 1;
        }
        // With no gap: 32768 regions; a gap of one window merges each block's into one.
        let got = table_of(&mut [table(&bitmap, pages), table(&bitmap, pages)]);
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 1]);
        // Groups of 1024 windows (every other one stale), 2048 windows apart:
        // a gap of one window merges each group, not the groups.
        for w in (0..32768).step_by(2).filter(|w| w % 4096 >= 2048) {
            bitmap[(w * W / 64) as usize] = 0;
        }
        let got = table_of(&mut [table(&bitmap, pages)]);
        assert_eq!(got[0].len(), 8, "{:?}", got[0].first());
    }
}
