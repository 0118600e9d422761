//! Post-copy over RDMA READ (rdmamig extension, issue 13): what both roles
//! share (the stale pages, the destination's progress and fetches, what
//! recovery needs). Each role's part lives with the role:
//! `engine::source::postcopy` and `engine::destination::postcopy`.
//!
//! After its last pre-copy window, with the guest stopped, the source calls
//! [`Source::postcopy`](crate::engine::Source::postcopy) with the pages the
//! destination does not have right (dirtied since sent, or never sent). Its
//! transfer thread registers the 2 MiB windows of the blocks that hold stale
//! pages for remote read (regions, `source::postcopy::regions`: registering memory
//! backs every page of it, and a guest's never-touched memory should stay
//! so; within its pin budget, or it refuses), sets up a second queue pair
//! for the destination's fault reads (`link::fault_qp`), registers each
//! block's table (its stale bitmap and regions) for remote read too, sends
//! one POSTCOPY request (where each block's table is, `wire::PostcopyBlock`)
//! and keeps the memory registered, which the caller must keep mapped and
//! unchanged, until the destination's POSTCOPY_DONE (or the connection's
//! end). The tables are read rather than sent: one message holds the bitmap
//! of about 16 GiB of guest RAM, and post-copy is for large guests.
//!
//! The destination's service thread takes the POSTCOPY message and becomes
//! the post-copy thread (`destination::postcopy`): it reads and checks the tables
//! (`destination::postcopy::plan`, `wire::postcopy_table`), then opens a userfaultfd
//! itself, registers the blocks with stale pages in MISSING mode and drops the
//! stale pages (`MADV_REMOVE` from shared memory, `MADV_DONTNEED` from private
//! anonymous memory), so the next touch of one faults. It waits until every
//! registration the source could write into (released to the unregistration
//! worker when POSTCOPY came) is deregistered: from then on no key the
//! source was given opens this side's memory to its writes (the recovery
//! connection, made on the same protection domain, finds none either). Then the
//! hypervisor's [`Destination::wait_postcopy`](crate::engine::Destination::wait_postcopy)
//! returns and its vCPUs may run. The one thread serves faults first (a
//! 4 KiB RDMA READ on the fault QP into a registered staging slot, then
//! `UFFDIO_COPY`, which wakes the faulting threads) and pulls the rest in
//! the background (reads
//! of up to 64 KiB, a few in flight; the windows of recent faults and the
//! ones after them first, then in address order; the `installer` thread
//! installs their pages). `UFFDIO_COPY` never overwrites: a page
//! already present (a fault installed it, or the guest wrote it after its
//! fault) makes it fail with EEXIST, and that page is skipped. When no stale
//! page is left it closes the userfaultfd and answers POSTCOPY_DONE.
//!
//! Why the library registers the userfaultfd: it alone knows the stale set
//! when the message arrives, and a VMM whose own process maps guest RAM
//! (cloud-hypervisor-like, anonymous or memfd; or a test) needs nothing
//! else. Another process mapping the same (shared) memory, a vhost-user
//! backend, has a userfaultfd of its own, which the VMM reads, as QEMU's
//! postcopy arranges: it passes the faults on with
//! [`Destination::postcopy_fetch`](crate::engine::Destination::postcopy_fetch)
//! (`Fetches`: served as faults are) and wakes the backend's thread when
//! that returns. Not supported: hugetlbfs (4 KiB installs), and a VMM
//! handing over its own userfaultfd.
//!
//! Failure: the post-copy thread stops, the connection's error is stored
//! (`Destination::error`, its event fd becomes readable, `wait_postcopy`
//! fails), and it never installs a page it did not read from the source.
//! Then the threads blocked on a stale page are released: the post-copy
//! blocks become PROT_NONE and the waiters are woken, so they (and any later
//! access) get SIGSEGV, which the hypervisor handles by pausing the vCPU
//! (`destination::Blocked`). Closing the userfaultfd instead would let them
//! run on zero-filled pages; SIGBUS through `UFFDIO_POISON` needs Linux 6.6.

mod fetches;
mod link_state;
mod progress;
mod recovery;
mod stale;

pub use crate::wire::PostcopySummary;
pub(crate) use fetches::{Fetch, Fetches};
pub(crate) use link_state::LinkWatch;
pub use link_state::PostcopyLink;
pub(crate) use progress::Progress;
pub use progress::{PostcopyPhase, PostcopyProgress};
pub(crate) use recovery::{recoverable, Recovery};
pub use stale::StalePages;
