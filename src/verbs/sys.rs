//! Hand-written FFI declarations for exactly the parts of libibverbs and
//! librdmacm that this crate uses, checked against rdma-core 44's
//! `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>` (x86_64 / aarch64 LP64).
//!
//! No bindgen: `tests/verbs_layout.rs` compiles a C program against the system
//! headers and compares `sizeof`/`offsetof` with `size_of`/`offset_of!` here.
//!
//! Two kinds of struct are declared:
//! - **complete** structs (`ibv_sge`, `ibv_send_wr`, `ibv_recv_wr`, `ibv_wc`,
//!   `ibv_qp_cap`, `ibv_qp_init_attr`, `ibv_mr`, `ibv_comp_channel`,
//!   `rdma_event_channel`, `rdma_conn_param`): same size as in C, may be
//!   created and copied by value in Rust;
//! - **prefix** structs (`ibv_context`, `rdma_cm_id`, `rdma_cm_event`): only the
//!   leading fields we read, at their C offsets. They are only ever accessed
//!   through pointers handed out by the C libraries; never construct, copy or
//!   `size_of` them.
//!
//! Opaque objects (`ibv_device`, `ibv_pd`, `ibv_cq`, `ibv_qp`) are zero-sized
//! `#[repr(C)]` structs with a private field, used only behind pointers.
//!
//! The static-inline data-path verbs (`ibv_post_send`, `ibv_post_recv`,
//! `ibv_poll_cq`, `ibv_req_notify_cq`) are wrapped by `shim.c` as `rmv_*`
//! (hidden visibility, so not exported from the cdylib).

#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_uint, c_void, size_t, sockaddr};

macro_rules! opaque {
    ($($name:ident),* $(,)?) => {$(
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
            _not_send_sync: core::marker::PhantomData<*mut u8>,
        }
    )*};
}

/// `enum ibv_fork_status`.
pub const IBV_FORK_DISABLED: c_int = 0;
pub const IBV_FORK_ENABLED: c_int = 1;
pub const IBV_FORK_UNNEEDED: c_int = 2;

opaque!(ibv_device, ibv_pd, ibv_cq, ibv_qp, ibv_srq, ibv_ah, ibv_mw);

// ---------------------------------------------------------------- libibverbs

/// Prefix of `struct ibv_context`: only `device` (offset 0) is used.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
}

/// `struct ibv_comp_channel` (complete).
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_mr` (complete).
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: size_t,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `ibv_send_wr.wr.rdma`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `ibv_send_wr.wr.atomic` (declared for the union's size only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `ibv_send_wr.wr.ud` (declared for completeness; unused).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The anonymous `wr` union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `struct ibv_send_wr` (complete, 128 bytes on LP64). The trailing `qp_type`
/// (XRC) and `bind_mw`/`tso` unions are never used by us and are kept as
/// zeroed padding of the right size and alignment.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint, // enum ibv_wr_opcode
    pub send_flags: c_uint,
    /// Union { `imm_data` (big endian), `invalidate_rkey` }.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// Union `qp_type` { xrc { remote_srqn } }.
    pub qp_type_xrc_remote_srqn: u32,
    /// Anonymous union { bind_mw { mw, rkey, bind_info { mr, addr, length, flags } }, tso { .. } }.
    pub _bind_mw_tso: [u64; 6],
}

/// `struct ibv_recv_wr` (complete).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc` (complete, 48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint, // enum ibv_wc_status
    pub opcode: c_uint, // enum ibv_wc_opcode
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Union { `imm_data` (big endian), `invalidated_rkey` }.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (complete).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint, // enum ibv_qp_type
    pub sq_sig_all: c_int,
}

// enum ibv_access_flags
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;

// enum ibv_qp_type
pub const IBV_QPT_RC: c_uint = 2;

// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub const IBV_WR_RDMA_READ: c_uint = 4;

// enum ibv_send_flags
pub const IBV_SEND_FENCE: c_uint = 1 << 0;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_SOLICITED: c_uint = 1 << 2;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;

// enum ibv_wc_status (the ones callers commonly test for)
pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_LOC_LEN_ERR: c_uint = 1;
pub const IBV_WC_LOC_PROT_ERR: c_uint = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub const IBV_WC_REM_INV_REQ_ERR: c_uint = 9;
pub const IBV_WC_REM_ACCESS_ERR: c_uint = 10;
pub const IBV_WC_REM_OP_ERR: c_uint = 11;
pub const IBV_WC_RETRY_EXC_ERR: c_uint = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: c_uint = 13;

// enum ibv_wc_opcode
pub const IBV_WC_SEND: c_uint = 0;
pub const IBV_WC_RDMA_WRITE: c_uint = 1;
pub const IBV_WC_RDMA_READ: c_uint = 2;
pub const IBV_WC_RECV: c_uint = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = (1 << 7) + 1;

// enum ibv_wc_flags
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;

extern "C" {
    pub fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    pub fn ibv_free_device_list(list: *mut *mut ibv_device);
    pub fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char;
    pub fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    pub fn ibv_close_device(context: *mut ibv_context) -> c_int;

    pub fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    pub fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;

    /// The exported function (the header's `ibv_reg_mr` macro resolves to it
    /// when no `IBV_ACCESS_OPTIONAL_RANGE` flag is passed, as here).
    pub fn ibv_create_qp(pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    pub fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    pub fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: size_t, access: c_int) -> *mut ibv_mr;
    pub fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    pub fn ibv_fork_init() -> c_int;
    /// Returns an `enum ibv_fork_status` (`IBV_FORK_*`).
    pub fn ibv_is_fork_initialized() -> c_int;

    pub fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel;
    pub fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int;

    pub fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    pub fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    pub fn ibv_get_cq_event(
        channel: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int;
    pub fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint);

    pub fn ibv_wc_status_str(status: c_uint) -> *const c_char;
}

// src/verbs/shim.c: the static-inline verbs, compiled by build.rs.
extern "C" {
    /// `ibv_post_send`: 0 or an errno value (ENOMEM = send queue full).
    pub fn rmv_post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int;
    /// `ibv_post_recv`: 0 or an errno value.
    pub fn rmv_post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int;
    /// `ibv_poll_cq`: number of completions (>= 0) or < 0 on error.
    pub fn rmv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int;
    /// `ibv_req_notify_cq`: 0 or an errno value.
    pub fn rmv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int;
    /// `ibv_query_device`, the fields of `rmv_device_info`: 0 or an errno value.
    pub fn rmv_qp_num(qp: *mut ibv_qp) -> u32;
    pub fn rmv_qp_connect_like(
        qp: *mut ibv_qp,
        like: *mut ibv_qp,
        access: c_int,
        remote_qpn: u32,
        remote_psn: u32,
        local_psn: u32,
    ) -> c_int;
    /// `ibv_modify_qp` to IBV_QPS_ERR: 0 or an errno value.
    pub fn rmv_qp_to_error(qp: *mut ibv_qp) -> c_int;
    pub fn rmv_query_device(context: *mut ibv_context, out: *mut rmv_device_info) -> c_int;
    /// `ibv_query_port`, the fields of `rmv_port_info`: 0 or an errno value.
    pub fn rmv_query_port(context: *mut ibv_context, port: u8, out: *mut rmv_port_info) -> c_int;
    /// `ibv_query_gid_ex`: 0, or an errno value (ENODATA: an empty entry).
    pub fn rmv_query_gid(context: *mut ibv_context, port: u32, index: u32, gid: *mut u8, gid_type: *mut u32) -> c_int;
}

/// `struct rmv_device_info` of shim.c (what the doctor reads of `ibv_device_attr`).
#[repr(C)]
pub struct rmv_device_info {
    /// Network byte order.
    pub node_guid: u64,
    pub phys_port_cnt: u32,
    /// NUL-terminated.
    pub fw_ver: [c_char; 64],
}

/// `struct rmv_port_info` of shim.c (what the doctor reads of `ibv_port_attr`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rmv_port_info {
    /// `enum ibv_port_state`.
    pub state: u32,
    /// `enum ibv_mtu` (1 = 256 bytes ... 5 = 4096).
    pub max_mtu: u32,
    pub active_mtu: u32,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u32,
    pub gid_tbl_len: u32,
}

// IBV_LINK_LAYER_*
pub const IBV_LINK_LAYER_UNSPECIFIED: u32 = 0;
pub const IBV_LINK_LAYER_INFINIBAND: u32 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u32 = 2;
// enum ibv_gid_type
pub const IBV_GID_TYPE_IB: u32 = 0;
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;

// ---------------------------------------------------------------- librdmacm

/// `struct rdma_event_channel` (complete).
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// Prefix of `struct rdma_cm_id`: `verbs`, `channel`, `context`, `qp`, and
/// the start of `route.addr`: the source and destination addresses (unions
/// whose largest member is a `sockaddr_storage`; what `rdma_get_local_addr`
/// and `rdma_get_peer_addr`, static inline functions, return pointers to).
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route_addr_src: libc::sockaddr_storage,
    pub route_addr_dst: libc::sockaddr_storage,
    // union { struct rdma_ib_addr ibaddr; } addr; ...; the rest of the route and id (not declared)
}

/// `struct rdma_conn_param` (complete).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// Prefix of `struct rdma_cm_event`: the `param` union is declared as its
/// `conn` member only (the `ud` member is larger).
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_uint, // enum rdma_cm_event_type
    pub status: c_int,
    pub param_conn: rdma_conn_param,
}

// enum rdma_cm_event_type
pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_uint = 0;
pub const RDMA_CM_EVENT_ADDR_ERROR: c_uint = 1;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_uint = 2;
pub const RDMA_CM_EVENT_ROUTE_ERROR: c_uint = 3;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_uint = 4;
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: c_uint = 5;
pub const RDMA_CM_EVENT_CONNECT_ERROR: c_uint = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: c_uint = 7;
pub const RDMA_CM_EVENT_REJECTED: c_uint = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: c_uint = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_uint = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_uint = 11;
pub const RDMA_CM_EVENT_MULTICAST_JOIN: c_uint = 12;
pub const RDMA_CM_EVENT_MULTICAST_ERROR: c_uint = 13;
pub const RDMA_CM_EVENT_ADDR_CHANGE: c_uint = 14;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_uint = 15;

// enum rdma_port_space
pub const RDMA_PS_TCP: c_uint = 0x0106;

// rdma_set_option levels and names
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;

extern "C" {
    pub fn rdma_create_event_channel() -> *mut rdma_event_channel;
    pub fn rdma_destroy_event_channel(channel: *mut rdma_event_channel);
    pub fn rdma_create_id(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: c_uint,
    ) -> c_int;
    pub fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
    pub fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int;
    pub fn rdma_resolve_addr(
        id: *mut rdma_cm_id,
        src_addr: *mut sockaddr,
        dst_addr: *mut sockaddr,
        timeout_ms: c_int,
    ) -> c_int;
    pub fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
    pub fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> c_int;
    pub fn rdma_destroy_qp(id: *mut rdma_cm_id);
    pub fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
    pub fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
    pub fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
    pub fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, private_data_len: u8) -> c_int;
    pub fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
    pub fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int;
    pub fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int;
    /// Returns the port in network byte order.
    pub fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16;
    /// Returns the port in network byte order.
    pub fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16;
    pub fn rdma_set_option(
        id: *mut rdma_cm_id,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: size_t,
    ) -> c_int;
    pub fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int;
}
