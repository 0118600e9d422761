//! What each work request is, as its id says. The ids never travel on the
//! wire: they tell a completion which part of the link it belongs to.

/// Receive slots. `INCOMING` takes READY on the source and every message on the
/// destination; `RESPONSE` takes the answer to a request.
pub(super) const INCOMING: usize = 0;
pub(super) const RESPONSE: usize = 1;

const ID_CONTROL_SEND: u64 = 2000;
const ID_PROBE: u64 = 3000;
const ID_RECV: [u64; 2] = [4000, 4001];
/// RDMA WRITE ids carry this bit plus the write's sequence number.
const WRITE_BIT: u64 = 1 << 63;
/// RDMA READ ids (post-copy) carry this bit plus the reader's tag.
const READ_BIT: u64 = 1 << 62;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Work {
    /// The control channel's SEND.
    ControlSend,
    /// The liveness probe, a zero-length RDMA WRITE.
    Probe,
    /// A control RECV, in its slot.
    Recv(usize),
    /// An RDMA WRITE by sequence number (a fence is a zero-length one).
    Write(u64),
    /// An RDMA READ by its reader's tag (below bit 62).
    Read(u64),
}

impl Work {
    pub(super) fn id(self) -> u64 {
        match self {
            Work::ControlSend => ID_CONTROL_SEND,
            Work::Probe => ID_PROBE,
            Work::Recv(slot) => ID_RECV[slot],
            Work::Write(seq) => WRITE_BIT | seq,
            Work::Read(tag) => {
                debug_assert!(tag & (WRITE_BIT | READ_BIT) == 0);
                READ_BIT | tag
            }
        }
    }

    /// The work request of `id`; `None` for an id this link never posts.
    pub(super) fn of(id: u64) -> Option<Work> {
        Some(match id {
            ID_CONTROL_SEND => Work::ControlSend,
            ID_PROBE => Work::Probe,
            _ if id & WRITE_BIT != 0 => Work::Write(id & !WRITE_BIT),
            _ if id & READ_BIT != 0 => Work::Read(id & !READ_BIT),
            _ => Work::Recv(ID_RECV.iter().position(|&r| r == id)?),
        })
    }

    /// How a failure names it.
    pub(super) fn name(self) -> String {
        match self {
            Work::ControlSend => "control SEND".into(),
            Work::Probe => "probe".into(),
            Work::Recv(_) => "control RECV".into(),
            Work::Write(seq) => format!("RDMA WRITE #{seq}"),
            Work::Read(tag) => format!("RDMA READ (post-copy) {tag:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_work() {
        for work in [
            Work::ControlSend,
            Work::Probe,
            Work::Recv(INCOMING),
            Work::Recv(RESPONSE),
            Work::Write(1),
            Work::Write(u32::MAX as u64 + 7),
            Work::Read(0),
            Work::Read(0x7f_0000),
        ] {
            assert_eq!(Work::of(work.id()), Some(work), "{work:?}");
        }
        assert_eq!(Work::of(0), None);
        assert_eq!(Work::of(4002), None);
    }
}
