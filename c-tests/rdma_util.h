/* What the RDMA test programs (rdma_test_*.c) share: a clock, a
 * deterministic pattern, a hash, the rxe address, and failure reporting
 * ("<who>: FAIL ...") with TRY and EXPECT, which jump to the function's
 * `fail:` label. Each program sets `who` to the role printing. */
#ifndef RDMAMIG_C_TESTS_RDMA_UTIL_H
#define RDMAMIG_C_TESTS_RDMA_UTIL_H

#include "rdmamig.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const char *who = "rdma-test";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* xorshift64*: a fast deterministic pattern. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * UINT64_C(0x2545F4914F6CDD1D);
}

/* FNV-1a over `n` bytes, continuing from `h` (FNV_OFFSET to start). */
#define FNV_OFFSET UINT64_C(0xcbf29ce484222325)
static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

/* The guest's RDMA address: $RXE_VM_IP, else rxe-vm.sh's default. */
static const char *rdma_ip(void) {
    const char *ip = getenv("RXE_VM_IP");
    return ip && *ip ? ip : "198.18.0.1";
}

/* Prints "<who>: FAIL <what>: <status>: <message>" (message from conn, or the thread's last error). */
static void report(const char *what, rdmamig_status st, const rdmamig_conn *conn) {
    char msg[512];
    if (conn)
        rdmamig_conn_error_message(conn, msg, sizeof msg);
    else
        rdmamig_last_error_message(msg, sizeof msg);
    fprintf(stderr, "%s: FAIL %s: %s: %s\n", who, what, rdmamig_status_str(st), msg);
}

#define TRY(conn, call)                                    \
    do {                                                   \
        rdmamig_status st_ = (call);                       \
        if (st_ != RDMAMIG_OK) {                           \
            report(#call, st_, (conn));                    \
            goto fail;                                     \
        }                                                  \
    } while (0)

#define EXPECT(cond)                                                                  \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s: FAIL %s:%d: %s\n", who, __FILE__, __LINE__, #cond); \
            goto fail;                                                                \
        }                                                                             \
    } while (0)

#endif
