//! Fixed-size payload entries (fact sheet §3), plus the rdmamig block-spec extension.

use super::big_endian::{be32, be64};
use super::error::{DecodeError, EncodeError};
use super::{AUTH_PROOF_LEN, BLOCK_SPEC_LEN, RECOVERY_TOKEN_LEN};

/// A fixed-size payload entry.
///
/// `encode` writes exactly `SIZE` bytes into `out[..SIZE]`, padding as zero;
/// it panics if `out` is shorter than `SIZE` (the [`MessageWriter`](super::MessageWriter)
/// always passes the right size). `decode` reads `b[..SIZE]` (longer input is
/// fine, shorter is [`DecodeError::TooShort`]) and ignores padding, which QEMU
/// may leave as stack garbage.
pub trait Entry: Sized {
    /// Encoded size in bytes.
    const SIZE: usize;

    /// Writes the entry into `out[..Self::SIZE]`.
    fn encode(&self, out: &mut [u8]);

    /// Reads an entry from `b[..Self::SIZE]`.
    fn decode(b: &[u8]) -> Result<Self, DecodeError>;

    /// Whether this value may be sent. [`MessageWriter::push`](super::MessageWriter::push)
    /// calls it before encoding; the default accepts everything.
    fn check(&self) -> Result<(), EncodeError> {
        Ok(())
    }
}

pub(super) fn need(what: &'static str, size: usize, b: &[u8]) -> Result<(), DecodeError> {
    if b.len() < size {
        Err(DecodeError::TooShort { what, needed: size, got: b.len() })
    } else {
        Ok(())
    }
}

fn put32(out: &mut [u8], off: usize, v: u32) {
    out[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

fn put64(out: &mut [u8], off: usize, v: u64) {
    out[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

/// RDMARegister: a REGISTER_REQUEST or UNREGISTER_REQUEST entry (24 bytes).
///
/// `key` is an address in the destination's ram_addr_t space (REGISTER) or a
/// chunk index (UNREGISTER); `chunks` counts *additional* chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RegisterRequest {
    pub key: u64,
    pub block_index: u32,
    pub chunks: u64,
}

impl Entry for RegisterRequest {
    const SIZE: usize = 24;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put64(out, 0, self.key);
        put32(out, 8, self.block_index);
        put32(out, 12, 0);
        put64(out, 16, self.chunks);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("RegisterRequest entry", Self::SIZE, b)?;
        Ok(RegisterRequest { key: be64(b, 0), block_index: be32(b, 8), chunks: be64(b, 16) })
    }
}

/// RDMARegisterResult: a REGISTER_RESULT entry (16 bytes). `host_addr` is the
/// destination's block base virtual address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RegisterResult {
    pub rkey: u32,
    pub host_addr: u64,
}

impl Entry for RegisterResult {
    const SIZE: usize = 16;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put32(out, 0, self.rkey);
        put32(out, 4, 0);
        put64(out, 8, self.host_addr);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("RegisterResult entry", Self::SIZE, b)?;
        Ok(RegisterResult { rkey: be32(b, 0), host_addr: be64(b, 8) })
    }
}

/// RDMADestBlock: a RAM_BLOCKS_RESULT entry (32 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DestBlock {
    pub remote_host_addr: u64,
    pub offset: u64,
    pub length: u64,
    pub remote_rkey: u32,
}

impl Entry for DestBlock {
    const SIZE: usize = 32;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put64(out, 0, self.remote_host_addr);
        put64(out, 8, self.offset);
        put64(out, 16, self.length);
        put32(out, 24, self.remote_rkey);
        put32(out, 28, 0);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("DestBlock entry", Self::SIZE, b)?;
        Ok(DestBlock {
            remote_host_addr: be64(b, 0),
            offset: be64(b, 8),
            length: be64(b, 16),
            remote_rkey: be32(b, 24),
        })
    }
}

/// RDMACompress: a COMPRESS entry (24 bytes): zero `length` bytes at `offset`
/// (destination ram_addr_t space) of block `block_index`.
///
/// `value` must be 0: `decode` rejects anything else, and so does
/// [`check`](Entry::check) (hence `MessageWriter::push`); `encode` writes it as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Compress {
    pub value: u32,
    pub block_index: u32,
    pub offset: u64,
    pub length: u64,
}

impl Entry for Compress {
    const SIZE: usize = 24;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put32(out, 0, self.value);
        put32(out, 4, self.block_index);
        put64(out, 8, self.offset);
        put64(out, 16, self.length);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("Compress entry", Self::SIZE, b)?;
        let value = be32(b, 0);
        if value != 0 {
            return Err(DecodeError::CompressNonZeroValue { value });
        }
        Ok(Compress { value, block_index: be32(b, 4), offset: be64(b, 8), length: be64(b, 16) })
    }

    fn check(&self) -> Result<(), EncodeError> {
        if self.value != 0 {
            return Err(EncodeError::CompressNonZeroValue { value: self.value });
        }
        Ok(())
    }
}

/// rdmamig extension: a RAM_BLOCKS_REQUEST entry describing one source block
/// (256 bytes: at offset 0 the block length as a big-endian u64, at 8..256 the
/// UTF-8 name, then NUL padding).
///
/// A valid name is 1..=[`MAX_NAME_LEN`](Self::MAX_NAME_LEN) (247) bytes with no
/// NUL, so the encoding always holds a terminator. Build one with
/// [`BlockSpec::new`]. The fields are public, so an invalid name can still be
/// constructed directly: [`check`](Entry::check) (hence `MessageWriter::push`)
/// rejects it, and a direct `encode` does not panic but writes the name cut at
/// its first NUL or at the last character boundary within 247 bytes.
///
/// `decode` takes the length, then the name bytes before the first NUL (the
/// rest is ignored); they must be non-empty UTF-8, and a NUL must occur within
/// the 248 name bytes. Any length is accepted; comparing it with the local
/// block is the receiver's business.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockSpec {
    /// Length of the block in bytes.
    pub length: u64,
    /// The block's name (QEMU's RAMBlock idstr).
    pub name: String,
}

impl BlockSpec {
    /// Offset of the name in the entry.
    const NAME_OFFSET: usize = 8;

    /// Longest valid name in bytes (one byte is kept for the NUL terminator).
    pub const MAX_NAME_LEN: usize = BLOCK_SPEC_LEN - Self::NAME_OFFSET - 1;

    /// A block spec, if `name` is 1..=247 bytes without NUL.
    pub fn new(name: &str, length: u64) -> Result<Self, EncodeError> {
        Self::validate(name)?;
        Ok(BlockSpec { length, name: name.to_owned() })
    }

    fn validate(name: &str) -> Result<(), EncodeError> {
        if name.is_empty() {
            return Err(EncodeError::EmptyBlockName);
        }
        if name.len() > Self::MAX_NAME_LEN {
            return Err(EncodeError::BlockNameTooLong { len: name.len(), max: Self::MAX_NAME_LEN });
        }
        if let Some(at) = name.bytes().position(|c| c == 0) {
            return Err(EncodeError::BlockNameContainsNul { at });
        }
        Ok(())
    }
}

impl Entry for BlockSpec {
    const SIZE: usize = BLOCK_SPEC_LEN;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put64(out, 0, self.length);
        let s = self.name.as_str();
        let mut n = s.bytes().position(|c| c == 0).unwrap_or(s.len()).min(Self::MAX_NAME_LEN);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        let name = &mut out[Self::NAME_OFFSET..];
        name[..n].copy_from_slice(&s.as_bytes()[..n]);
        name[n..].fill(0);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("BlockSpec entry", Self::SIZE, b)?;
        let name = &b[Self::NAME_OFFSET..Self::SIZE];
        let n = name.iter().position(|&c| c == 0).ok_or(DecodeError::UnterminatedBlockName)?;
        if n == 0 {
            return Err(DecodeError::EmptyBlockName);
        }
        match std::str::from_utf8(&name[..n]) {
            Ok(s) => Ok(BlockSpec { length: be64(b, 0), name: s.to_owned() }),
            Err(e) => Err(DecodeError::BlockNameNotUtf8 { valid_up_to: e.valid_up_to() }),
        }
    }

    fn check(&self) -> Result<(), EncodeError> {
        Self::validate(&self.name)
    }
}

/// The payload of END (rdmamig extension, 16 bytes): what the source sent in
/// the whole migration, so that the destination can check it received all of
/// it before acknowledging.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct EndSummary {
    /// Device-state stream bytes (the QEMU_FILE payloads, added up).
    pub stream_bytes: u64,
    /// Iteration windows closed (REGISTER_FINISHED messages).
    pub windows: u64,
}

impl Entry for EndSummary {
    const SIZE: usize = 16;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put64(out, 0, self.stream_bytes);
        put64(out, 8, self.windows);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("EndSummary entry", Self::SIZE, b)?;
        Ok(EndSummary { stream_bytes: be64(b, 0), windows: be64(b, 8) })
    }
}

/// rdmamig extension: the payload of AUTH, the source's proof that it holds
/// the pre-shared key (an HMAC-SHA-256 tag over both nonces; see `engine::auth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AuthProof {
    pub tag: [u8; AUTH_PROOF_LEN],
}

impl Entry for AuthProof {
    const SIZE: usize = AUTH_PROOF_LEN;

    fn encode(&self, out: &mut [u8]) {
        out[..Self::SIZE].copy_from_slice(&self.tag);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("AuthProof entry", Self::SIZE, b)?;
        let mut tag = [0u8; AUTH_PROOF_LEN];
        tag.copy_from_slice(&b[..Self::SIZE]);
        Ok(AuthProof { tag })
    }
}

/// rdmamig extension: one block of a POSTCOPY message (40 bytes): the
/// block, its length, how many of its pages are stale, and where the
/// destination reads the block's table (`table_addr`, read key `table_rkey`):
/// its stale bitmap, then its `regions` [`PostcopyRegion`] entries, which say
/// where the stale pages can be read (see
/// [`postcopy_table`](super::postcopy_table)). The last 4 bytes are
/// reserved: zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PostcopyBlock {
    /// The block's index in the source's order (RAM_BLOCKS_REQUEST).
    pub block_index: u32,
    pub regions: u32,
    pub length: u64,
    /// The set bits of its bitmap.
    pub stale_pages: u64,
    pub table_addr: u64,
    pub table_rkey: u32,
}

impl Entry for PostcopyBlock {
    const SIZE: usize = 40;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put32(out, 0, self.block_index);
        put32(out, 4, self.regions);
        put64(out, 8, self.length);
        put64(out, 16, self.stale_pages);
        put64(out, 24, self.table_addr);
        put32(out, 32, self.table_rkey);
        put32(out, 36, 0);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("PostcopyBlock entry", Self::SIZE, b)?;
        reserved_zero(be32(b, 36))?;
        Ok(PostcopyBlock {
            block_index: be32(b, 0),
            regions: be32(b, 4),
            length: be64(b, 8),
            stale_pages: be64(b, 16),
            table_addr: be64(b, 24),
            table_rkey: be32(b, 32),
        })
    }
}

/// rdmamig extension: a part of a post-copy block the source registered for
/// remote read (32 bytes): `length` bytes at `offset` in the block, read at
/// `remote_addr` with `rkey`. The last 4 bytes are reserved: zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PostcopyRegion {
    pub offset: u64,
    pub length: u64,
    pub remote_addr: u64,
    pub rkey: u32,
}

impl Entry for PostcopyRegion {
    const SIZE: usize = 32;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put64(out, 0, self.offset);
        put64(out, 8, self.length);
        put64(out, 16, self.remote_addr);
        put32(out, 24, self.rkey);
        put32(out, 28, 0);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("PostcopyRegion entry", Self::SIZE, b)?;
        reserved_zero(be32(b, 28))?;
        Ok(PostcopyRegion { offset: be64(b, 0), length: be64(b, 8), remote_addr: be64(b, 16), rkey: be32(b, 24) })
    }
}

/// Reserved bytes of an rdmamig entry: zero, so that a later version may use them.
fn reserved_zero(value: u32) -> Result<(), DecodeError> {
    match value {
        0 => Ok(()),
        value => Err(DecodeError::ReservedNotZero { value }),
    }
}

/// rdmamig extension: the payload of POSTCOPY_DONE (24 bytes), what the
/// destination's post-copy did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PostcopySummary {
    /// Stale pages installed (by faults or by the background pull).
    pub pages: u64,
    /// Faults served with a read of their own.
    pub faults: u64,
    /// Bytes read from the source.
    pub bytes: u64,
}

impl Entry for PostcopySummary {
    const SIZE: usize = 24;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put64(out, 0, self.pages);
        put64(out, 8, self.faults);
        put64(out, 16, self.bytes);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("PostcopySummary entry", Self::SIZE, b)?;
        Ok(PostcopySummary { pages: be64(b, 0), faults: be64(b, 8), bytes: be64(b, 16) })
    }
}

/// rdmamig extension: the payload of POSTCOPY_RECOVERY (20 bytes): the port
/// of the source's recovery listener (on the address the destination
/// reaches it at; a big-endian u32 below 65536) and the token a recovery
/// connection must present.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PostcopyRecovery {
    pub port: u16,
    pub token: [u8; RECOVERY_TOKEN_LEN],
}

impl Entry for PostcopyRecovery {
    const SIZE: usize = 4 + RECOVERY_TOKEN_LEN;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put32(out, 0, self.port.into());
        out[4..].copy_from_slice(&self.token);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("PostcopyRecovery entry", Self::SIZE, b)?;
        let port = u16::try_from(be32(b, 0)).map_err(|_| DecodeError::RecoveryPort { port: be32(b, 0) })?;
        if port == 0 {
            return Err(DecodeError::RecoveryPort { port: 0 });
        }
        Ok(PostcopyRecovery { port, token: b[4..Self::SIZE].try_into().expect("token bytes") })
    }
}

/// rdmamig extension: the payload of POSTCOPY_FAULT_QP and its result (8
/// bytes): a queue pair's number and its first packet sequence number, both
/// 24-bit values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct QpEndpoint {
    pub qpn: u32,
    pub psn: u32,
}

impl Entry for QpEndpoint {
    const SIZE: usize = 8;

    fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        put32(out, 0, self.qpn);
        put32(out, 4, self.psn);
    }

    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("QpEndpoint entry", Self::SIZE, b)?;
        let (qpn, psn) = (be32(b, 0), be32(b, 4));
        if qpn >> 24 != 0 || psn >> 24 != 0 {
            return Err(DecodeError::QpEndpointRange { qpn, psn });
        }
        Ok(QpEndpoint { qpn, psn })
    }
}
