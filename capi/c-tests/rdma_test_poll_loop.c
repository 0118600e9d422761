/* rdma_test_poll_loop: a destination driven only by poll() on the
 * connection's event fd and calls that never wait, as an event-loop
 * hypervisor (QEMU's main loop, an epoll VMM) would drive it; and the proof
 * that it never blocked in a library call.
 *
 * fork(): the child is the destination, the parent the source, over rdma_cm
 * on $RXE_VM_IP (default 198.18.0.1); the destination listens on port 0 and
 * passes the port up a pipe.
 *
 * Source (an ordinary, blocking source, its saves bounded to 1 MiB queued
 * ahead of the link): N MiB of guest RAM in one block, a
 * pseudo-random pattern except one all-zero MiB. Stream: a header (magic,
 * rounds, payload length), then after each precopy round a piece of payload
 * (odd sizes, flushed between windows), then the FNV-1a hash of its RAM.
 * Round 0 sends every page; later rounds change some pages first and send
 * those. Then rdmamig_conn_close must say RDMAMIG_OK (completed).
 *
 * Destination: poll(listener's event fd, POLLIN), then
 * rdmamig_listener_accept(.., RDMAMIG_NO_WAIT, ..) (which must have said
 * RDMAMIG_ERR_WOULD_BLOCK before any source knew the port); then only this
 * loop runs until the end:
 *
 *     poll(event fd, POLLIN)
 *     rdmamig_conn_get(.., RDMAMIG_NO_WAIT, ..) until RDMAMIG_ERR_WOULD_BLOCK or the end
 *     rdmamig_conn_wait_iteration(conn, 0, RDMAMIG_NO_WAIT, &done)
 *
 * Every library call after rdmamig_listener_new is timed, and the test fails if one
 * took longer than --bound-ms (200 ms by default: a correctness check of
 * "never waits", not a benchmark; scheduling noise is far below it). It also
 * fails on a wakeup with nothing to take after the first (the fd is
 * level-triggered and exact), if the end does not leave the fd readable, and
 * unless RAM, stream and window count are identical to the source's.
 *
 *   rdma_test_poll_loop [--mib N] [--bound-ms MS]
 *
 * Last line: "N passed, M failed"; exit status 0 if all passed.
 */
#define _GNU_SOURCE
#include "rdmamig.h"
#include "rdma_util.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (UINT64_C(1) << 20)
#define PAGE UINT64_C(4096)
#define ROUNDS 5
#define PAGES_PER_ROUND 512
#define ZERO_MIB 2
#define STREAM_MAGIC UINT64_C(0x504f4c4c4c4f4f50) /* "POLLLOOP" */
#define SETUP_TIMEOUT_MS 60000
/* The loop fails if the fd stays quiet this long (a lost wakeup). */
#define QUIET_MS 60000
#define WATCHDOG_S 300

/* The payload piece sent after round r: odd sizes, byte i of the whole payload is payload_byte(i). */
static size_t piece_len(int r) {
    return 40000 + 4093 * (size_t)r;
}

static size_t payload_len(void) {
    size_t n = 0;
    for (int r = 0; r < ROUNDS; r++) n += piece_len(r);
    return n;
}

static uint8_t payload_byte(size_t i) {
    return (uint8_t)(i * 131 + (i >> 9) + 7);
}

/* ----------------------------------------------------------- destination */

/* The longest library call since the listener was created, and which. */
static double max_call_s;
static const char *max_call = "none";
static double bound_s;
static int over_bound;

static void timed(const char *call, double start) {
    double took = now_s() - start;
    if (took > max_call_s) {
        max_call_s = took;
        max_call = call;
    }
    if (took > bound_s) {
        over_bound++;
        fprintf(stderr, "%s: FAIL %s took %.1f ms (bound %.0f ms): it waited\n", who, call, took * 1e3,
                bound_s * 1e3);
    }
}

/* `var = call`, timed. */
#define TIMED(var, call)          \
    do {                          \
        double t0_ = now_s();     \
        var = (call);             \
        timed(#call, t0_);        \
    } while (0)

static int fd_readable(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static int destination(unsigned mib, int port_fd) {
    who = "dest";
    uint64_t len = (uint64_t)mib * MIB;
    uint8_t *host = map_ram(len, 0xAA);
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = NULL;
    rdmamig_listener *listener = NULL;
    rdmamig_conn *conn = NULL;
    uint8_t *stream = NULL;
    size_t got = 0, cap = 0;
    uint16_t port = 0;
    int rc = 1;
    rdmamig_status st;

    EXPECT(host && cfg);
    ram = registry(host, len);
    EXPECT(ram);
    TRY(NULL, rdmamig_listener_new(rdma_ip(), 0, cfg, &listener));

    /* From here on every library call is timed. */
    int lfd = -1;
    TIMED(st, rdmamig_listener_event_fd(listener, &lfd));
    TRY(NULL, st);
    EXPECT(lfd >= 0);
    port = rdmamig_listener_port(listener);
    EXPECT(port != 0);
    /* No source knows the port yet: accepting must not wait. */
    EXPECT(!fd_readable(lfd));
    TIMED(st, rdmamig_listener_accept(listener, ram, RDMAMIG_NO_WAIT, &conn));
    EXPECT(st == RDMAMIG_ERR_WOULD_BLOCK && conn == NULL);
    EXPECT(write(port_fd, &port, sizeof port) == (ssize_t)sizeof port);
    close(port_fd);
    port_fd = -1;
    /* The listener's fd says when the source's request is there. */
    while (conn == NULL) {
        struct pollfd lp = {.fd = lfd, .events = POLLIN};
        int n = poll(&lp, 1, SETUP_TIMEOUT_MS);
        if (n < 0 && errno == EINTR) continue;
        EXPECT(n == 1 && (lp.revents & POLLIN));
        TIMED(st, rdmamig_listener_accept(listener, ram, RDMAMIG_NO_WAIT, &conn));
        if (st != RDMAMIG_ERR_WOULD_BLOCK) TRY(NULL, st);
    }

    int fd = -1;
    TIMED(st, rdmamig_conn_event_fd(conn, &fd));
    TRY(conn, st);
    EXPECT(fd >= 0);

    unsigned wakeups = 0, empty_wakeups = 0, would_block = 0, window_wakeups = 0, reads = 0;
    uint64_t done = 0;
    rdmamig_status end = RDMAMIG_OK;
    uint8_t buf[65536];
    while (end == RDMAMIG_OK) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, QUIET_MS);
        if (n < 0 && errno == EINTR) continue;
        EXPECT(n >= 0);
        if (n == 0) {
            fprintf(stderr, "dest: FAIL the event fd stayed quiet for %d ms (%" PRIu64 " windows, %zu bytes so far)\n",
                    QUIET_MS, done, got);
            goto fail;
        }
        EXPECT(p.revents & POLLIN);
        wakeups++;
        int took_something = 0;
        /* The stream: until "would block", or the end. */
        for (;;) {
            size_t k = 0;
            TIMED(st, rdmamig_conn_get(conn, buf, sizeof buf, RDMAMIG_NO_WAIT, &k));
            if (st == RDMAMIG_ERR_WOULD_BLOCK) {
                would_block++;
                break;
            }
            if (st != RDMAMIG_OK) {
                end = st; /* RDMAMIG_END_COMPLETED, or the failure */
                took_something = 1;
                break;
            }
            EXPECT(k > 0 && k <= sizeof buf);
            if (got + k > cap) {
                cap = (got + k) * 2;
                uint8_t *bigger = realloc(stream, cap);
                EXPECT(bigger);
                stream = bigger;
            }
            memcpy(stream + got, buf, k);
            got += k;
            reads++;
            took_something = 1;
        }
        /* Completed windows: always answers at once, and reports them. */
        uint64_t now_done = 0;
        TIMED(st, rdmamig_conn_wait_iteration(conn, 0, RDMAMIG_NO_WAIT, &now_done));
        if (end == RDMAMIG_OK) TRY(conn, st);
        if (st == RDMAMIG_OK && now_done > done) {
            window_wakeups++;
            took_something = 1;
            done = now_done;
        }
        if (!took_something) empty_wakeups++;
    }
    if (end != RDMAMIG_END_COMPLETED) {
        report("the poll loop's end", end, conn);
        goto fail;
    }
    /* The end is permanent: the fd stays readable and every call says how it ended, at once. */
    EXPECT(fd_readable(fd));
    TIMED(st, rdmamig_conn_wait_end(conn, RDMAMIG_NO_WAIT));
    EXPECT(st == RDMAMIG_END_COMPLETED);
    TIMED(st, rdmamig_conn_wait_iteration(conn, 0, RDMAMIG_NO_WAIT, &done));
    TRY(conn, st);
    EXPECT(fd_readable(fd));

    /* The stream, byte for byte. */
    size_t plen = payload_len();
    uint64_t header[3];
    uint64_t source_hash;
    EXPECT(got == sizeof header + plen + sizeof source_hash);
    memcpy(header, stream, sizeof header);
    EXPECT(header[0] == STREAM_MAGIC && header[1] == ROUNDS && header[2] == plen);
    for (size_t i = 0; i < plen; i++) {
        if (stream[sizeof header + i] != payload_byte(i)) {
            fprintf(stderr, "dest: FAIL stream payload byte %zu differs\n", i);
            goto fail;
        }
    }
    memcpy(&source_hash, stream + sizeof header + plen, sizeof source_hash);
    EXPECT(done == ROUNDS);
    uint64_t hash = fnv1a(FNV_OFFSET, host, len);
    if (hash != source_hash) {
        fprintf(stderr, "dest: FAIL RAM hash %016" PRIx64 " != source's %016" PRIx64 "\n", hash, source_hash);
        goto fail;
    }
    for (uint64_t i = 0; i < MIB; i++) EXPECT(host[ZERO_MIB * MIB + i] == 0);
    /* Level-triggered and exact: every wakeup had something to take. */
    EXPECT(empty_wakeups == 0);

    TIMED(st, rdmamig_conn_close(conn));
    TRY(conn, st);
    double t0 = now_s();
    rdmamig_conn_free(conn);
    timed("rdmamig_conn_free", t0);
    conn = NULL;
    EXPECT(over_bound == 0);
    printf("dest: %u wakeups (%u with a window, %u empty), %u reads, %u would-block; longest call %.2f ms (%s)\n",
           wakeups, window_wakeups, empty_wakeups, reads, would_block, max_call_s * 1e3, max_call);
    printf("dest: RAM identical (%u MiB), stream identical (%zu bytes), %" PRIu64 " windows, never blocked\n", mib,
           got, done);
    rc = 0;
fail:
    if (port_fd >= 0) {
        uint16_t zero = 0; /* tell the source we failed before listening */
        if (write(port_fd, &zero, sizeof zero) < 0) perror("write");
        close(port_fd);
    }
    if (rc != 0 && conn) rdmamig_conn_abort(conn);
    rdmamig_conn_free(conn);
    rdmamig_listener_free(listener);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    free(stream);
    if (host) munmap(host, len);
    return rc;
}

/* ---------------------------------------------------------------- source */

static int source(unsigned mib, uint16_t port) {
    who = "source";
    uint64_t len = (uint64_t)mib * MIB;
    uint8_t *host = map_ram(len, 0);
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = NULL;
    rdmamig_conn *conn = NULL;
    uint8_t *piece = NULL;
    int rc = 1;

    EXPECT(host && cfg);
    uint64_t s = UINT64_C(0x5EED0002);
    for (uint64_t off = 0; off < len; off += 8) {
        if (off / MIB == ZERO_MIB) continue;
        uint64_t v = rng_next(&s);
        memcpy(host + off, &v, 8);
    }
    ram = registry(host, len);
    EXPECT(ram);
    TRY(NULL, rdmamig_config_set_timeout_ms(cfg, SETUP_TIMEOUT_MS));
    TRY(NULL, rdmamig_config_set_max_queued_bytes(cfg, MIB));
    TRY(NULL, rdmamig_connect(rdma_ip(), port, cfg, ram, &conn));
    int fd = -1;
    TRY(conn, rdmamig_conn_event_fd(conn, &fd));
    EXPECT(!fd_readable(fd)); /* a healthy source's fd is quiet */

    size_t plen = payload_len(), sent = 0;
    uint64_t header[3] = {STREAM_MAGIC, ROUNDS, plen};
    TRY(conn, rdmamig_conn_put(conn, header, sizeof header));
    TRY(conn, rdmamig_conn_flush(conn));
    piece = malloc(piece_len(ROUNDS));
    EXPECT(piece);
    uint64_t dirty = UINT64_C(0xD1D1D1D1);
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t pages[PAGES_PER_ROUND];
        if (r > 0) { /* change some pages (not the zero MiB), then send them */
            for (int i = 0; i < PAGES_PER_ROUND; i++) {
                uint64_t page;
                do page = rng_next(&dirty) % (len / PAGE);
                while (page * PAGE / MIB == ZERO_MIB);
                uint64_t v = rng_next(&dirty);
                memcpy(host + page * PAGE + (v % (PAGE / 8)) * 8, &v, 8);
                pages[i] = page;
            }
        }
        TRY(conn, rdmamig_conn_iteration_begin(conn));
        if (r == 0) {
            for (uint64_t off = 0; off < len; off += MIB) TRY(conn, rdmamig_conn_save(conn, 0, off, MIB));
        } else {
            for (int i = 0; i < PAGES_PER_ROUND; i++) TRY(conn, rdmamig_conn_save(conn, 0, pages[i] * PAGE, PAGE));
        }
        TRY(conn, rdmamig_conn_iteration_end(conn));
        /* Every other round's payload goes out after a pause, so some windows wake the loop alone. */
        if (r % 2) usleep(50000);
        for (size_t i = 0; i < piece_len(r); i++) piece[i] = payload_byte(sent + i);
        TRY(conn, rdmamig_conn_put(conn, piece, piece_len(r)));
        TRY(conn, rdmamig_conn_flush(conn));
        sent += piece_len(r);
    }
    EXPECT(sent == plen);
    uint64_t hash = fnv1a(FNV_OFFSET, host, len);
    TRY(conn, rdmamig_conn_put(conn, &hash, sizeof hash));
    EXPECT(!fd_readable(fd));
    TRY(conn, rdmamig_conn_close(conn)); /* RDMAMIG_OK: the destination acknowledged the end */
    printf("source: %u MiB, %d rounds, %zu stream bytes sent, completed\n", mib, ROUNDS,
           sizeof header + plen + sizeof hash);
    rc = 0;
fail:
    if (rc != 0 && conn) rdmamig_conn_abort(conn);
    rdmamig_conn_free(conn);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    free(piece);
    if (host) munmap(host, len);
    return rc;
}

/* run_pair's two ends. */
struct run {
    unsigned mib;
};

static int run_destination(void *arg, int wr) {
    return destination(((struct run *)arg)->mib, wr);
}

static int run_source(void *arg, uint16_t port, int rd) {
    (void)rd;
    return source(((struct run *)arg)->mib, port);
}

int main(int argc, char **argv) {
    who = "poll-loop";
    unsigned mib = 64;
    double bound_ms = 200;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
            mib = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--bound-ms") == 0 && i + 1 < argc)
            bound_ms = strtod(argv[++i], NULL);
        else {
            fprintf(stderr, "usage: %s [--mib N] [--bound-ms MS]\n", argv[0]);
            return 2;
        }
    }
    if (mib < ZERO_MIB + 2) mib = ZERO_MIB + 2;
    bound_s = bound_ms / 1e3;

    struct run run = {mib};
    return run_pair(run_destination, run_source, &run, WATCHDOG_S);
}
