/*
 * Prints the size and field offsets of every libibverbs/librdmacm struct
 * that src/verbs/sys.rs declares, and the values of the constants it uses,
 * as "key value" lines. tests/verbs_layout.rs compiles and runs this and
 * compares with the Rust declarations.
 */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define SZ(T) printf("%s.size %zu\n", #T, sizeof(struct T))
#define OFF(T, F) printf("%s.%s %zu\n", #T, #F, offsetof(struct T, F))
#define K(C) printf("%s %lld\n", #C, (long long)(C))

int main(void)
{
	/* libibverbs */
	OFF(ibv_context, device);

	SZ(ibv_comp_channel);
	OFF(ibv_comp_channel, context);
	OFF(ibv_comp_channel, fd);
	OFF(ibv_comp_channel, refcnt);

	SZ(ibv_mr);
	OFF(ibv_mr, context);
	OFF(ibv_mr, pd);
	OFF(ibv_mr, addr);
	OFF(ibv_mr, length);
	OFF(ibv_mr, handle);
	OFF(ibv_mr, lkey);
	OFF(ibv_mr, rkey);

	SZ(ibv_sge);
	OFF(ibv_sge, addr);
	OFF(ibv_sge, length);
	OFF(ibv_sge, lkey);

	SZ(ibv_send_wr);
	OFF(ibv_send_wr, wr_id);
	OFF(ibv_send_wr, next);
	OFF(ibv_send_wr, sg_list);
	OFF(ibv_send_wr, num_sge);
	OFF(ibv_send_wr, opcode);
	OFF(ibv_send_wr, send_flags);
	OFF(ibv_send_wr, imm_data);
	OFF(ibv_send_wr, wr);
	OFF(ibv_send_wr, wr.rdma.remote_addr);
	OFF(ibv_send_wr, wr.rdma.rkey);
	OFF(ibv_send_wr, wr.atomic.rkey);
	OFF(ibv_send_wr, wr.ud.remote_qkey);
	OFF(ibv_send_wr, qp_type);
	OFF(ibv_send_wr, bind_mw);
	printf("ibv_send_wr.wr.size %zu\n", sizeof(((struct ibv_send_wr *)0)->wr));
	printf("ibv_send_wr.bind_mw.size %zu\n", sizeof(((struct ibv_send_wr *)0)->bind_mw));

	SZ(ibv_recv_wr);
	OFF(ibv_recv_wr, wr_id);
	OFF(ibv_recv_wr, next);
	OFF(ibv_recv_wr, sg_list);
	OFF(ibv_recv_wr, num_sge);

	SZ(ibv_wc);
	OFF(ibv_wc, wr_id);
	OFF(ibv_wc, status);
	OFF(ibv_wc, opcode);
	OFF(ibv_wc, vendor_err);
	OFF(ibv_wc, byte_len);
	OFF(ibv_wc, imm_data);
	OFF(ibv_wc, qp_num);
	OFF(ibv_wc, src_qp);
	OFF(ibv_wc, wc_flags);
	OFF(ibv_wc, pkey_index);
	OFF(ibv_wc, slid);
	OFF(ibv_wc, sl);
	OFF(ibv_wc, dlid_path_bits);

	SZ(ibv_qp_cap);
	OFF(ibv_qp_cap, max_send_wr);
	OFF(ibv_qp_cap, max_recv_wr);
	OFF(ibv_qp_cap, max_send_sge);
	OFF(ibv_qp_cap, max_recv_sge);
	OFF(ibv_qp_cap, max_inline_data);

	SZ(ibv_qp_init_attr);
	OFF(ibv_qp_init_attr, qp_context);
	OFF(ibv_qp_init_attr, send_cq);
	OFF(ibv_qp_init_attr, recv_cq);
	OFF(ibv_qp_init_attr, srq);
	OFF(ibv_qp_init_attr, cap);
	OFF(ibv_qp_init_attr, qp_type);
	OFF(ibv_qp_init_attr, sq_sig_all);

	printf("enum.size %zu\n", sizeof(enum ibv_wc_status));
	printf("enum_wr_opcode.size %zu\n", sizeof(enum ibv_wr_opcode));
	printf("enum_qp_type.size %zu\n", sizeof(enum ibv_qp_type));
	printf("enum_cm_event_type.size %zu\n", sizeof(enum rdma_cm_event_type));

	K(IBV_ACCESS_LOCAL_WRITE);
	K(IBV_FORK_DISABLED);
	K(IBV_FORK_ENABLED);
	K(IBV_FORK_UNNEEDED);
	K(IBV_ACCESS_REMOTE_WRITE);
	K(IBV_ACCESS_REMOTE_READ);
	K(IBV_QPT_RC);
	K(IBV_WR_RDMA_WRITE);
	K(IBV_WR_RDMA_WRITE_WITH_IMM);
	K(IBV_WR_SEND);
	K(IBV_WR_SEND_WITH_IMM);
	K(IBV_WR_RDMA_READ);
	K(IBV_SEND_FENCE);
	K(IBV_SEND_SIGNALED);
	K(IBV_SEND_SOLICITED);
	K(IBV_SEND_INLINE);
	K(IBV_WC_SUCCESS);
	K(IBV_WC_LOC_LEN_ERR);
	K(IBV_WC_LOC_PROT_ERR);
	K(IBV_WC_WR_FLUSH_ERR);
	K(IBV_WC_REM_INV_REQ_ERR);
	K(IBV_WC_REM_ACCESS_ERR);
	K(IBV_WC_REM_OP_ERR);
	K(IBV_WC_RETRY_EXC_ERR);
	K(IBV_WC_RNR_RETRY_EXC_ERR);
	K(IBV_WC_SEND);
	K(IBV_WC_RDMA_WRITE);
	K(IBV_WC_RDMA_READ);
	K(IBV_WC_RECV);
	K(IBV_WC_RECV_RDMA_WITH_IMM);
	K(IBV_WC_WITH_IMM);

	/* librdmacm */
	SZ(rdma_event_channel);
	OFF(rdma_event_channel, fd);

	OFF(rdma_cm_id, verbs);
	OFF(rdma_cm_id, channel);
	OFF(rdma_cm_id, context);
	OFF(rdma_cm_id, qp);
	printf("rdma_cm_id.route_addr_src %zu\n", offsetof(struct rdma_cm_id, route.addr.src_storage));
	printf("rdma_cm_id.route_addr_dst %zu\n", offsetof(struct rdma_cm_id, route.addr.dst_storage));

	SZ(rdma_conn_param);
	OFF(rdma_conn_param, private_data);
	OFF(rdma_conn_param, private_data_len);
	OFF(rdma_conn_param, responder_resources);
	OFF(rdma_conn_param, initiator_depth);
	OFF(rdma_conn_param, flow_control);
	OFF(rdma_conn_param, retry_count);
	OFF(rdma_conn_param, rnr_retry_count);
	OFF(rdma_conn_param, srq);
	OFF(rdma_conn_param, qp_num);

	OFF(rdma_cm_event, id);
	OFF(rdma_cm_event, listen_id);
	OFF(rdma_cm_event, event);
	OFF(rdma_cm_event, status);
	OFF(rdma_cm_event, param.conn);
	OFF(rdma_cm_event, param.conn.private_data);
	OFF(rdma_cm_event, param.conn.private_data_len);

	K(RDMA_CM_EVENT_ADDR_RESOLVED);
	K(RDMA_CM_EVENT_ADDR_ERROR);
	K(RDMA_CM_EVENT_ROUTE_RESOLVED);
	K(RDMA_CM_EVENT_ROUTE_ERROR);
	K(RDMA_CM_EVENT_CONNECT_REQUEST);
	K(RDMA_CM_EVENT_CONNECT_RESPONSE);
	K(RDMA_CM_EVENT_CONNECT_ERROR);
	K(RDMA_CM_EVENT_UNREACHABLE);
	K(RDMA_CM_EVENT_REJECTED);
	K(RDMA_CM_EVENT_ESTABLISHED);
	K(RDMA_CM_EVENT_DISCONNECTED);
	K(RDMA_CM_EVENT_DEVICE_REMOVAL);
	K(RDMA_CM_EVENT_MULTICAST_JOIN);
	K(RDMA_CM_EVENT_MULTICAST_ERROR);
	K(RDMA_CM_EVENT_ADDR_CHANGE);
	K(RDMA_CM_EVENT_TIMEWAIT_EXIT);
	K(RDMA_PS_TCP);
	K(RDMA_OPTION_ID);
	K(RDMA_OPTION_ID_TOS);
	K(RDMA_OPTION_ID_REUSEADDR);
	K(RDMA_OPTION_ID_ACK_TIMEOUT);
	return 0;
}
