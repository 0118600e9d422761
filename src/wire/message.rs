//! Whole control messages: validation of a received buffer, and a writer for send buffers.

use std::marker::PhantomData;

use super::entry::need;
use super::entry::{
    AuthProof, BlockSpec, Compress, DestBlock, EndSummary, Entry, PostcopyBlock, PostcopyRecovery, PostcopyRegion,
    PostcopySummary, QpEndpoint, RegisterRequest, RegisterResult,
};
use super::error::{DecodeError, EncodeError};
use super::header::{decode_header, encode_header, CommandType, ControlHeader};
use super::{CONTROL_HEADER_LEN, MAX_PAYLOAD, MAX_REPEAT};
use crate::bitmap::{self, next_set};

/// A validated received message, borrowing its payload from the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    pub kind: CommandType,
    /// As received. Meaningless for QEMU_FILE (QEMU sends 0, 1 or garbage);
    /// for RAM_BLOCKS_RESULT QEMU sends 1 whatever the entry count.
    pub repeat: u32,
    pub payload: &'a [u8],
}

impl<'a> Message<'a> {
    /// Decodes the payload as a sequence of `E`, lazily.
    ///
    /// The iterator yields one `Result` per `E::SIZE` bytes; if the payload is
    /// not a multiple of `E::SIZE` (the wrong `E` for this message), it ends with
    /// one [`DecodeError::TrailingBytes`]. It does not check that `E` fits
    /// `kind`. After [`decode_message`] the count for REGISTER_REQUEST,
    /// UNREGISTER_REQUEST, REGISTER_RESULT, COMPRESS and RAM_BLOCKS_REQUEST
    /// equals `repeat`; for RAM_BLOCKS_RESULT it is `payload.len() / 32`.
    pub fn entries<E: Entry>(&self) -> Entries<'a, E> {
        Entries { rest: self.payload, done: false, _e: PhantomData }
    }

    /// All entries, or the first error.
    pub fn collect_entries<E: Entry>(&self) -> Result<Vec<E>, DecodeError> {
        self.entries().collect()
    }
}

/// Iterator returned by [`Message::entries`].
#[derive(Clone, Debug)]
pub struct Entries<'a, E> {
    rest: &'a [u8],
    done: bool,
    _e: PhantomData<fn() -> E>,
}

impl<E: Entry> Iterator for Entries<'_, E> {
    type Item = Result<E, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.rest.is_empty() {
            return None;
        }
        if self.rest.len() < E::SIZE {
            self.done = true;
            return Some(Err(DecodeError::TrailingBytes { entry_size: E::SIZE, remaining: self.rest.len() }));
        }
        let (head, tail) = self.rest.split_at(E::SIZE);
        self.rest = tail;
        Some(E::decode(head))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            return (0, Some(0));
        }
        let n = self.rest.len() / E::SIZE + usize::from(self.rest.len() % E::SIZE != 0);
        (n, Some(n))
    }
}

impl<E: Entry> ExactSizeIterator for Entries<'_, E> {}
impl<E: Entry> std::iter::FusedIterator for Entries<'_, E> {}

/// Checks `len == repeat × size` with `repeat ≥ 1`, without overflow.
fn exact_entries(kind: CommandType, len: u32, repeat: u32, size: usize) -> Result<(), DecodeError> {
    if repeat == 0 {
        return Err(DecodeError::ZeroRepeat { kind, len });
    }
    if (repeat as u64) * (size as u64) != len as u64 {
        return Err(DecodeError::PayloadSizeMismatch { kind, len, repeat, entry_size: size });
    }
    Ok(())
}

/// Checks that the message carries exactly one entry of `size` bytes.
fn exactly_one(kind: CommandType, len: u32, repeat: u32, size: usize) -> Result<(), DecodeError> {
    exact_entries(kind, len, repeat, size)?;
    if repeat != 1 {
        return Err(DecodeError::PayloadSizeMismatch { kind, len, repeat, entry_size: size });
    }
    Ok(())
}

fn empty(kind: CommandType, len: u32) -> Result<(), DecodeError> {
    if len != 0 {
        return Err(DecodeError::UnexpectedPayload { kind, len });
    }
    Ok(())
}

/// Validates one received message. `buf` is exactly the bytes received
/// (`wc.byte_len` of the receive buffer).
///
/// Checks, in order: at least 16 bytes; a known type other than NONE;
/// `len ≤ 524272`; `16 + len == buf.len()`; `repeat ≤ 4096` (except
/// QEMU_FILE, whose repeat is ignored); then the payload rule of the type:
///
/// | type | rule |
/// |---|---|
/// | ERROR, READY, REGISTER_FINISHED, UNREGISTER_FINISHED, END_ACK, POSTCOPY_RESUME | `len == 0` (any repeat) |
/// | QEMU_FILE | any `len`, including 0 |
/// | RAM_BLOCKS_REQUEST | `len == 0`, or `len == repeat × 256` (block-spec extension) |
/// | RAM_BLOCKS_RESULT | `repeat ≥ 1`, `len % 32 == 0` (QEMU sends repeat 1 for n entries) |
/// | REGISTER_REQUEST, UNREGISTER_REQUEST, COMPRESS | `repeat ≥ 1`, `len == repeat × 24` |
/// | REGISTER_RESULT | `repeat ≥ 1`, `len == repeat × 16` |
/// | END (extension) | `repeat == 1`, `len == 16` (one [`EndSummary`]) |
/// | AUTH (extension) | `repeat == 1`, `len == 32` (one [`AuthProof`]) |
/// | POSTCOPY (extension) | `len == 0` (no stale page), or `len == repeat × 40` ([`PostcopyBlock`]) |
/// | POSTCOPY_DONE (extension) | `repeat == 1`, `len == 24` (one [`PostcopySummary`]) |
/// | POSTCOPY_FAULT_QP and its RESULT (extension) | `repeat == 1`, `len == 8` (one [`QpEndpoint`]) |
/// | POSTCOPY_RECOVERY (extension) | `repeat == 1`, `len == 20` (one [`PostcopyRecovery`]) |
///
/// Entry contents (e.g. COMPRESS value ≠ 0) are checked by [`Message::entries`].
pub fn decode_message(buf: &[u8]) -> Result<Message<'_>, DecodeError> {
    let h = decode_header(buf)?;
    let kind = h.kind;
    if kind == CommandType::None {
        return Err(DecodeError::NoneType);
    }
    if h.len as usize > MAX_PAYLOAD {
        return Err(DecodeError::TooLong { len: h.len, max: MAX_PAYLOAD });
    }
    let payload = &buf[CONTROL_HEADER_LEN..];
    if payload.len() != h.len as usize {
        return Err(DecodeError::LengthMismatch { len: h.len, received: buf.len() });
    }
    let (len, repeat) = (h.len, h.repeat);
    if kind != CommandType::QemuFile && repeat > MAX_REPEAT {
        return Err(DecodeError::TooManyRepeats { kind, repeat, max: MAX_REPEAT });
    }
    use CommandType as T;
    match kind {
        T::None => return Err(DecodeError::NoneType),
        T::Error | T::Ready | T::RegisterFinished | T::UnregisterFinished | T::EndAck | T::PostcopyResume => {
            empty(kind, len)?
        }
        T::QemuFile => {}
        T::RamBlocksRequest => {
            if len != 0 {
                exact_entries(kind, len, repeat, BlockSpec::SIZE)?;
            }
        }
        T::RamBlocksResult => {
            if repeat == 0 {
                return Err(DecodeError::ZeroRepeat { kind, len });
            }
            if len as usize % DestBlock::SIZE != 0 {
                return Err(DecodeError::PayloadNotMultiple { kind, len, entry_size: DestBlock::SIZE });
            }
        }
        T::RegisterRequest | T::UnregisterRequest => exact_entries(kind, len, repeat, RegisterRequest::SIZE)?,
        T::Compress => exact_entries(kind, len, repeat, Compress::SIZE)?,
        T::RegisterResult => exact_entries(kind, len, repeat, RegisterResult::SIZE)?,
        T::End => exactly_one(kind, len, repeat, EndSummary::SIZE)?,
        T::Auth => exactly_one(kind, len, repeat, AuthProof::SIZE)?,
        T::Postcopy if len == 0 => {}
        T::Postcopy => exact_entries(kind, len, repeat, PostcopyBlock::SIZE)?,
        T::PostcopyDone => exactly_one(kind, len, repeat, PostcopySummary::SIZE)?,
        T::PostcopyFaultQp | T::PostcopyFaultQpResult => exactly_one(kind, len, repeat, QpEndpoint::SIZE)?,
        T::PostcopyRecovery => exactly_one(kind, len, repeat, PostcopyRecovery::SIZE)?,
    }
    Ok(Message { kind, repeat, payload })
}

/// Post-copy page size: the unit of the stale bitmaps.
pub const POSTCOPY_PAGE_SIZE: u64 = 4096;

/// Words (u64, big-endian on the wire) of the stale bitmap of a block of `length` bytes.
pub const fn postcopy_bitmap_words(length: u64) -> u64 {
    length.div_ceil(POSTCOPY_PAGE_SIZE).div_ceil(64)
}

/// Bytes of the table of `block` (see [`postcopy_table`]).
pub fn postcopy_table_len(block: &PostcopyBlock) -> u64 {
    postcopy_bitmap_words(block.length) * 8 + block.regions as u64 * PostcopyRegion::SIZE as u64
}

/// The table of `block`, read from the source: its stale bitmap
/// ([`postcopy_bitmap_words`] big-endian words; bit `i` of word `i / 64`:
/// page `i` of the block must be read from the source), then its `regions`
/// [`PostcopyRegion`] entries. Checks that exactly `stale_pages` bits are
/// set, none past the block's last page, and that the regions are
/// page-aligned, non-empty, sorted, disjoint parts of the block, each
/// readable without wrapping, that together cover every stale page.
pub fn postcopy_table(block: &PostcopyBlock, bytes: &[u8]) -> Result<(Vec<u64>, Vec<PostcopyRegion>), DecodeError> {
    let words = postcopy_bitmap_words(block.length) as usize;
    need("POSTCOPY table", postcopy_table_len(block) as usize, bytes)?;
    let (map, table) = bytes.split_at(words * 8);
    let stale: Vec<u64> = map.chunks_exact(8).map(|w| u64::from_be_bytes(w.try_into().expect("8 bytes"))).collect();
    let pages = block.length.div_ceil(POSTCOPY_PAGE_SIZE);
    let counted = bitmap::count(&stale);
    let past_end = pages % 64 != 0 && stale.last().is_some_and(|w| w >> (pages % 64) != 0);
    if counted != block.stale_pages || past_end {
        return Err(DecodeError::PostcopyBitmap {
            block_index: block.block_index,
            declared: block.stale_pages,
            counted,
        });
    }
    let bad = |why| DecodeError::PostcopyRegions { block_index: block.block_index, why };
    let regions = table[..block.regions as usize * PostcopyRegion::SIZE]
        .chunks_exact(PostcopyRegion::SIZE)
        .map(PostcopyRegion::decode)
        .collect::<Result<Vec<_>, _>>()?;
    let mut end = 0;
    for r in &regions {
        if r.length == 0 || (r.offset | r.length) % POSTCOPY_PAGE_SIZE != 0 {
            return Err(bad("a region is empty or not page-aligned"));
        }
        if r.offset < end {
            return Err(bad("the regions are not sorted and disjoint"));
        }
        end = match r.offset.checked_add(r.length) {
            Some(e) if e <= block.length => e,
            _ => return Err(bad("a region ends past the block")),
        };
        if r.remote_addr.checked_add(r.length).is_none() {
            return Err(bad("a region wraps the source's address space"));
        }
    }
    // Every stale page lies in a region: none in the gaps between them (nor
    // before the first, nor after the last).
    let page = |bytes: u64| bytes / POSTCOPY_PAGE_SIZE;
    let mut from = 0;
    for (start, next) in regions.iter().map(|r| (page(r.offset), page(r.offset + r.length))).chain([(pages, pages)]) {
        if next_set(&stale, from, start).is_some() {
            return Err(bad("a stale page lies outside every region"));
        }
        from = next;
    }
    Ok((stale, regions))
}

/// Builds one control message (header + payload) in a send buffer.
///
/// The payload is limited by the buffer and by [`MAX_PAYLOAD`]. The header is
/// written by [`finish`](Self::finish) with this `repeat`, unless overridden
/// with [`with_repeat`](Self::with_repeat):
/// * QEMU_FILE: 0 (what current QEMU sends);
/// * RAM_BLOCKS_RESULT: 1 whatever the entry count, as QEMU sends it (and
///   then up to 16383 entries fit, not only 4096);
/// * other types with entries pushed: the number of entries;
/// * no entries pushed (READY, ERROR, REGISTER_FINISHED, RAM_BLOCKS_REQUEST
///   without block specs, ...): 1.
///
/// The writer does not enforce per-type rules: pushing nothing into a
/// REGISTER_REQUEST writes a message that [`decode_message`] rejects. QEMU
/// itself sends at most [`SEND_INCREMENT`](super::SEND_INCREMENT) bytes per
/// QEMU_FILE message; splitting is up to the caller.
#[derive(Debug)]
pub struct MessageWriter<'a> {
    buf: &'a mut [u8],
    kind: CommandType,
    /// Payload capacity: min(buf.len() − 16, MAX_PAYLOAD).
    cap: usize,
    len: usize,
    count: u32,
    repeat: Option<u32>,
}

impl<'a> MessageWriter<'a> {
    /// A writer over `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than the 16-byte header; see [`try_new`](Self::try_new).
    pub fn new(buf: &'a mut [u8], kind: CommandType) -> Self {
        match Self::try_new(buf, kind) {
            Ok(w) => w,
            Err(e) => panic!("MessageWriter::new: {e}"),
        }
    }

    /// A writer over `buf`, or [`EncodeError::BufferTooSmall`] if `buf` cannot hold the header.
    pub fn try_new(buf: &'a mut [u8], kind: CommandType) -> Result<Self, EncodeError> {
        if buf.len() < CONTROL_HEADER_LEN {
            return Err(EncodeError::BufferTooSmall { needed: CONTROL_HEADER_LEN, available: buf.len() });
        }
        let cap = (buf.len() - CONTROL_HEADER_LEN).min(MAX_PAYLOAD);
        Ok(MessageWriter { buf, kind, cap, len: 0, count: 0, repeat: None })
    }

    /// Appends one entry and counts it. Fails, leaving the message unchanged,
    /// if the entry is not sendable ([`Entry::check`]), if it does not fit, or
    /// if it would be entry number 4097 (except RAM_BLOCKS_RESULT, whose
    /// repeat does not count entries).
    pub fn push<E: Entry>(&mut self, e: &E) -> Result<(), EncodeError> {
        e.check()?;
        if self.kind != CommandType::RamBlocksResult && self.count >= MAX_REPEAT {
            return Err(EncodeError::TooManyEntries { max: MAX_REPEAT });
        }
        let start = self.reserve(E::SIZE)?;
        e.encode(&mut self.buf[start..start + E::SIZE]);
        self.count = self.count.saturating_add(1);
        Ok(())
    }

    /// Appends raw payload bytes (QEMU_FILE data); does not count as an entry.
    /// Fails, leaving the message unchanged, if they do not fit.
    pub fn push_bytes(&mut self, b: &[u8]) -> Result<(), EncodeError> {
        let start = self.reserve(b.len())?;
        self.buf[start..start + b.len()].copy_from_slice(b);
        Ok(())
    }

    /// Sets the header's repeat explicitly, e.g. UNREGISTER_FINISHED echoing
    /// the request's repeat. No check: values above 4096 are written as given.
    pub fn with_repeat(mut self, r: u32) -> Self {
        self.set_repeat(r);
        self
    }

    /// As [`with_repeat`](Self::with_repeat), through a reference.
    pub fn set_repeat(&mut self, r: u32) {
        self.repeat = Some(r);
    }

    /// Payload bytes still available.
    pub fn remaining(&self) -> usize {
        self.cap - self.len
    }

    /// Payload bytes written so far.
    pub fn payload_len(&self) -> usize {
        self.len
    }

    /// Entries pushed so far.
    pub fn entry_count(&self) -> u32 {
        self.count
    }

    /// The message type.
    pub fn kind(&self) -> CommandType {
        self.kind
    }

    /// Writes the header and returns the number of bytes to send (16 + len).
    pub fn finish(self) -> usize {
        let repeat = self.repeat.unwrap_or(match self.kind {
            CommandType::QemuFile => 0,
            CommandType::RamBlocksResult => 1,
            _ if self.count == 0 => 1,
            _ => self.count,
        });
        let h = ControlHeader { len: self.len as u32, kind: self.kind, repeat };
        let mut hdr = [0u8; CONTROL_HEADER_LEN];
        encode_header(&h, &mut hdr);
        self.buf[..CONTROL_HEADER_LEN].copy_from_slice(&hdr);
        CONTROL_HEADER_LEN + self.len
    }

    /// Reserves `n` payload bytes and returns their start index in `buf`.
    fn reserve(&mut self, n: usize) -> Result<usize, EncodeError> {
        if n > self.remaining() {
            return Err(EncodeError::PayloadFull { needed: n, available: self.remaining() });
        }
        let start = CONTROL_HEADER_LEN + self.len;
        self.len += n;
        Ok(start)
    }
}
