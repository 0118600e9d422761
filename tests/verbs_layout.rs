//! The hand-written declarations in `src/verbs/sys.rs` against the system
//! headers: compiles `tests/verbs_layout.c` (sizeof/offsetof/enum values as
//! seen by the C compiler), runs it, and compares every line with the same
//! quantity computed in Rust (size_of/offset_of!/the constants).
//!
//! Structs declared completely in Rust are checked for size and every field;
//! prefix structs (`ibv_context`, `rdma_cm_id`, `rdma_cm_event`) for the
//! offsets of the fields we read.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use rdmamig::verbs::sys::*;

fn c_values() -> BTreeMap<String, i64> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = manifest.join("tests/verbs_layout.c");
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("verbs_layout_c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(&cc);
    // Include paths as the build uses them (normally just /usr/include).
    if let Ok(out) = Command::new("pkg-config").args(["--cflags", "libibverbs", "librdmacm"]).output() {
        if out.status.success() {
            cmd.args(String::from_utf8_lossy(&out.stdout).split_whitespace());
        }
    }
    let status = cmd
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run C compiler `{cc}`: {e}"));
    assert!(status.success(), "compiling {} failed", src.display());
    let out = Command::new(&exe).output().expect("run layout program");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

fn rust_values() -> BTreeMap<String, i64> {
    let mut m = BTreeMap::new();
    macro_rules! sz {
        ($t:ident) => {
            m.insert(concat!(stringify!($t), ".size").to_string(), size_of::<$t>() as i64);
        };
    }
    macro_rules! off {
        ($t:ident, $f:ident) => {
            m.insert(concat!(stringify!($t), ".", stringify!($f)).to_string(), offset_of!($t, $f) as i64);
        };
        ($t:ident, $key:literal, $v:expr) => {
            m.insert(concat!(stringify!($t), ".", $key).to_string(), ($v) as i64);
        };
    }
    macro_rules! k {
        ($($c:ident),* $(,)?) => {$(
            m.insert(stringify!($c).to_string(), $c as i64);
        )*};
    }

    off!(ibv_context, device);

    sz!(ibv_comp_channel);
    off!(ibv_comp_channel, context);
    off!(ibv_comp_channel, fd);
    off!(ibv_comp_channel, refcnt);

    sz!(ibv_mr);
    off!(ibv_mr, context);
    off!(ibv_mr, pd);
    off!(ibv_mr, addr);
    off!(ibv_mr, length);
    off!(ibv_mr, handle);
    off!(ibv_mr, lkey);
    off!(ibv_mr, rkey);

    sz!(ibv_sge);
    off!(ibv_sge, addr);
    off!(ibv_sge, length);
    off!(ibv_sge, lkey);

    sz!(ibv_send_wr);
    off!(ibv_send_wr, wr_id);
    off!(ibv_send_wr, next);
    off!(ibv_send_wr, sg_list);
    off!(ibv_send_wr, num_sge);
    off!(ibv_send_wr, opcode);
    off!(ibv_send_wr, send_flags);
    off!(ibv_send_wr, imm_data);
    off!(ibv_send_wr, wr);
    let wr = offset_of!(ibv_send_wr, wr);
    off!(ibv_send_wr, "wr.rdma.remote_addr", wr + offset_of!(ibv_send_wr_rdma, remote_addr));
    off!(ibv_send_wr, "wr.rdma.rkey", wr + offset_of!(ibv_send_wr_rdma, rkey));
    off!(ibv_send_wr, "wr.atomic.rkey", wr + offset_of!(ibv_send_wr_atomic, rkey));
    off!(ibv_send_wr, "wr.ud.remote_qkey", wr + offset_of!(ibv_send_wr_ud, remote_qkey));
    off!(ibv_send_wr, "qp_type", offset_of!(ibv_send_wr, qp_type_xrc_remote_srqn));
    off!(ibv_send_wr, "bind_mw", offset_of!(ibv_send_wr, _bind_mw_tso));
    off!(ibv_send_wr, "wr.size", size_of::<ibv_send_wr_wr>());
    off!(ibv_send_wr, "bind_mw.size", size_of::<[u64; 6]>());

    sz!(ibv_recv_wr);
    off!(ibv_recv_wr, wr_id);
    off!(ibv_recv_wr, next);
    off!(ibv_recv_wr, sg_list);
    off!(ibv_recv_wr, num_sge);

    sz!(ibv_wc);
    off!(ibv_wc, wr_id);
    off!(ibv_wc, status);
    off!(ibv_wc, opcode);
    off!(ibv_wc, vendor_err);
    off!(ibv_wc, byte_len);
    off!(ibv_wc, imm_data);
    off!(ibv_wc, qp_num);
    off!(ibv_wc, src_qp);
    off!(ibv_wc, wc_flags);
    off!(ibv_wc, pkey_index);
    off!(ibv_wc, slid);
    off!(ibv_wc, sl);
    off!(ibv_wc, dlid_path_bits);

    sz!(ibv_qp_cap);
    off!(ibv_qp_cap, max_send_wr);
    off!(ibv_qp_cap, max_recv_wr);
    off!(ibv_qp_cap, max_send_sge);
    off!(ibv_qp_cap, max_recv_sge);
    off!(ibv_qp_cap, max_inline_data);

    sz!(ibv_qp_init_attr);
    off!(ibv_qp_init_attr, qp_context);
    off!(ibv_qp_init_attr, send_cq);
    off!(ibv_qp_init_attr, recv_cq);
    off!(ibv_qp_init_attr, srq);
    off!(ibv_qp_init_attr, cap);
    off!(ibv_qp_init_attr, qp_type);
    off!(ibv_qp_init_attr, sq_sig_all);

    // Enums are declared as c_uint in Rust.
    for e in ["enum", "enum_wr_opcode", "enum_qp_type", "enum_cm_event_type"] {
        m.insert(format!("{e}.size"), size_of::<libc::c_uint>() as i64);
    }

    k!(
        IBV_ACCESS_LOCAL_WRITE,
        IBV_FORK_DISABLED,
        IBV_FORK_ENABLED,
        IBV_FORK_UNNEEDED,
        IBV_ACCESS_REMOTE_WRITE,
        IBV_ACCESS_REMOTE_READ,
        IBV_QPT_RC,
        IBV_WR_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        IBV_WR_SEND,
        IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ,
        IBV_SEND_FENCE,
        IBV_SEND_SIGNALED,
        IBV_SEND_SOLICITED,
        IBV_SEND_INLINE,
        IBV_WC_SUCCESS,
        IBV_WC_LOC_LEN_ERR,
        IBV_WC_LOC_PROT_ERR,
        IBV_WC_WR_FLUSH_ERR,
        IBV_WC_REM_INV_REQ_ERR,
        IBV_WC_REM_ACCESS_ERR,
        IBV_WC_REM_OP_ERR,
        IBV_WC_RETRY_EXC_ERR,
        IBV_WC_RNR_RETRY_EXC_ERR,
        IBV_WC_SEND,
        IBV_WC_RDMA_WRITE,
        IBV_WC_RDMA_READ,
        IBV_WC_RECV,
        IBV_WC_RECV_RDMA_WITH_IMM,
        IBV_WC_WITH_IMM,
    );

    sz!(rdma_event_channel);
    off!(rdma_event_channel, fd);

    off!(rdma_cm_id, verbs);
    off!(rdma_cm_id, channel);
    off!(rdma_cm_id, context);
    off!(rdma_cm_id, qp);
    off!(rdma_cm_id, route_addr_src);
    off!(rdma_cm_id, route_addr_dst);

    sz!(rdma_conn_param);
    off!(rdma_conn_param, private_data);
    off!(rdma_conn_param, private_data_len);
    off!(rdma_conn_param, responder_resources);
    off!(rdma_conn_param, initiator_depth);
    off!(rdma_conn_param, flow_control);
    off!(rdma_conn_param, retry_count);
    off!(rdma_conn_param, rnr_retry_count);
    off!(rdma_conn_param, srq);
    off!(rdma_conn_param, qp_num);

    off!(rdma_cm_event, id);
    off!(rdma_cm_event, listen_id);
    off!(rdma_cm_event, event);
    off!(rdma_cm_event, status);
    let conn = offset_of!(rdma_cm_event, param_conn);
    off!(rdma_cm_event, "param.conn", conn);
    off!(rdma_cm_event, "param.conn.private_data", conn + offset_of!(rdma_conn_param, private_data));
    off!(rdma_cm_event, "param.conn.private_data_len", conn + offset_of!(rdma_conn_param, private_data_len));

    k!(
        RDMA_CM_EVENT_ADDR_RESOLVED,
        RDMA_CM_EVENT_ADDR_ERROR,
        RDMA_CM_EVENT_ROUTE_RESOLVED,
        RDMA_CM_EVENT_ROUTE_ERROR,
        RDMA_CM_EVENT_CONNECT_REQUEST,
        RDMA_CM_EVENT_CONNECT_RESPONSE,
        RDMA_CM_EVENT_CONNECT_ERROR,
        RDMA_CM_EVENT_UNREACHABLE,
        RDMA_CM_EVENT_REJECTED,
        RDMA_CM_EVENT_ESTABLISHED,
        RDMA_CM_EVENT_DISCONNECTED,
        RDMA_CM_EVENT_DEVICE_REMOVAL,
        RDMA_CM_EVENT_MULTICAST_JOIN,
        RDMA_CM_EVENT_MULTICAST_ERROR,
        RDMA_CM_EVENT_ADDR_CHANGE,
        RDMA_CM_EVENT_TIMEWAIT_EXIT,
        RDMA_PS_TCP,
        RDMA_OPTION_ID,
        RDMA_OPTION_ID_TOS,
        RDMA_OPTION_ID_REUSEADDR,
        RDMA_OPTION_ID_ACK_TIMEOUT,
    );
    m
}

#[test]
fn sys_layout_matches_c_headers() {
    let c = c_values();
    let rust = rust_values();
    let mut bad = Vec::new();
    for (k, cv) in &c {
        match rust.get(k) {
            Some(rv) if rv == cv => {}
            Some(rv) => bad.push(format!("{k}: C {cv}, Rust {rv}")),
            None => bad.push(format!("{k}: C {cv}, not checked in Rust")),
        }
    }
    for k in rust.keys().filter(|k| !c.contains_key(*k)) {
        bad.push(format!("{k}: checked in Rust, missing from verbs_layout.c"));
    }
    assert!(bad.is_empty(), "sys.rs disagrees with the C headers:\n  {}", bad.join("\n  "));
    assert!(c.len() > 100, "only {} values compared", c.len());
}

/// Prefix structs must not claim more than the real struct has before the
/// next field we do not declare (a smoke check that they are prefixes).
#[test]
fn prefix_structs_are_prefixes() {
    assert_eq!(size_of::<ibv_context>(), 8);
    assert_eq!(size_of::<rdma_cm_id>(), 32 + 2 * 128);
    assert_eq!(offset_of!(rdma_cm_event, param_conn) + size_of::<rdma_conn_param>(), size_of::<rdma_cm_event>());
}
