//! The post-copy fault queue pair: a second RC QP between the same two
//! devices, on the connection's PD and CQ, that carries only the
//! destination's fault reads. A responder serves the READs of one QP in
//! order, so on the connection's QP a fault's 4 KiB read would wait behind
//! the background pull's 64 KiB reads; on its own QP it does not (the NIC,
//! or rxe, interleaves the two QPs' packets). QEMU's postcopy-preempt
//! channel answers the same problem for TCP.
//!
//! rdma_cm makes one QP per connection, so this one is connected by hand:
//! the source asks with POSTCOPY_FAULT_QP (its QP's number and first PSN),
//! the destination makes and connects its QP and answers with its own, then
//! the source connects its QP. Each side copies the path (port, address
//! vector, MTU, timeouts, READ depths) from the connection's QP. The
//! exchange runs on the authenticated control channel, before POSTCOPY.

use super::connection::Link;
use super::errors::protocol_error;
use crate::verbs::{Access, QpCaps, QueuePair};
use crate::wire::{CommandType, QpEndpoint};
use crate::{Error, ErrorKind, Result};

/// Reads in flight on the fault QP at most (the destination's fault slots
/// are fewer); no receives.
const FAULT_QP_CAPS: QpCaps = QpCaps { max_send_wr: 64, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1 };

/// A random first packet sequence number (24 bits), as rdma_cm picks them.
fn random_psn() -> Result<u32> {
    let mut b = [0u8; 4];
    getrandom::getrandom(&mut b)
        .map_err(|e| Error::new(ErrorKind::Verbs, format!("no random bytes for a packet sequence number: {e}")))?;
    Ok(u32::from_ne_bytes(b) & 0xff_ffff)
}

/// Source side: sets up the fault QP with the destination (a request and
/// its response); the destination may read this side's remote-read MRs
/// through it. Kept until [`close_fault_qp`](Link::close_fault_qp) or the link's end.
pub(crate) fn open_fault_qp(link: &mut Link) -> Result<()> {
    let qp = QueuePair::companion(&link.pd, &link.cq, FAULT_QP_CAPS)?;
    let local = QpEndpoint { qpn: qp.qp_num(), psn: random_psn()? };
    let remote = link.request(
        CommandType::PostcopyFaultQp,
        |w| w.push(&local),
        CommandType::PostcopyFaultQpResult,
        |m| m.entries::<QpEndpoint>().next().expect("decode_message checked one entry").map_err(protocol_error),
    )?;
    qp.connect_like(&link.qp, Access::REMOTE_READ, remote.qpn, remote.psn, local.psn)?;
    link.data.set_fault_qp(Some(qp));
    Ok(())
}

/// Destination side, on the source's POSTCOPY_FAULT_QP: makes and
/// connects this side's fault QP (it only reads) and answers with it.
pub(crate) fn accept_fault_qp(link: &mut Link, remote: QpEndpoint) -> Result<()> {
    if link.data.fault_qp().is_some() {
        return Err(protocol_error("a second POSTCOPY_FAULT_QP"));
    }
    let qp = QueuePair::companion(&link.pd, &link.cq, FAULT_QP_CAPS)?;
    let local = QpEndpoint { qpn: qp.qp_num(), psn: random_psn()? };
    qp.connect_like(&link.qp, Access::empty(), remote.qpn, remote.psn, local.psn)?;
    link.data.set_fault_qp(Some(qp));
    link.respond(CommandType::PostcopyFaultQpResult, |w| w.push(&local))
}

/// Destroys the fault QP (post-copy is over).
pub(crate) fn close_fault_qp(link: &mut Link) {
    link.data.set_fault_qp(None);
}
