//! QEMU RDMA migration protocol v1 codec: pure functions over byte slices.
//!
//! No I/O and no allocation on the hot path; every input is validated and every
//! rejection is a typed [`DecodeError`] (the decoders never panic, see the fuzz
//! targets in `fuzz/`). All integers are big-endian on the wire. Padding is
//! written as zero and ignored when read (QEMU leaves entry padding as stack garbage).
//!
//! * [`Capabilities`]: the 8-byte rdma_cm private data.
//! * [`ControlHeader`], [`encode_header`], [`decode_header`]: the 16-byte control header.
//! * [`Entry`] and its implementations: fixed-size payload entries.
//! * [`decode_message`] / [`Message`]: a validated received message.
//! * [`MessageWriter`]: builds a message in a send buffer.
//!
//! Layouts follow the protocol fact sheet (`qemu-rdma-protocol.md` §1.4, §2, §3).
//! rdmamig's extensions, used only between peers that negotiated
//! [`CAP_RDMAMIG_EXT`]: [`BlockSpec`] entries in RAM_BLOCKS_REQUEST (len =
//! repeat × 256; each entry: block length as a big-endian u64, then the
//! NUL-padded name), and the completion handshake END ([`EndSummary`]) /
//! END_ACK (types 0x80000001 and 0x80000002); with [`CAP_RDMAMIG_AUTH`] also
//! the nonces and proofs of peer authentication ([`ConnectData`],
//! [`AcceptData`], AUTH = 0x80000003 with one [`AuthProof`]); post-copy:
//! POSTCOPY = 0x80000008 ([`PostcopyBlock`] entries; the destination reads
//! each block's table, its stale bitmap and [`PostcopyRegion`]s, from the
//! source, [`postcopy_table`]) answered by
//! POSTCOPY_DONE = 0x80000005 ([`PostcopySummary`]),
//! after POSTCOPY_FAULT_QP = 0x80000006 and its result 0x80000007 (one
//! [`QpEndpoint`] each) set up the queue pair for fault reads, and
//! POSTCOPY_RECOVERY = 0x80000009 ([`PostcopyRecovery`]) named the source's
//! recovery listener; on a recovery connection (its request carries
//! [`CAP_RDMAMIG_RESUME`] and the token) POSTCOPY_RESUME = 0x8000000A,
//! empty, is answered by POSTCOPY_DONE.

mod big_endian;
mod constants;
mod entry;
mod error;
mod header;
mod message;

#[cfg(test)]
mod tests;

pub use constants::{
    AUTH_NONCE_LEN, AUTH_PROOF_LEN, BLOCK_SPEC_LEN, CAP_PIN_ALL, CAP_RDMAMIG_AUTH, CAP_RDMAMIG_EXT,
    CAP_RDMAMIG_RECOVERY, CAP_RDMAMIG_RESUME, CHUNK_SHIFT, CHUNK_SIZE, CONTROL_BUFFER_SIZE, CONTROL_HEADER_LEN,
    CONTROL_TAG_LEN, KNOWN_CAPS, MAX_PAYLOAD, MAX_REPEAT, POSTCOPY_MAX_REGIONS, PROTOCOL_VERSION, RECOVERY_TAG_LEN,
    RECOVERY_TOKEN_LEN, REJECT_PIN_REFUSED, SEND_INCREMENT,
};
pub use entry::{
    AuthProof, BlockSpec, Compress, DestBlock, EndSummary, Entry, PostcopyBlock, PostcopyRecovery, PostcopyRegion,
    PostcopySummary, QpEndpoint, RegisterRequest, RegisterResult,
};
pub use error::{DecodeError, EncodeError};
pub use header::{
    decode_header, encode_header, AcceptData, AuthChallenge, Capabilities, CommandType, ConnectData, ControlHeader,
    RejectData,
};
pub use message::{
    decode_message, postcopy_bitmap_words, postcopy_table, postcopy_table_len, Entries, Message, MessageWriter,
    POSTCOPY_PAGE_SIZE,
};
