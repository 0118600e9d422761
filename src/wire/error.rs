//! Codec errors. Every rejection of received bytes is a [`DecodeError`]
//! naming the offending numbers; every refusal to build a message is an
//! [`EncodeError`]. Neither the decoder nor the writer panics on bad input.

use std::fmt;

use super::CommandType;

/// Why received bytes were rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the structure `what` needs.
    TooShort { what: &'static str, needed: usize, got: usize },
    /// The header's `len` exceeds [`MAX_PAYLOAD`](super::MAX_PAYLOAD).
    TooLong { len: u32, max: usize },
    /// `16 + len` differs from the number of bytes received.
    LengthMismatch { len: u32, received: usize },
    /// The header's type is not a command number (0..=11).
    UnknownType(u32),
    /// Type 0 (NONE) is never sent on the wire.
    NoneType,
    /// `repeat` exceeds [`MAX_REPEAT`](super::MAX_REPEAT).
    TooManyRepeats { kind: CommandType, repeat: u32, max: u32 },
    /// A message type that carries no payload arrived with `len != 0`.
    UnexpectedPayload { kind: CommandType, len: u32 },
    /// An entry message arrived with `repeat == 0`.
    ZeroRepeat { kind: CommandType, len: u32 },
    /// `len != repeat × entry_size`.
    PayloadSizeMismatch { kind: CommandType, len: u32, repeat: u32, entry_size: usize },
    /// `len` is not a multiple of the entry size.
    PayloadNotMultiple { kind: CommandType, len: u32, entry_size: usize },
    /// Iterating entries of `entry_size` bytes left `remaining` bytes over.
    TrailingBytes { entry_size: usize, remaining: usize },
    /// A COMPRESS entry with a fill value other than 0 (QEMU ≥ 8.2 rejects it too).
    CompressNonZeroValue { value: u32 },
    /// A block-spec entry whose name's first byte is NUL.
    EmptyBlockName,
    /// A block-spec entry with no NUL terminator inside its 248 name bytes.
    UnterminatedBlockName,
    /// A block-spec entry whose name is not valid UTF-8; `valid_up_to` bytes of the name were valid.
    BlockNameNotUtf8 { valid_up_to: usize },
    /// An rdmamig entry whose reserved bytes are not zero.
    ReservedNotZero { value: u32 },
    /// A POSTCOPY block whose regions are not page-aligned, sorted, disjoint
    /// parts of it that cover every stale page (`why` says which rule failed).
    PostcopyRegions { block_index: u32, why: &'static str },
    /// A POSTCOPY block whose bitmap does not hold its declared `stale_pages`
    /// (`counted` set bits among its pages), or has bits set past its last page.
    PostcopyBitmap { block_index: u32, declared: u64, counted: u64 },
    /// A [`QpEndpoint`](super::QpEndpoint) whose QP number or PSN does not fit in 24 bits.
    QpEndpointRange { qpn: u32, psn: u32 },
    /// A [`PostcopyRecovery`](super::PostcopyRecovery) whose port is 0 or does not fit in 16 bits.
    RecoveryPort { port: u32 },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DecodeError::*;
        match *self {
            TooShort { what, needed, got } => {
                write!(f, "{what} needs {needed} bytes, got {got}")
            }
            TooLong { len, max } => {
                write!(f, "control message payload length {len} exceeds the maximum {max}")
            }
            LengthMismatch { len, received } => {
                write!(f, "malformed length: header says 16 + {len} bytes but {received} bytes were received")
            }
            UnknownType(t) => write!(f, "unknown control message type {t}"),
            NoneType => write!(f, "control message type 0 (NONE) is never sent"),
            TooManyRepeats { kind, repeat, max } => {
                write!(f, "{kind:?} message with repeat {repeat} exceeds the maximum {max}")
            }
            UnexpectedPayload { kind, len } => {
                write!(f, "{kind:?} message must have no payload, but len is {len}")
            }
            ZeroRepeat { kind, len } => {
                write!(f, "{kind:?} message with repeat 0 (len {len}); at least one entry is required")
            }
            PayloadSizeMismatch { kind, len, repeat, entry_size } => {
                write!(f, "{kind:?} message payload length {len} is not repeat {repeat} x {entry_size} bytes")
            }
            PayloadNotMultiple { kind, len, entry_size } => {
                write!(f, "{kind:?} message payload length {len} is not a multiple of {entry_size} bytes")
            }
            TrailingBytes { entry_size, remaining } => {
                write!(f, "payload leaves {remaining} trailing bytes after entries of {entry_size} bytes")
            }
            CompressNonZeroValue { value } => {
                write!(f, "COMPRESS entry with non-zero fill value {value}")
            }
            EmptyBlockName => write!(f, "empty RAM block name"),
            UnterminatedBlockName => {
                write!(f, "RAM block name is not NUL-terminated within 248 bytes")
            }
            BlockNameNotUtf8 { valid_up_to } => {
                write!(f, "RAM block name is not valid UTF-8 (invalid byte at offset {valid_up_to} of the name)")
            }
            ReservedNotZero { value } => write!(f, "an entry's reserved bytes are {value:#x}, not zero"),
            PostcopyRegions { block_index, why } => write!(f, "POSTCOPY block {block_index}: {why}"),
            PostcopyBitmap { block_index, declared, counted } => write!(
                f,
                "POSTCOPY block {block_index} declares {declared} stale pages, its bitmap holds {counted} \
                 (or bits past the block's end)"
            ),
            RecoveryPort { port } => write!(f, "POSTCOPY_RECOVERY names port {port}, not one of 1..=65535"),
            QpEndpointRange { qpn, psn } => {
                write!(f, "queue pair endpoint {qpn:#x}/{psn:#x}: QP number and PSN are 24-bit values")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a message or entry could not be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// The send buffer cannot hold the 16-byte header.
    BufferTooSmall { needed: usize, available: usize },
    /// The payload would not fit: `needed` more bytes, `available` left
    /// (limited by the buffer and by [`MAX_PAYLOAD`](super::MAX_PAYLOAD)).
    PayloadFull { needed: usize, available: usize },
    /// Pushing another entry would make `repeat` exceed `max`.
    TooManyEntries { max: u32 },
    /// A RAM block name of `len` bytes; the limit is `max` bytes (NUL terminator excluded).
    BlockNameTooLong { len: usize, max: usize },
    /// A RAM block name must not be empty.
    EmptyBlockName,
    /// A RAM block name must not contain NUL (at byte offset `at`).
    BlockNameContainsNul { at: usize },
    /// A COMPRESS entry must have fill value 0 (receivers reject anything else).
    CompressNonZeroValue { value: u32 },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use EncodeError::*;
        match *self {
            BufferTooSmall { needed, available } => {
                write!(f, "send buffer of {available} bytes is smaller than the {needed}-byte header")
            }
            PayloadFull { needed, available } => {
                write!(f, "control message full: {needed} more payload bytes needed, {available} available")
            }
            TooManyEntries { max } => {
                write!(f, "control message already holds the maximum of {max} entries")
            }
            BlockNameTooLong { len, max } => {
                write!(f, "RAM block name of {len} bytes exceeds the maximum of {max} bytes")
            }
            EmptyBlockName => write!(f, "empty RAM block name"),
            BlockNameContainsNul { at } => {
                write!(f, "RAM block name contains a NUL byte at offset {at}")
            }
            CompressNonZeroValue { value } => {
                write!(f, "COMPRESS entry with non-zero fill value {value}")
            }
        }
    }
}

impl std::error::Error for EncodeError {}
