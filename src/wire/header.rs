//! Connection private data (fact sheet §1.4) and the 16-byte control header (§2.1, §2.2).

use super::big_endian::be32;
use super::error::DecodeError;
use super::{
    AUTH_NONCE_LEN, AUTH_PROOF_LEN, CAP_PIN_ALL, CAP_RDMAMIG_AUTH, CAP_RDMAMIG_RESUME, CONTROL_HEADER_LEN,
    PROTOCOL_VERSION, RECOVERY_TAG_LEN,
};

/// Capabilities exchanged as rdma_cm private data: `{version, flags}`, both
/// big-endian u32, 8 bytes, no length field.
///
/// Unknown flag bits are carried unchanged by [`encode`](Self::encode) and
/// [`decode`](Self::decode); masking them with [`KNOWN_CAPS`](super::KNOWN_CAPS)
/// (or QEMU's 0x1) is negotiation, done by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    pub version: u32,
    pub flags: u32,
}

impl Capabilities {
    /// Size of the encoded capabilities.
    pub const LEN: usize = 8;

    /// Version-1 capabilities with the given flags.
    pub const fn v1(flags: u32) -> Self {
        Capabilities { version: PROTOCOL_VERSION, flags }
    }

    /// Whether the PIN_ALL bit is set.
    pub const fn pin_all(&self) -> bool {
        self.flags & CAP_PIN_ALL != 0
    }

    /// The 8 bytes of private data: version then flags, big-endian.
    pub fn encode(&self) -> [u8; 8] {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&self.version.to_be_bytes());
        out[4..].copy_from_slice(&self.flags.to_be_bytes());
        out
    }

    /// Reads the first 8 bytes of `buf`. Longer buffers are accepted: a real
    /// connect request carries the whole 56-byte RDMA_PS_TCP user area.
    /// The version is not checked here.
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        if buf.len() < Self::LEN {
            return Err(DecodeError::TooShort {
                what: "capabilities (private data)",
                needed: Self::LEN,
                got: buf.len(),
            });
        }
        Ok(Capabilities { version: be32(buf, 0), flags: be32(buf, 4) })
    }
}

/// A connect request's private data: the capabilities, then a 32-byte nonce
/// when they offer `CAP_RDMAMIG_AUTH` (rdmamig extension: peer
/// authentication) or `CAP_RDMAMIG_RESUME` (a destination's post-copy
/// recovery connection), then, for the latter, the recovery request's
/// 16-byte tag (its proof of the source's recovery token, see
/// `engine::auth::recovery_tag`): at most 56 bytes, all rdma_cm carries in a
/// request. A QEMU destination reads only the first 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectData {
    pub caps: Capabilities,
    pub nonce: Option<[u8; AUTH_NONCE_LEN]>,
    pub recovery_tag: Option<[u8; RECOVERY_TAG_LEN]>,
}

impl ConnectData {
    /// The encoded bytes (8, 40 with a nonce, 16 more with a recovery tag).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.caps.encode().to_vec();
        out.extend(self.nonce.iter().flatten());
        out.extend(self.recovery_tag.iter().flatten());
        out
    }

    /// The capabilities, the nonce if they offer `CAP_RDMAMIG_AUTH` or
    /// `CAP_RDMAMIG_RESUME` and the recovery tag if they offer the latter
    /// (then the buffer must hold them). Longer buffers are accepted (rdma_cm
    /// pads the private data).
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let caps = Capabilities::decode(buf)?;
        let resume = caps.flags & CAP_RDMAMIG_RESUME != 0;
        let nonce = if resume || caps.flags & CAP_RDMAMIG_AUTH != 0 {
            Some(array(buf, Capabilities::LEN, "nonce (connect private data)")?)
        } else {
            None
        };
        let recovery_tag = if resume {
            Some(array(buf, Capabilities::LEN + AUTH_NONCE_LEN, "recovery tag (connect private data)")?)
        } else {
            None
        };
        Ok(ConnectData { caps, nonce, recovery_tag })
    }
}

/// What a destination that grants `CAP_RDMAMIG_AUTH` sends with its accept:
/// its own nonce and its proof that it holds the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthChallenge {
    pub nonce: [u8; AUTH_NONCE_LEN],
    pub proof: [u8; AUTH_PROOF_LEN],
}

/// rdmamig extension: a destination that grants `CAP_RDMAMIG_EXT` appends its
/// pin budget to the capabilities in its accept private data (bytes 8..16,
/// big-endian u64; 0: none announced), so the source plans its registrations
/// within it; when it grants `CAP_RDMAMIG_AUTH` too, bytes 16..80 hold its
/// [`AuthChallenge`]. A QEMU source, which is never granted the extensions,
/// gets only the 8 bytes of capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptData {
    pub caps: Capabilities,
    /// Bytes the destination lets the source keep registered; `None`: unlimited.
    pub pin_budget: Option<u64>,
    pub auth: Option<AuthChallenge>,
}

impl AcceptData {
    /// Size with the pin budget, without a challenge.
    pub const LEN: usize = Capabilities::LEN + 8;

    /// The encoded bytes (16, or 80 with a challenge).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.caps.encode().to_vec();
        out.extend(self.pin_budget.unwrap_or(0).to_be_bytes());
        if let Some(a) = &self.auth {
            out.extend(a.nonce);
            out.extend(a.proof);
        }
        out
    }

    /// The capabilities, the budget if the buffer is long enough to hold
    /// one, and the challenge if the capabilities grant `CAP_RDMAMIG_AUTH`
    /// (then the buffer must hold it).
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let caps = Capabilities::decode(buf)?;
        let pin_budget = buf
            .get(Capabilities::LEN..Self::LEN)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
            .filter(|&b| b != 0);
        let auth = if caps.flags & CAP_RDMAMIG_AUTH != 0 {
            let nonce = array(buf, Self::LEN, "authentication nonce (accept private data)")?;
            let proof = array(buf, Self::LEN + AUTH_NONCE_LEN, "authentication proof (accept private data)")?;
            Some(AuthChallenge { nonce, proof })
        } else {
            None
        };
        Ok(AcceptData { caps, pin_budget, auth })
    }
}

/// rdmamig extension: the private data of an rdmamig destination's reject.
/// Its capabilities (its own version, and flags saying what it requires),
/// then why it refused: a big-endian u32 at bytes 8..12, one of the
/// `REJECT_*` causes (0, or absent: it does not say). QEMU never reads a
/// reject's private data (and never rejects: it drops a request it does not
/// take); a reject without private data reads as zeros (rdma_cm pads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RejectData {
    pub caps: Capabilities,
    pub cause: u32,
}

impl RejectData {
    /// Size with the cause.
    pub const LEN: usize = Capabilities::LEN + 4;

    /// The 12 encoded bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..Capabilities::LEN].copy_from_slice(&self.caps.encode());
        out[Capabilities::LEN..].copy_from_slice(&self.cause.to_be_bytes());
        out
    }

    /// The capabilities, and the cause if the buffer is long enough to hold one.
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let caps = Capabilities::decode(buf)?;
        let cause = if buf.len() >= Self::LEN { be32(buf, Capabilities::LEN) } else { 0 };
        Ok(RejectData { caps, cause })
    }
}

/// The `N` bytes of `buf` at `at`.
fn array<const N: usize>(buf: &[u8], at: usize, what: &'static str) -> Result<[u8; N], DecodeError> {
    buf.get(at..at + N).map(|b| b.try_into().expect("N bytes")).ok_or(DecodeError::TooShort {
        what,
        needed: at + N,
        got: buf.len(),
    })
}

/// Control message types: the 0-based wire values of QEMU's enum (§2.2).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommandType {
    /// "Expect anything" inside QEMU; never sent. [`decode_message`](super::decode_message) rejects it.
    None = 0,
    Error = 1,
    Ready = 2,
    QemuFile = 3,
    RamBlocksRequest = 4,
    RamBlocksResult = 5,
    Compress = 6,
    RegisterRequest = 7,
    RegisterResult = 8,
    RegisterFinished = 9,
    UnregisterRequest = 10,
    UnregisterFinished = 11,
    /// rdmamig extension (only between peers that negotiated `CAP_RDMAMIG_EXT`):
    /// the source's last message, after its last window and its last stream
    /// byte; carries one [`EndSummary`](super::EndSummary). The high bit keeps
    /// the value clear of any command QEMU may add.
    End = 0x8000_0001,
    /// rdmamig extension: the destination's response to END: it received
    /// everything END counts. Empty.
    EndAck = 0x8000_0002,
    /// rdmamig extension (only when `CAP_RDMAMIG_AUTH` was granted): the
    /// source's first message, its proof of the key; one [`AuthProof`](super::AuthProof).
    Auth = 0x8000_0003,
    /// rdmamig extension: the source's post-copy switch-over, a request
    /// answered by POSTCOPY_DONE. `repeat` [`PostcopyBlock`](super::PostcopyBlock)
    /// entries: where the destination reads each block's table (its
    /// stale-page bitmap and where its stale pages can be read). (0x8000_0004, rdmamig 0.8's POSTCOPY, carried the bitmaps in
    /// the message, which limited post-copy to about 16 GiB of RAM; it is
    /// refused as unknown.)
    Postcopy = 0x8000_0008,
    /// rdmamig extension: the destination's response to POSTCOPY, sent once it
    /// holds every stale page; one [`PostcopySummary`](super::PostcopySummary).
    PostcopyDone = 0x8000_0005,
    /// rdmamig extension: before POSTCOPY, the source's request for a second
    /// queue pair that carries only the destination's fault reads (so that
    /// they do not wait behind background reads on the first); one
    /// [`QpEndpoint`](super::QpEndpoint), the source's new QP.
    PostcopyFaultQp = 0x8000_0006,
    /// rdmamig extension: the destination's response to POSTCOPY_FAULT_QP;
    /// one [`QpEndpoint`](super::QpEndpoint), its new QP, connected already.
    PostcopyFaultQpResult = 0x8000_0007,
    /// rdmamig extension: before POSTCOPY, a source that can take a lost
    /// post-copy link back says where (a message, no response): one
    /// [`PostcopyRecovery`](super::PostcopyRecovery), the port of its
    /// recovery listener and the token a recovery connection must carry.
    PostcopyRecovery = 0x8000_0009,
    /// rdmamig extension: the source's first request on a recovery
    /// connection, answered (like POSTCOPY) by POSTCOPY_DONE. Empty.
    PostcopyResume = 0x8000_000A,
}

impl CommandType {
    /// The wire value.
    pub const fn as_u32(self) -> u32 {
        self as u32
    }
}

impl TryFrom<u32> for CommandType {
    type Error = DecodeError;

    /// Maps 0..=11 and the nine extension values to the command; anything else
    /// is [`DecodeError::UnknownType`].
    fn try_from(v: u32) -> Result<Self, DecodeError> {
        use CommandType::*;
        Ok(match v {
            0 => None,
            1 => Error,
            2 => Ready,
            3 => QemuFile,
            4 => RamBlocksRequest,
            5 => RamBlocksResult,
            6 => Compress,
            7 => RegisterRequest,
            8 => RegisterResult,
            9 => RegisterFinished,
            10 => UnregisterRequest,
            11 => UnregisterFinished,
            0x8000_0001 => End,
            0x8000_0002 => EndAck,
            0x8000_0003 => Auth,
            0x8000_0005 => PostcopyDone,
            0x8000_0006 => PostcopyFaultQp,
            0x8000_0007 => PostcopyFaultQpResult,
            0x8000_0008 => Postcopy,
            0x8000_0009 => PostcopyRecovery,
            0x8000_000A => PostcopyResume,
            other => return Err(DecodeError::UnknownType(other)),
        })
    }
}

impl From<CommandType> for u32 {
    fn from(t: CommandType) -> u32 {
        t as u32
    }
}

/// The control header: `len` (payload bytes, header excluded), type, repeat,
/// all big-endian u32, followed by 4 bytes of padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlHeader {
    pub len: u32,
    pub kind: CommandType,
    pub repeat: u32,
}

/// Writes `h` as 16 bytes; the padding word is written as zero.
pub fn encode_header(h: &ControlHeader, out: &mut [u8; 16]) {
    out[0..4].copy_from_slice(&h.len.to_be_bytes());
    out[4..8].copy_from_slice(&h.kind.as_u32().to_be_bytes());
    out[8..12].copy_from_slice(&h.repeat.to_be_bytes());
    out[12..16].fill(0);
}

/// Parses the first 16 bytes of `b` (longer input is fine; the padding word is
/// ignored). This checks the layout and the type number only: type 0 (NONE)
/// is returned as [`CommandType::None`], and `len`/`repeat` are not checked;
/// [`decode_message`](super::decode_message) does the full validation.
pub fn decode_header(b: &[u8]) -> Result<ControlHeader, DecodeError> {
    if b.len() < CONTROL_HEADER_LEN {
        return Err(DecodeError::TooShort { what: "control header", needed: CONTROL_HEADER_LEN, got: b.len() });
    }
    Ok(ControlHeader { len: be32(b, 0), kind: CommandType::try_from(be32(b, 4))?, repeat: be32(b, 8) })
}
