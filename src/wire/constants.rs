//! The protocol's numbers: sizes, limits, the version, capability bits and
//! reject causes.

/// Size of the control header.
pub const CONTROL_HEADER_LEN: usize = 16;
/// Size of each control buffer and of each posted receive (512 KiB).
pub const CONTROL_BUFFER_SIZE: usize = 524288;
/// Largest payload: a control buffer minus the header.
pub const MAX_PAYLOAD: usize = CONTROL_BUFFER_SIZE - CONTROL_HEADER_LEN;
/// Largest `repeat` (commands per message).
pub const MAX_REPEAT: u32 = 4096;
/// Most [`PostcopyRegion`](super::PostcopyRegion)s of one POSTCOPY, all
/// blocks together (what a destination allocates for the tables is bounded
/// by its own RAM's bitmaps and this).
pub const POSTCOPY_MAX_REGIONS: u32 = 4096;
/// log2 of the registration chunk size.
pub const CHUNK_SHIFT: u32 = 20;
/// Registration chunk size (1 MiB).
pub const CHUNK_SIZE: u64 = 1 << CHUNK_SHIFT;
/// Largest QEMU_FILE payload QEMU sends per message.
pub const SEND_INCREMENT: usize = 32768;
/// The protocol version spoken (and the only one accepted by QEMU).
pub const PROTOCOL_VERSION: u32 = 1;
/// Capability: the destination pins (registers) all RAM up front.
pub const CAP_PIN_ALL: u32 = 0x1;
/// Capability: rdmamig-only extensions (block names and lengths in RAM_BLOCKS_REQUEST).
/// QEMU masks it away, so it is only ever set between two rdmamig peers.
pub const CAP_RDMAMIG_EXT: u32 = 0x8000_0000;
/// Capability (rdmamig extension, only with [`CAP_RDMAMIG_EXT`]): peer
/// authentication with a pre-shared key. A source that offers it appends an
/// [`AUTH_NONCE_LEN`]-byte nonce to its capabilities
/// ([`ConnectData`](super::ConnectData)); a destination that grants it
/// appends its own nonce and its proof ([`AcceptData`](super::AcceptData)),
/// and the source's first message is AUTH with its proof.
pub const CAP_RDMAMIG_AUTH: u32 = 0x4000_0000;
/// Capability (rdmamig extension, only with [`CAP_RDMAMIG_EXT`]): set by a
/// destination that reconnects to its source's recovery listener after the
/// post-copy link was lost; a nonce and a [`RECOVERY_TAG_LEN`]-byte tag
/// follow the capabilities ([`ConnectData`](super::ConnectData)): the proof
/// that the request knows the recovery token (the one the source sent in
/// POSTCOPY_RECOVERY) and, with a pre-shared key, the lost connection's
/// session key.
/// The source's recovery listener grants it; a destination's listener never
/// does (it masks it away).
pub const CAP_RDMAMIG_RESUME: u32 = 0x2000_0000;
/// Capability (rdmamig extension, only with [`CAP_RDMAMIG_EXT`]): post-copy
/// recovery, offered by a source and granted by a destination that both
/// have it on (`Config::postcopy_recovery`). Only then does the source
/// listen for a recovery connection and send POSTCOPY_RECOVERY, which a
/// destination that did not grant it refuses.
pub const CAP_RDMAMIG_RECOVERY: u32 = 0x1000_0000;
/// Reject cause (rdmamig extension, [`RejectData`](super::RejectData)): the
/// destination's kernel refused to pin memory for the connection
/// (RLIMIT_MEMLOCK without CAP_IPC_LOCK, or no memory it can pin).
pub const REJECT_PIN_REFUSED: u32 = 1;
/// Every capability bit rdmamig understands.
pub const KNOWN_CAPS: u32 =
    CAP_PIN_ALL | CAP_RDMAMIG_EXT | CAP_RDMAMIG_AUTH | CAP_RDMAMIG_RESUME | CAP_RDMAMIG_RECOVERY;
/// Size of a post-copy recovery token.
pub const RECOVERY_TOKEN_LEN: usize = 16;
/// Size of a recovery connection request's tag
/// ([`ConnectData`](super::ConnectData)).
pub const RECOVERY_TAG_LEN: usize = 16;
/// Size of the tag after each control message of an authenticated
/// connection (rdmamig extension: a truncated HMAC-SHA-256).
pub const CONTROL_TAG_LEN: usize = 16;
/// Size of an authentication nonce.
pub const AUTH_NONCE_LEN: usize = 32;
/// Size of an authentication proof (an HMAC-SHA-256 tag).
pub const AUTH_PROOF_LEN: usize = 32;
/// Size of a [`BlockSpec`](super::BlockSpec) entry.
pub const BLOCK_SPEC_LEN: usize = 256;

const _: () = assert!(MAX_PAYLOAD == 524272);
const _: () = assert!(CHUNK_SIZE == 1 << 20);
