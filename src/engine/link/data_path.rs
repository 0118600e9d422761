//! The link's data path: RDMA WRITEs gathered and posted in order, what is
//! known complete of them, RDMA READs and their completions, and post-copy's
//! fault queue pair. Waiting is the link's: this part posts and records.

use std::sync::Arc;

use super::work::Work;
use crate::verbs::{QueuePair, Sge, WriteList};
use crate::Result;

/// Writes gathered into one `ibv_post_send` at most, and their bytes: what
/// saves a system call per write on rxe is batching small ones (a final
/// round of scattered 4 KiB pages); large ones go out at once.
const WRITE_LIST_WRS: usize = 16;
const WRITE_LIST_BYTES: u64 = 256 << 10;

#[derive(Default)]
pub(super) struct DataPath {
    /// Sequence number of the last write handed to `post_write` (posted or
    /// still gathered in `gathered`).
    posted: u64,
    /// Every write up to this sequence number is known complete.
    completed: u64,
    /// Writes gathered for one `ibv_post_send`: posted once full, and before
    /// anything else is posted or waited for, so that posting order (which
    /// `send_fence` and `fence` rely on) is the order of the calls.
    gathered: WriteList,
    /// Writes posted before the control SEND in flight: its completion
    /// proves them complete (send-queue completions are in order).
    send_fence: u64,
    /// Tags of RDMA READs completed and not yet taken.
    reads_done: Vec<u64>,
    /// Post-copy's second QP, for fault reads (`fault_qp`).
    fault_qp: Option<Arc<QueuePair>>,
}

impl DataPath {
    /// Gathers an RDMA WRITE for `qp` and returns its sequence number; posts
    /// the gathered ones once there are `WRITE_LIST_WRS` or
    /// `WRITE_LIST_BYTES` of them.
    pub(super) fn post_write(
        &mut self,
        qp: &QueuePair,
        sge: Sge,
        remote_addr: u64,
        rkey: u32,
        signaled: bool,
    ) -> Result<u64> {
        let seq = self.posted + 1;
        self.gathered.push(Work::Write(seq).id(), sge, remote_addr, rkey, signaled);
        self.posted = seq;
        if self.gathered.len() >= WRITE_LIST_WRS || self.gathered.bytes() >= WRITE_LIST_BYTES {
            self.flush(qp)?;
        }
        Ok(seq)
    }

    /// Posts the gathered writes on `qp`.
    pub(super) fn flush(&mut self, qp: &QueuePair) -> Result<()> {
        qp.post_writes(&mut self.gathered)?;
        Ok(())
    }

    /// Posts a signalled zero-length write behind every write so far on
    /// `qp`, unless they are known complete; its sequence number, whose
    /// completion proves them all complete.
    pub(super) fn post_fence(&mut self, qp: &QueuePair) -> Result<Option<u64>> {
        if self.completed >= self.posted {
            return Ok(None);
        }
        self.flush(qp)?;
        let seq = self.posted + 1;
        qp.post_zero_write(Work::Write(seq).id(), true)?;
        self.posted = seq;
        Ok(Some(seq))
    }

    /// Posts a signalled RDMA READ tagged `tag`: a `fault` read on the fault
    /// QP when there is one, any other on `qp`.
    pub(super) fn post_read(
        &mut self,
        qp: &QueuePair,
        tag: u64,
        sge: Sge,
        remote_addr: u64,
        rkey: u32,
        fault: bool,
    ) -> Result<()> {
        self.flush(qp)?;
        let qp = if fault { self.fault_qp.as_deref().unwrap_or(qp) } else { qp };
        qp.post_read(Work::Read(tag).id(), sge, remote_addr, rkey, true)?;
        Ok(())
    }

    /// A control SEND is about to be posted on `qp`: posts the gathered
    /// writes before it, whose completions its own will then prove.
    pub(super) fn before_control_send(&mut self, qp: &QueuePair) -> Result<()> {
        self.flush(qp)?;
        self.send_fence = self.posted;
        Ok(())
    }

    /// A completion on the send queue: every work request before it on the
    /// queue completed too.
    pub(super) fn completed(&mut self, work: Work) {
        match work {
            Work::Write(seq) => self.completed = self.completed.max(seq),
            Work::ControlSend => self.completed = self.completed.max(self.send_fence),
            Work::Read(tag) => self.reads_done.push(tag),
            Work::Probe | Work::Recv(_) => {}
        }
    }

    /// Every write up to this sequence number is known complete.
    pub(super) fn writes_completed(&self) -> u64 {
        self.completed
    }

    /// Moves the tags of the READs completed since the last call into `out`.
    pub(super) fn take_reads(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.reads_done);
    }

    pub(super) fn has_reads_done(&self) -> bool {
        !self.reads_done.is_empty()
    }

    pub(super) fn fault_qp(&self) -> Option<&Arc<QueuePair>> {
        self.fault_qp.as_ref()
    }

    pub(super) fn set_fault_qp(&mut self, qp: Option<Arc<QueuePair>>) {
        self.fault_qp = qp;
    }
}
