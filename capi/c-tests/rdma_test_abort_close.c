/* rdma_test_abort_close: rdmamig_conn_abort stops a source's
 * rdmamig_conn_close that waits for a destination which stopped answering,
 * as a hypervisor's "cancel migration" would during the completion handshake.
 *
 * fork(): the child is the destination, the parent the source, over rdma_cm
 * on $RXE_VM_IP (default 198.18.0.1). The destination takes one iteration
 * window, sends its pid up the pipe and stops itself (SIGSTOP): its kernel
 * still acknowledges the source's messages at the transport level, but no
 * READY or END_ACK comes. The source waits until the child is stopped
 * (waitpid WUNTRACED), then (timeout 30 s, liveness off, so only the abort
 * can end the wait) calls rdmamig_conn_close; another thread, 300 ms later,
 * checks that a second close is refused (RDMAMIG_ERR_STATE) and stats are
 * readable meanwhile, then aborts. The close must return
 * RDMAMIG_ERR_ABORTED within 2.5 s of the abort (the transfer thread's
 * teardown waits up to 1 s to send ERROR), and afterwards close and abort
 * give RDMAMIG_ERR_STATE. Then the destination is continued and must see
 * the migration fail.
 *
 *   rdma_test_abort_close [--bound-s S]   (S: 2.5 by default; valgrind needs more)
 *
 * Last line: "N passed, M failed"; exit status 0 if all passed. */
#define _GNU_SOURCE
#include "rdmamig.h"
#include "rdma_util.h"

#include <pthread.h>

#define MIB (UINT64_C(1) << 20)
#define RAM_MIB 4
#define TIMEOUT_MS 30000
#define ABORT_AFTER_US 300000
#define WATCHDOG_S 120

/* How long after the abort the close may take to return. */
static double bound_s = 2.5;

static int destination(void *arg, int wr) {
    (void)arg;
    who = "destination";
    uint8_t *host = map_ram(RAM_MIB * MIB, -1);
    rdmamig_ram *ram = host ? registry(host, RAM_MIB * MIB) : NULL;
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_listener *listener = NULL;
    rdmamig_conn *conn = NULL;
    int rc = 1;
    EXPECT(ram && cfg);
    TRY(NULL, rdmamig_config_set_liveness_ms(cfg, 0));
    TRY(NULL, rdmamig_listener_new(rdma_ip(), 0, cfg, &listener));
    uint16_t port = rdmamig_listener_port(listener);
    EXPECT(write(wr, &port, sizeof port) == (ssize_t)sizeof port);
    TRY(NULL, rdmamig_listener_accept(listener, ram, 60000, &conn));
    TRY(conn, rdmamig_conn_wait_iteration(conn, 1, 60000, NULL));
    pid_t self = getpid();
    EXPECT(write(wr, &self, sizeof self) == (ssize_t)sizeof self);
    raise(SIGSTOP);
    /* Continued once the source's close returned: the migration failed. */
    rdmamig_status end = rdmamig_conn_wait_end(conn, 60000);
    printf("destination: after the source's abort: %s\n", rdmamig_status_str(end));
    EXPECT(end != RDMAMIG_OK && end != RDMAMIG_END_UNVERIFIED);
    rc = 0;
fail:
    rdmamig_conn_free(conn);
    rdmamig_listener_free(listener);
    rdmamig_config_free(cfg);
    rdmamig_ram_free(ram);
    return rc;
}

struct canceller {
    const rdmamig_conn *conn;
    rdmamig_status second_close, stats, abort;
    double aborted_at;
};

static void *cancel_close(void *arg) {
    struct canceller *c = arg;
    usleep(ABORT_AFTER_US);
    /* A const call's handle, cast back as a second closer would hold it. */
    c->second_close = rdmamig_conn_close((rdmamig_conn *)c->conn);
    rdmamig_stats stats = {.size = sizeof stats};
    c->stats = rdmamig_conn_get_stats(c->conn, &stats);
    c->aborted_at = now_s();
    c->abort = rdmamig_conn_abort(c->conn);
    return NULL;
}

static int source(void *arg, uint16_t port, int rd) {
    (void)arg;
    who = "source";
    uint8_t *host = map_ram(RAM_MIB * MIB, 0x5a);
    rdmamig_ram *ram = host ? registry(host, RAM_MIB * MIB) : NULL;
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_conn *conn = NULL;
    pid_t dest = 0;
    int rc = 1;
    EXPECT(ram && cfg);
    TRY(NULL, rdmamig_config_set_timeout_ms(cfg, TIMEOUT_MS));
    TRY(NULL, rdmamig_config_set_liveness_ms(cfg, 0));
    TRY(NULL, rdmamig_connect(rdma_ip(), port, cfg, ram, &conn));
    TRY(conn, rdmamig_conn_iteration_begin(conn));
    TRY(conn, rdmamig_conn_save(conn, 0, 0, RAM_MIB * MIB));
    TRY(conn, rdmamig_conn_iteration_end(conn));
    EXPECT(read(rd, &dest, sizeof dest) == (ssize_t)sizeof dest && dest > 0);
    int ws = 0;
    EXPECT(waitpid(dest, &ws, WUNTRACED) == dest && WIFSTOPPED(ws));

    struct canceller c = {.conn = conn};
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, cancel_close, &c) == 0);
    double started = now_s();
    rdmamig_status st = rdmamig_conn_close(conn);
    double returned = now_s();
    pthread_join(t, NULL);
    printf("source: close returned %s %.0f ms after it began, %.0f ms after the abort\n",
           rdmamig_status_str(st), (returned - started) * 1e3, (returned - c.aborted_at) * 1e3);
    EXPECT(st == RDMAMIG_ERR_ABORTED);
    EXPECT(c.abort == RDMAMIG_OK);
    EXPECT(c.second_close == RDMAMIG_ERR_STATE);
    EXPECT(c.stats == RDMAMIG_OK);
    EXPECT(returned >= c.aborted_at); /* it waited for the abort ... */
    EXPECT(returned - c.aborted_at < bound_s); /* ... and not much longer */
    EXPECT(rdmamig_conn_close(conn) == RDMAMIG_ERR_STATE);
    EXPECT(rdmamig_conn_abort(conn) == RDMAMIG_ERR_STATE);
    char msg[256];
    rdmamig_conn_error_message(conn, msg, sizeof msg);
    printf("source: its message: %s\n", msg);
    rc = 0;
fail:
    if (dest > 0) kill(dest, SIGCONT);
    rdmamig_conn_free(conn);
    rdmamig_config_free(cfg);
    rdmamig_ram_free(ram);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--bound-s") == 0) {
        bound_s = atof(argv[2]);
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [--bound-s S]\n", argv[0]);
        return 2;
    }
    return run_pair(destination, source, NULL, WATCHDOG_S);
}
