/*
 * The four static-inline data-path verbs of <infiniband/verbs.h>, as real
 * functions callable from Rust (src/verbs/sys.rs). Hidden visibility: they
 * are internal to the library and never exported from the shared object;
 * the rmv_ prefix keeps them out of the public rdmamig_* namespace.
 */
#include <infiniband/verbs.h>

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
