//! rdma_cm: event channels, connection ids and their events.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use libc::c_void;

use super::address::{from_sockaddr, to_sockaddr};
use super::{sys, Result, VerbsError};

/// An rdma_cm event channel (`rdma_event_channel`); its fd is non-blocking.
/// Destroyed on drop, which can only happen after every [`CmId`] on it is gone
/// (each holds an `Arc` of its channel).
pub struct EventChannel {
    raw: NonNull<sys::rdma_event_channel>,
}

// SAFETY: librdmacm's calls on a channel are thread-safe (the fd is a kernel
// ucma file with its own locking; rdma_get_cm_event allocates a fresh event).
unsafe impl Send for EventChannel {}
// SAFETY: as for `Send`.
unsafe impl Sync for EventChannel {}

impl std::os::fd::AsFd for EventChannel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the descriptor is the channel's, open while it lives.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd()) }
    }
}

impl EventChannel {
    pub fn new() -> Result<Arc<EventChannel>> {
        // SAFETY: plain constructor.
        let raw = unsafe { sys::rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("rdma_create_event_channel"))?;
        let ch = EventChannel { raw };
        super::fd::set_nonblocking(ch.fd(), "fcntl(rdma_event_channel)")?;
        Ok(Arc::new(ch))
    }

    /// The channel's file descriptor (non-blocking), for an external poll loop.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is alive; fd is immutable after creation.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Whether an event waits to be taken (a poll that does not wait).
    pub fn has_event(&self) -> bool {
        let mut fd = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; no wait.
        unsafe { libc::poll(&mut fd, 1, 0) == 1 }
    }

    pub fn raw(&self) -> *mut sys::rdma_event_channel {
        self.raw.as_ptr()
    }

    /// Waits up to `timeout` (`None` = forever) for the next event:
    /// `poll()` on the fd, then `rdma_get_cm_event`. `Ok(None)` on timeout.
    ///
    /// The event is acknowledged when the returned [`CmEvent`] is dropped;
    /// drop it promptly (destroying the id it is about waits for the ack).
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        let deadline = timeout.map(|t| Instant::now().checked_add(t).unwrap_or_else(far_future));
        loop {
            let mut ev: *mut sys::rdma_cm_event = ptr::null_mut();
            // SAFETY: valid channel and out-pointer; the fd is non-blocking, so
            // this returns EAGAIN instead of blocking when nothing is queued.
            if unsafe { sys::rdma_get_cm_event(self.raw.as_ptr(), &mut ev) } == 0 {
                let ev = NonNull::new(ev).ok_or(VerbsError::new("rdma_get_cm_event", libc::EIO))?;
                // SAFETY: a fresh, unacknowledged event.
                return Ok(Some(unsafe { CmEvent::from_raw(ev) }));
            }
            let e = super::error::last_errno();
            if e != libc::EAGAIN && e != libc::EWOULDBLOCK && e != libc::EINTR {
                return Err(VerbsError::new("rdma_get_cm_event", e));
            }
            if e != libc::EINTR && !super::fd::poll_readable(self.fd(), deadline)? {
                return Ok(None);
            }
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365 * 30)
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel holds an Arc of it, so none is left.
        unsafe { sys::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel").field("fd", &self.fd()).finish()
    }
}

/// The kind of an rdma_cm event (`enum rdma_cm_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    TimewaitExit,
    Other(u32),
}

impl CmEventKind {
    pub fn from_raw(v: u32) -> Self {
        use CmEventKind::*;
        match v {
            sys::RDMA_CM_EVENT_ADDR_RESOLVED => AddrResolved,
            sys::RDMA_CM_EVENT_ADDR_ERROR => AddrError,
            sys::RDMA_CM_EVENT_ROUTE_RESOLVED => RouteResolved,
            sys::RDMA_CM_EVENT_ROUTE_ERROR => RouteError,
            sys::RDMA_CM_EVENT_CONNECT_REQUEST => ConnectRequest,
            sys::RDMA_CM_EVENT_CONNECT_RESPONSE => ConnectResponse,
            sys::RDMA_CM_EVENT_CONNECT_ERROR => ConnectError,
            sys::RDMA_CM_EVENT_UNREACHABLE => Unreachable,
            sys::RDMA_CM_EVENT_REJECTED => Rejected,
            sys::RDMA_CM_EVENT_ESTABLISHED => Established,
            sys::RDMA_CM_EVENT_DISCONNECTED => Disconnected,
            sys::RDMA_CM_EVENT_DEVICE_REMOVAL => DeviceRemoval,
            sys::RDMA_CM_EVENT_TIMEWAIT_EXIT => TimewaitExit,
            other => Other(other),
        }
    }
}

/// One rdma_cm event. Acknowledged (`rdma_ack_cm_event`) on drop.
///
/// The event keeps the [`CmId`] it is about alive (for a connection request:
/// the listening id), so the ack always happens before that id is destroyed
/// (`rdma_destroy_id` blocks until its events are acked).
///
/// A `ConnectRequest` whose new id is not taken with
/// [`take_request_id`](CmEvent::take_request_id) is rejected and its id
/// destroyed when the event is dropped.
pub struct CmEvent {
    raw: NonNull<sys::rdma_cm_event>,
    kind: CmEventKind,
    /// The wrapped id the event is about (listener for ConnectRequest), if
    /// it is still alive.
    about: Option<Arc<CmId>>,
    request_taken: AtomicBool,
}

// SAFETY: the event is plain data owned by us until the ack; acking from
// another thread is allowed (librdmacm locks the id's event counters).
unsafe impl Send for CmEvent {}
// SAFETY: as for `Send`.
unsafe impl Sync for CmEvent {}

impl CmEvent {
    /// # Safety
    /// `raw` is a fresh event from `rdma_get_cm_event`, not yet acknowledged,
    /// on a channel whose ids were all created through this module.
    unsafe fn from_raw(raw: NonNull<sys::rdma_cm_event>) -> CmEvent {
        let ev = raw.as_ptr();
        // SAFETY: a live, unacknowledged event (this function's contract).
        let kind = CmEventKind::from_raw(unsafe { (*ev).event });
        // For a connect request `id` is the new id, whose context librdmacm
        // copied from the listener; the listener is what we hold on to.
        // SAFETY: as above.
        let id = unsafe {
            if kind == CmEventKind::ConnectRequest {
                (*ev).listen_id
            } else {
                (*ev).id
            }
        };
        // SAFETY: the event is unacked, so its id is live, and it was made here.
        let about = if id.is_null() { None } else { unsafe { CmId::upgrade_from_raw(id) } };
        CmEvent { raw, kind, about, request_taken: AtomicBool::new(false) }
    }

    pub fn kind(&self) -> CmEventKind {
        self.kind
    }

    /// The event's `status` (0, or a negative errno / reject reason).
    pub fn status(&self) -> i32 {
        // SAFETY: the event stays valid until it is acked in drop.
        unsafe { (*self.raw.as_ptr()).status }
    }

    /// `param.conn.private_data` (empty if none). For `ConnectRequest`:
    /// the connector's data; for `Established` on the active side: the
    /// acceptor's; for `Rejected`: the rejecter's. On IB/RoCE the kernel
    /// reports the whole CM message's private data area, zero-padded (56
    /// bytes for a request, 196 for an accept, 148 for a reject), so expect
    /// more bytes than the peer sent.
    pub fn private_data(&self) -> &[u8] {
        // SAFETY: librdmacm points private_data into the event's own
        // storage, which lives until the ack (i.e. as long as &self).
        unsafe {
            let conn = &(*self.raw.as_ptr()).param_conn;
            if conn.private_data.is_null() || conn.private_data_len == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(conn.private_data.cast::<u8>(), conn.private_data_len.into())
            }
        }
    }

    /// The id the event is about (for `ConnectRequest`: the new, not yet
    /// wrapped id; compare with [`CmId::raw`]).
    pub fn id_ptr(&self) -> *mut sys::rdma_cm_id {
        // SAFETY: valid until the ack.
        unsafe { (*self.raw.as_ptr()).id }
    }

    /// For `ConnectRequest`: the listening id the request arrived on.
    pub fn listen_id_ptr(&self) -> *mut sys::rdma_cm_id {
        // SAFETY: valid until the ack.
        unsafe { (*self.raw.as_ptr()).listen_id }
    }

    /// The wrapped [`CmId`] this event is about (the listener for
    /// `ConnectRequest`), or `None` if it is already being destroyed.
    pub fn cm_id(&self) -> Option<&Arc<CmId>> {
        self.about.as_ref()
    }

    /// For a `ConnectRequest`: takes ownership of the new connection's id
    /// (destroyed when the returned `CmId` is dropped). Call it once; later
    /// calls and other event kinds return `None`. The new id starts on the
    /// listener's channel; if `channel` is a different one, it is migrated
    /// there (`rdma_migrate_id`).
    pub fn take_request_id(&self, channel: &Arc<EventChannel>) -> Option<Arc<CmId>> {
        if self.kind != CmEventKind::ConnectRequest || self.request_taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        let raw = NonNull::new(self.id_ptr())?;
        // SAFETY: the new id is live and owned by nobody else yet; its
        // channel pointer was set by librdmacm at creation. It is wrapped
        // (its context pointed at its own CmId) before it is migrated, so
        // events about it on the new channel always find the right CmId.
        unsafe {
            let old_channel = (*raw.as_ptr()).channel;
            let id = CmId::wrap(raw, channel.clone());
            if old_channel != channel.raw() && sys::rdma_migrate_id(raw.as_ptr(), channel.raw()) != 0 {
                // Still on the listener's channel, which outlives this
                // (the listener holds it and we hold the listener).
                sys::rdma_reject(raw.as_ptr(), ptr::null(), 0);
                drop(id);
                return None;
            }
            Some(id)
        }
    }

    pub fn raw(&self) -> *mut sys::rdma_cm_event {
        self.raw.as_ptr()
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        let ev = self.raw.as_ptr();
        // SAFETY: the event is unacked until here; after the ack it is freed
        // and not touched again. An untaken request id is ours to dispose of:
        // reject it, then destroy it after the ack.
        unsafe {
            let orphan = if self.kind == CmEventKind::ConnectRequest && !*self.request_taken.get_mut() {
                (*ev).id
            } else {
                ptr::null_mut()
            };
            if !orphan.is_null() {
                sys::rdma_reject(orphan, ptr::null(), 0);
            }
            sys::rdma_ack_cm_event(ev);
            if !orphan.is_null() {
                sys::rdma_destroy_id(orphan);
            }
        }
        // `about` is dropped after this (possibly destroying that id): after the ack.
    }
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("status", &self.status())
            .field("id", &self.id_ptr())
            .field("private_data_len", &self.private_data().len())
            .finish()
    }
}

/// Connection parameters for [`CmId::connect`] / [`CmId::accept`]
/// (`struct rdma_conn_param`; `private_data` at most 255 bytes, and rdma_cm
/// limits it further: 56 bytes for connect, 196 for accept on IB/RoCE).
#[derive(Clone, Copy, Debug, Default)]
pub struct ConnParam<'a> {
    pub private_data: &'a [u8],
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
}

impl ConnParam<'_> {
    fn to_raw(self, op: &'static str) -> Result<sys::rdma_conn_param> {
        let len = u8::try_from(self.private_data.len()).map_err(|_| VerbsError::new(op, libc::EINVAL))?;
        Ok(sys::rdma_conn_param {
            private_data: if len == 0 { ptr::null() } else { self.private_data.as_ptr().cast() },
            private_data_len: len,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: 0, // as QEMU (zero-initialised)
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        })
    }
}

/// An rdma_cm id (`rdma_cm_id`, port space `RDMA_PS_TCP`): a listener or one
/// end of a reliable connection. Destroyed (`rdma_destroy_id`) on drop; any
/// [`QueuePair`](super::QueuePair), PD or CQ made from it holds an `Arc` of it.
pub struct CmId {
    raw: NonNull<sys::rdma_cm_id>,
    channel: Arc<EventChannel>,
    /// `raw->context` points at this (boxed, so its address is stable); it
    /// lets an event find its `CmId` without keeping it alive by itself.
    self_ref: Box<Weak<CmId>>,
    pub(crate) has_qp: AtomicBool,
}

// SAFETY: librdmacm calls on an id are thread-safe: each is a command on the
// kernel ucma file, which serialises per id. `context` is read/written
// atomically (see context_slot).
unsafe impl Send for CmId {}
// SAFETY: as for `Send`.
unsafe impl Sync for CmId {}

impl CmId {
    pub fn new(channel: &Arc<EventChannel>) -> Result<Arc<CmId>> {
        let mut id = ptr::null_mut();
        // SAFETY: valid channel and out-pointer; context is set by wrap().
        let rc = unsafe { sys::rdma_create_id(channel.raw(), &mut id, ptr::null_mut(), sys::RDMA_PS_TCP) };
        if rc != 0 {
            return Err(VerbsError::last("rdma_create_id"));
        }
        let id = NonNull::new(id).ok_or(VerbsError::new("rdma_create_id", libc::EIO))?;
        // SAFETY: a fresh id we own.
        Ok(unsafe { CmId::wrap(id, channel.clone()) })
    }

    /// # Safety
    /// `raw` is a live id, owned by nobody else, on `channel` (or about to be
    /// migrated to it, or destroyed if that fails).
    unsafe fn wrap(raw: NonNull<sys::rdma_cm_id>, channel: Arc<EventChannel>) -> Arc<CmId> {
        let id = Arc::new_cyclic(|weak| CmId {
            raw,
            channel,
            self_ref: Box::new(weak.clone()),
            has_qp: AtomicBool::new(false),
        });
        let ctx = &*id.self_ref as *const Weak<CmId> as *mut c_void;
        // SAFETY: `raw` is live (this function's contract).
        unsafe { Self::context_slot(raw.as_ptr()) }.store(ctx, Ordering::Release);
        id
    }

    /// `id->context` as an atomic (same layout as a pointer): it is written
    /// when an id is wrapped and read by whichever thread gets its events.
    ///
    /// # Safety
    /// `id` is live for `'a`.
    unsafe fn context_slot<'a>(id: *mut sys::rdma_cm_id) -> &'a AtomicPtr<c_void> {
        // SAFETY: a live id's `context` field, a pointer, which has
        // AtomicPtr's layout; only ever accessed through this atomic.
        unsafe { &*(ptr::addr_of_mut!((*id).context) as *const AtomicPtr<c_void>) }
    }

    /// The `CmId` whose `raw` is `id`, if still alive.
    ///
    /// # Safety
    /// `id` is live (an event about it is unacked) and was wrapped by this module.
    unsafe fn upgrade_from_raw(id: *mut sys::rdma_cm_id) -> Option<Arc<CmId>> {
        // SAFETY: `id` is live (this function's contract).
        let ctx = unsafe { Self::context_slot(id) }.load(Ordering::Acquire) as *const Weak<CmId>;
        // SAFETY: null or the box `wrap` stored, which lives until
        // rdma_destroy_id returns, which waits for our ack.
        unsafe { ctx.as_ref() }?.upgrade()
    }

    /// Resolve `dst` to a local device and address; completes with an
    /// `AddrResolved` or `AddrError` event.
    pub fn resolve_addr(&self, dst: &SocketAddr, timeout_ms: i32) -> Result<()> {
        let mut dst = to_sockaddr(dst);
        // SAFETY: valid id and sockaddr (copied by librdmacm).
        let rc =
            unsafe { sys::rdma_resolve_addr(self.raw(), ptr::null_mut(), ptr::addr_of_mut!(dst).cast(), timeout_ms) };
        self.check(rc, "rdma_resolve_addr")
    }

    /// Completes with a `RouteResolved` or `RouteError` event.
    pub fn resolve_route(&self, timeout_ms: i32) -> Result<()> {
        // SAFETY: valid id.
        self.check(unsafe { sys::rdma_resolve_route(self.raw(), timeout_ms) }, "rdma_resolve_route")
    }

    /// `RDMA_OPTION_ID_REUSEADDR` (before bind).
    pub fn set_reuseaddr(&self) -> Result<()> {
        // SAFETY: REUSEADDR takes an int.
        unsafe { self.set_id_option(sys::RDMA_OPTION_ID_REUSEADDR, 1 as libc::c_int, "rdma_set_option(REUSEADDR)") }
    }

    /// `RDMA_OPTION_ID_TOS`: IP ToS / traffic class of this id's connection
    /// (set on the active side before `resolve_route`).
    pub fn set_tos(&self, tos: u8) -> Result<()> {
        // SAFETY: TOS takes a u8.
        unsafe { self.set_id_option(sys::RDMA_OPTION_ID_TOS, tos, "rdma_set_option(TOS)") }
    }

    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's local ACK timeout, 4.096 µs ×
    /// 2^`exponent` (set before `resolve_route` on the active side, before
    /// `accept` on the passive side).
    pub fn set_ack_timeout(&self, exponent: u8) -> Result<()> {
        // SAFETY: ACK_TIMEOUT takes a u8.
        unsafe { self.set_id_option(sys::RDMA_OPTION_ID_ACK_TIMEOUT, exponent, "rdma_set_option(ACK_TIMEOUT)") }
    }

    /// `rdma_set_option(id, RDMA_OPTION_ID, option, &value, sizeof value)`.
    ///
    /// # Safety
    /// `T` is the C type the kernel expects for `option` (it checks the size only).
    unsafe fn set_id_option<T>(&self, option: libc::c_int, value: T, op: &'static str) -> Result<()> {
        let mut value = value;
        // SAFETY: a live id; `value` is the C type for `option` (this
        // function's contract) and outlives the call.
        let rc = unsafe {
            sys::rdma_set_option(
                self.raw(),
                sys::RDMA_OPTION_ID,
                option,
                ptr::addr_of_mut!(value).cast(),
                std::mem::size_of::<T>(),
            )
        };
        self.check(rc, op)
    }

    pub fn bind_addr(&self, addr: &SocketAddr) -> Result<()> {
        let mut addr = to_sockaddr(addr);
        // SAFETY: valid id and sockaddr.
        let rc = unsafe { sys::rdma_bind_addr(self.raw(), ptr::addr_of_mut!(addr).cast()) };
        self.check(rc, "rdma_bind_addr")
    }

    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: valid id.
        self.check(unsafe { sys::rdma_listen(self.raw(), backlog) }, "rdma_listen")
    }

    /// The bound local port (`rdma_get_src_port`), e.g. after binding port 0.
    pub fn local_port(&self) -> u16 {
        // SAFETY: valid id; returns network byte order.
        u16::from_be(unsafe { sys::rdma_get_src_port(self.raw()) })
    }

    /// The peer's port once connected/resolved (`rdma_get_dst_port`).
    pub fn peer_port(&self) -> u16 {
        // SAFETY: valid id; returns network byte order.
        u16::from_be(unsafe { sys::rdma_get_dst_port(self.raw()) })
    }

    /// The peer's address (`rdma_get_peer_addr`): on a connection request's
    /// id, the address the request came from. `None` for a family other
    /// than IPv4/IPv6 (e.g. native InfiniBand addressing).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: valid id; librdmacm filled the route's address for a
        // request id before reporting it, and nothing writes it meanwhile.
        let storage = unsafe { &(*self.raw()).route_addr_dst };
        from_sockaddr(storage)
    }

    /// This side's address on a connected (or resolved) id
    /// (`rdma_get_local_addr`); `None` for a family other than IPv4/IPv6.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in `peer_addr`.
        let storage = unsafe { &(*self.raw()).route_addr_src };
        from_sockaddr(storage)
    }

    /// Active side, after `RouteResolved` and creating the QP; completes
    /// with `Established` (carrying the acceptor's private data),
    /// `Rejected`, `Unreachable` or `ConnectError`.
    pub fn connect(&self, p: &ConnParam) -> Result<()> {
        let mut raw = p.to_raw("rdma_connect")?;
        // SAFETY: the param and its private data are copied by librdmacm.
        self.check(unsafe { sys::rdma_connect(self.raw(), &mut raw) }, "rdma_connect")
    }

    /// Passive side, on a request id after creating its QP.
    pub fn accept(&self, p: &ConnParam) -> Result<()> {
        let mut raw = p.to_raw("rdma_accept")?;
        // SAFETY: as in connect.
        self.check(unsafe { sys::rdma_accept(self.raw(), &mut raw) }, "rdma_accept")
    }

    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len()).map_err(|_| VerbsError::new("rdma_reject", libc::EINVAL))?;
        let p = if len == 0 { ptr::null() } else { private_data.as_ptr().cast() };
        // SAFETY: private data copied by librdmacm.
        self.check(unsafe { sys::rdma_reject(self.raw(), p, len) }, "rdma_reject")
    }

    /// Starts a disconnect; both sides then get `Disconnected`. The QP is
    /// moved to the error state, so outstanding work requests are flushed.
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: valid id.
        self.check(unsafe { sys::rdma_disconnect(self.raw()) }, "rdma_disconnect")
    }

    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    pub fn raw(&self) -> *mut sys::rdma_cm_id {
        self.raw.as_ptr()
    }

    /// The name of the RDMA device this id is bound to (after a bind to a
    /// device's address or an address resolution), if any.
    pub fn device_name(&self) -> Option<String> {
        let ctx = self.verbs("rdma_cm_id.verbs").ok()?;
        // SAFETY: a non-null `verbs` is the live context librdmacm opened for the id's device.
        Some(unsafe { super::device::context_device_name(ctx) })
    }

    /// The verbs context of the device this id is bound to (an error before
    /// address resolution / binding to a device address).
    pub(crate) fn verbs(&self, op: &'static str) -> Result<*mut sys::ibv_context> {
        // SAFETY: valid id; `verbs` is set by librdmacm when the id gets a device.
        let v = unsafe { (*self.raw()).verbs };
        if v.is_null() {
            Err(VerbsError::new(op, libc::ENODEV))
        } else {
            Ok(v)
        }
    }

    fn check(&self, rc: libc::c_int, op: &'static str) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(VerbsError::last(op))
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the QP (if any) holds an Arc of us, so it is gone; events
        // about us hold an Arc too, except ones fetched while we were
        // already dropping: rdma_destroy_id waits for those to be acked, and
        // they find self_ref's Weak dead.
        let rc = unsafe { sys::rdma_destroy_id(self.raw()) };
        if rc != 0 {
            // The id may still be reachable from events: keep its context alive.
            std::mem::forget(std::mem::replace(&mut self.self_ref, Box::new(Weak::new())));
        }
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId").field("raw", &self.raw).field("local_port", &self.local_port()).finish()
    }
}
