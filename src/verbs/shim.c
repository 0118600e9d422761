/*
 * The four static-inline data-path verbs of <infiniband/verbs.h>, as real
 * functions callable from Rust (src/verbs/sys.rs). Hidden visibility: they
 * are internal to the library and never exported from the shared object;
 * the rmv_ prefix keeps them out of the public rdmamig_* namespace.
 */
#include <infiniband/verbs.h>
#include <string.h>

#define RMV_HIDDEN __attribute__((visibility("hidden")))

RMV_HIDDEN int rmv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                             struct ibv_send_wr **bad_wr)
{
	return ibv_post_send(qp, wr, bad_wr);
}

RMV_HIDDEN int rmv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
                             struct ibv_recv_wr **bad_wr)
{
	return ibv_post_recv(qp, wr, bad_wr);
}

RMV_HIDDEN int rmv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc);
}

RMV_HIDDEN int rmv_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

/*
 * Device, port and GID queries for `rdmamig doctor` (src/verbs/device.rs).
 * ibv_query_port and ibv_query_gid_ex are static inline (or macros) in
 * verbs.h, and struct ibv_port_attr/ibv_device_attr are long: these copy
 * the fields the doctor reports into small structs of fixed layout that
 * src/verbs/sys.rs mirrors.
 */
struct rmv_device_info {
	uint64_t node_guid; /* network byte order, as the kernel gives it */
	uint32_t phys_port_cnt;
	char fw_ver[64];
};

struct rmv_port_info {
	uint32_t state;       /* enum ibv_port_state */
	uint32_t max_mtu;     /* enum ibv_mtu */
	uint32_t active_mtu;  /* enum ibv_mtu */
	uint32_t link_layer;  /* IBV_LINK_LAYER_* */
	uint32_t gid_tbl_len;
};

RMV_HIDDEN int rmv_query_device(struct ibv_context *context, struct rmv_device_info *out)
{
	struct ibv_device_attr attr;
	int rc = ibv_query_device(context, &attr);

	if (rc)
		return rc;
	out->node_guid = attr.node_guid;
	out->phys_port_cnt = attr.phys_port_cnt;
	memcpy(out->fw_ver, attr.fw_ver, sizeof(out->fw_ver));
	out->fw_ver[sizeof(out->fw_ver) - 1] = 0;
	return 0;
}

RMV_HIDDEN uint32_t rmv_qp_num(struct ibv_qp *qp)
{
	return qp->qp_num;
}

/* Moves `qp` (RESET) through INIT and RTR to RTS, connected to QP
 * `remote_qpn` of the peer that `like` (a connected RC QP) reaches, with
 * `like`'s port, P_Key, address vector, path MTU, timeouts and READ depths.
 * 0 or an errno value. */
RMV_HIDDEN int rmv_qp_connect_like(struct ibv_qp *qp, struct ibv_qp *like, int access, uint32_t remote_qpn,
                                   uint32_t remote_psn, uint32_t local_psn)
{
	struct ibv_qp_attr a, m;
	struct ibv_qp_init_attr init;
	int rc = ibv_query_qp(like, &a,
			      IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT |
				      IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
			      &init);

	if (rc)
		return rc;
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_INIT;
	m.pkey_index = a.pkey_index;
	m.port_num = a.port_num;
	m.qp_access_flags = (unsigned int)access;
	rc = ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc)
		return rc;
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_RTR;
	m.path_mtu = a.path_mtu;
	m.dest_qp_num = remote_qpn;
	m.rq_psn = remote_psn;
	m.max_dest_rd_atomic = a.max_dest_rd_atomic;
	m.min_rnr_timer = a.min_rnr_timer;
	m.ah_attr = a.ah_attr;
	rc = ibv_modify_qp(qp, &m,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc)
		return rc;
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_RTS;
	m.timeout = a.timeout;
	m.retry_cnt = a.retry_cnt;
	m.rnr_retry = a.rnr_retry;
	m.sq_psn = local_psn;
	m.max_rd_atomic = a.max_rd_atomic;
	return ibv_modify_qp(qp, &m,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Moves `qp` to the error state (its work requests flush; nothing is sent
 * to the peer). 0 or an errno value. */
RMV_HIDDEN int rmv_qp_to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr m;

	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &m, IBV_QP_STATE);
}

RMV_HIDDEN int rmv_query_port(struct ibv_context *context, uint8_t port, struct rmv_port_info *out)
{
	struct ibv_port_attr attr;
	int rc = ibv_query_port(context, port, &attr);

	if (rc)
		return rc;
	out->state = attr.state;
	out->max_mtu = attr.max_mtu;
	out->active_mtu = attr.active_mtu;
	out->link_layer = attr.link_layer;
	out->gid_tbl_len = (uint32_t)attr.gid_tbl_len;
	return 0;
}

/* 0 and the GID's 16 bytes and type (enum ibv_gid_type), or an errno value
 * (ENODATA: the entry is empty). */
RMV_HIDDEN int rmv_query_gid(struct ibv_context *context, uint32_t port, uint32_t index,
                             uint8_t gid[16], uint32_t *type)
{
	struct ibv_gid_entry entry;
	int rc = ibv_query_gid_ex(context, port, index, &entry, 0);

	if (rc)
		return rc;
	memcpy(gid, entry.gid.raw, 16);
	*type = entry.gid_type;
	return 0;
}
