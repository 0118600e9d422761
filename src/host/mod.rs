//! What touches this host's kernel and memory, for the engine: guest memory
//! and the pages behind it (pagemap, populated runs, zero scans, whether a
//! pin would copy), page buffers, the memlock and cgroup limits, userfaultfd,
//! eventfds and epoll. The engine above holds safe types only.

pub(crate) mod guest;
pub(crate) mod limits;
pub(crate) mod page_buffer;
pub(crate) mod pagemap;
pub(crate) mod populated;
pub(crate) mod readiness;
pub(crate) mod sharing;
pub(crate) mod uffd;
pub(crate) mod wake;
pub(crate) mod zero;

pub use guest::GuestRange;
pub(crate) use page_buffer::RegisteredBuffer;
