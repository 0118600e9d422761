/* What the RDMA test programs (rdma_test_*.c) share: a clock, a
 * deterministic pattern, a hash, the rxe address, failure reporting
 * ("<who>: FAIL ...") with TRY and EXPECT, which jump to the function's
 * `fail:` label, one-block guest RAM (map_ram, registry), and the
 * two-process run (run_pair). Each program sets
 * `who` to the role printing. */
#ifndef RDMAMIG_C_TESTS_RDMA_UTIL_H
#define RDMAMIG_C_TESTS_RDMA_UTIL_H

#include "rdmamig.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *who = "rdma-test";

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* xorshift64*: a fast deterministic pattern. */
static inline uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * UINT64_C(0x2545F4914F6CDD1D);
}

/* splitmix64's finaliser. */
static inline uint64_t mix(uint64_t x) {
    x += UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

/* Word `w` of `page` at `version` (the post-copy tests: 0 is what pre-copy
 * sends, 1 the content after the change): guest memory that is a function of
 * page, word and version, so each side knows it without a copy. */
static inline uint64_t word(uint64_t page, uint64_t w, uint64_t version) {
    return mix((page << 20) ^ (w << 2) ^ version);
}

/* FNV-1a over `n` bytes, continuing from `h` (FNV_OFFSET to start). */
#define FNV_OFFSET UINT64_C(0xcbf29ce484222325)
static inline uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

/* The guest's RDMA address: $RXE_VM_IP, else rxe-vm.sh's default. */
static inline const char *rdma_ip(void) {
    const char *ip = getenv("RXE_VM_IP");
    return ip && *ip ? ip : "198.18.0.1";
}

/* Prints "<who>: FAIL <what>: <status>: <message>" (message from conn, or the thread's last error). */
static inline void report(const char *what, rdmamig_status st, const rdmamig_conn *conn) {
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

/* `len` bytes of private anonymous memory standing in for guest RAM, every
 * byte `fill` (or untouched, zero and not yet populated, with fill < 0). */
static inline uint8_t *map_ram(uint64_t len, int fill) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return NULL;
    }
    if (fill >= 0) memset(p, fill, len);
    return p;
}

/* A registry of one block, "pc.ram", over `host` (NULL, reported, on failure). */
static inline rdmamig_ram *registry(uint8_t *host, uint64_t len) {
    rdmamig_ram *ram = rdmamig_ram_new();
    uint32_t idx;
    if (!ram || rdmamig_ram_add_block(ram, "pc.ram", host, 0, len, &idx) != RDMAMIG_OK || idx != 0) {
        report("registry", RDMAMIG_ERR_INVALID_ARGUMENT, NULL);
        rdmamig_ram_free(ram);
        return NULL;
    }
    return ram;
}

/* The two-process run: fork() (before any rdmamig call); the child runs
 * `destination(arg, wr)`, which writes its port (a uint16_t) to `wr` first
 * and may write more; the parent reads the port and runs `source(arg, port,
 * rd)` with the rest of the pipe. Both under a `watchdog_s` alarm; a failed
 * source ends the destination (SIGTERM). Prints "N passed, M failed" and
 * returns main's exit status. */
static inline int run_pair(int (*destination)(void *arg, int wr), int (*source)(void *arg, uint16_t port, int rd),
                           void *arg, unsigned watchdog_s) {
    int up[2];
    if (pipe(up) != 0) {
        perror("pipe");
        return EXIT_FAILURE;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return EXIT_FAILURE;
    }
    if (child == 0) {
        alarm(watchdog_s);
        close(up[0]);
        int rc = destination(arg, up[1]);
        fflush(stdout); /* _exit does not flush stdio */
        _exit(rc);
    }
    alarm(watchdog_s);
    close(up[1]);
    uint16_t port = 0;
    ssize_t n = read(up[0], &port, sizeof port);
    int src = 1;
    if (n == (ssize_t)sizeof port && port != 0)
        src = source(arg, port, up[0]);
    else
        fprintf(stderr, "source: FAIL the destination did not start listening\n");
    close(up[0]);
    if (src != 0) {
        kill(child, SIGTERM);
        kill(child, SIGCONT); /* a stopped child takes SIGTERM only once continued */
    }
    int status = 0;
    waitpid(child, &status, 0);
    int dst = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    int passed = (src == 0) + (dst == 0), failed = 2 - passed;
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
