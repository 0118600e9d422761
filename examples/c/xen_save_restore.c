/* xen_save_restore.c -- integration example (docs/integration/xen-save-restore.md):
 * a save/restore loop in the style of Xen's toolstack (libxenguest's
 * xc_domain_save / xc_domain_restore, migration stream v2): precopy rounds
 * over the log-dirty bitmap, pages sent in batches of at most 1024 pfns, a
 * final round with the domain suspended, then the domain's context records
 * and END. The pages go by RDMA (rdmamig_conn_save_ranges per batch, or
 * rdmamig_conn_save_bitmap for a whole bitmap); the records go in the stream
 * (rdmamig_conn_put, read back with rdmamig_conn_get).
 *
 *   xen_save_restore [--mib N]     RXE_VM_IP: the RDMA address (198.18.0.1)
 *
 * fork(): the child restores (destination), the parent saves (source). The
 * restore side rebuilds the expected domain from the same seeds and compares
 * every byte of memory and of the context records. Exit status 0 only if
 * all are identical and the migration ended RDMAMIG_END_COMPLETED.
 *
 * Build: cc -std=c11 xen_save_restore.c $(pkg-config --cflags --libs rdmamig)
 * (in this repository: make c-tests, as target/c-tests/rdma_test_example_xen_save_restore). */
#define _GNU_SOURCE
#include <rdmamig.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096u
#define MIB (UINT64_C(1) << 20)
#define TIMEOUT_MS 60000
#define MAX_BATCH_SIZE 1024 /* pfns per batch, as libxenguest */
#define LIVE_ROUNDS 3       /* rounds with the domain running, then the suspended one */
#define PAGES_PER_RUN 300   /* pages the domain dirties during each live round */

/* ------------------------------------------------- the stream's records */

/* Image header, then records: u32 type, u32 body length, body padded to 8
 * bytes (little-endian, as Xen's v2 stream on x86). */
#define IHDR_MARKER UINT64_C(0xffffffffffffffff)
#define IHDR_ID 0x58454E46u /* "XENF" */
#define IHDR_VERSION 3
enum {
    REC_END = 0x00,
    REC_HVM_CONTEXT = 0x09,
    REC_HVM_PARAMS = 0x0a,
    /* Not a Xen record: the pages of round `round` went by RDMA in one
     * iteration window; the restore side waits for `windows` windows. */
    REC_RDMA_ROUND = 0x7f000001,
};
struct rec_hdr {
    uint32_t type, length;
};
struct rdma_round {
    uint32_t round, batches;
    uint64_t pages, windows;
};
struct hvm_param {
    uint64_t index, value;
};

/* ------------------------------------------------------- the fake domain */

/* Guest-physical memory: pfns [0, low) in "ram.low", [low, total) in
 * "ram.high" (above the MMIO hole, at 4 GiB). */
struct domain {
    uint8_t *mem[2];
    uint64_t pages[2]; /* per block */
    uint64_t total;    /* pfns */
    uint8_t *versions; /* per pfn: how many times the domain wrote it */
    uint64_t *logdirty;
    uint64_t rng;
};

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Pfn `pfn` as written for the `version`-th time; every fourth MiB starts as zeros. */
static void page_content(uint8_t *out, uint64_t pfn, uint8_t version) {
    if (version == 0 && (pfn * PAGE / MIB) % 4 == 1) {
        memset(out, 0, PAGE);
        return;
    }
    uint64_t s = pfn << 8 ^ version ^ UINT64_C(0xC2B2AE3D27D4EB4F);
    for (unsigned i = 0; i < PAGE; i += 8) {
        uint64_t v = xorshift(&s);
        memcpy(out + i, &v, 8);
    }
}

static uint8_t *pfn_ptr(struct domain *d, uint64_t pfn) {
    return pfn < d->pages[0] ? d->mem[0] + pfn * PAGE : d->mem[1] + (pfn - d->pages[0]) * PAGE;
}

static int domain_init(struct domain *d, unsigned mib, int fill) {
    memset(d, 0, sizeof *d);
    d->pages[0] = (uint64_t)(mib - mib / 4) * MIB / PAGE;
    d->pages[1] = (uint64_t)(mib / 4) * MIB / PAGE;
    d->total = d->pages[0] + d->pages[1];
    d->rng = UINT64_C(0x0DDBA115);
    d->versions = calloc(d->total, 1);
    d->logdirty = calloc((d->total + 63) / 64, 8);
    if (!d->versions || !d->logdirty) return -1;
    for (int b = 0; b < 2; b++) {
        d->mem[b] = mmap(NULL, d->pages[b] * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (d->mem[b] == MAP_FAILED) return -1;
        if (!fill) memset(d->mem[b], 0x55, d->pages[b] * PAGE); /* restore side: garbage */
    }
    if (fill)
        for (uint64_t pfn = 0; pfn < d->total; pfn++) page_content(pfn_ptr(d, pfn), pfn, 0);
    return 0;
}

static void domain_free(struct domain *d) {
    for (int b = 0; b < 2; b++)
        if (d->mem[b] && d->mem[b] != MAP_FAILED) munmap(d->mem[b], d->pages[b] * PAGE);
    free(d->versions);
    free(d->logdirty);
}

/* The domain runs: dirties PAGES_PER_RUN pfns (the page, then its log-dirty
 * bit). With `write` 0 (the restore side) it only replays which pfns. */
static void domain_run(struct domain *d, int write) {
    for (int n = 0; n < PAGES_PER_RUN; n++) {
        uint64_t pfn = (xorshift(&d->rng) >> 8) % d->total;
        uint8_t v = ++d->versions[pfn];
        if (write) {
            page_content(pfn_ptr(d, pfn), pfn, v);
            d->logdirty[pfn / 64] |= UINT64_C(1) << (pfn % 64);
        }
    }
}

/* The domain's context: an HVM context blob and some HVM params. */
#define HVM_CONTEXT_SIZE 9000
static void hvm_context(uint8_t *out) {
    uint64_t s = UINT64_C(0xC0DEC0DE);
    for (unsigned i = 0; i < HVM_CONTEXT_SIZE; i++) out[i] = (uint8_t)xorshift(&s);
}
static const struct hvm_param hvm_params[] = {{1, 0xfeedf00d}, {2, 0x1000}, {12, 7}, {18, UINT64_C(0xfee00000)}};

/* ------------------------------------------------------------- helpers */

static const char *rdma_ip(void) {
    const char *ip = getenv("RXE_VM_IP");
    return ip && *ip ? ip : "198.18.0.1";
}

static void fail_msg(const char *who, const char *what, rdmamig_status st, const rdmamig_conn *conn) {
    char msg[512];
    if (conn)
        rdmamig_conn_error_message(conn, msg, sizeof msg);
    else
        rdmamig_last_error_message(msg, sizeof msg);
    fprintf(stderr, "xen_save_restore: %s: FAIL %s: %s: %s\n", who, what, rdmamig_status_str(st), msg);
}

#define TRY(who, conn, call)                   \
    do {                                       \
        rdmamig_status st_ = (call);           \
        if (st_ != RDMAMIG_OK) {               \
            fail_msg(who, #call, st_, (conn)); \
            goto out;                          \
        }                                      \
    } while (0)

static rdmamig_ram *registry(struct domain *d) {
    static const char *names[2] = {"ram.low", "ram.high"};
    static const uint64_t gpa[2] = {0, UINT64_C(1) << 32};
    rdmamig_ram *ram = rdmamig_ram_new();
    for (int b = 0; ram && b < 2; b++)
        if (rdmamig_ram_add_block(ram, names[b], d->mem[b], gpa[b], d->pages[b] * PAGE, NULL) != RDMAMIG_OK) {
            rdmamig_ram_free(ram);
            return NULL;
        }
    return ram;
}

/* Appends one record (header, body, padding to 8 bytes) to the stream. */
static rdmamig_status write_record(rdmamig_conn *conn, uint32_t type, const void *body, uint32_t len) {
    static const uint8_t pad[8];
    struct rec_hdr h = {type, len};
    rdmamig_status st = rdmamig_conn_put(conn, &h, sizeof h);
    if (st == RDMAMIG_OK) st = rdmamig_conn_put(conn, body, len);
    if (st == RDMAMIG_OK) st = rdmamig_conn_put(conn, pad, (8 - len % 8) % 8);
    return st;
}

/* ---------------------------------------------------------------- save */

/* A batch of pfns (libxenguest's add_to_batch / flush_batch): each pfn
 * becomes a range of its block, consecutive pfns one range. */
struct batch {
    rdmamig_range r[MAX_BATCH_SIZE];
    size_t n, pfns;
    uint64_t last_pfn;
    uint32_t batches;
};

static rdmamig_status flush_batch(const rdmamig_conn *conn, struct batch *b) {
    if (b->pfns == 0) return RDMAMIG_OK;
    rdmamig_status st = rdmamig_conn_save_ranges(conn, b->r, b->n); /* queues: returns at once */
    b->n = b->pfns = 0;
    b->batches++;
    return st;
}

static rdmamig_status add_to_batch(const rdmamig_conn *conn, struct domain *d, struct batch *b, uint64_t pfn) {
    uint32_t blk = pfn >= d->pages[0];
    uint64_t off = (blk ? pfn - d->pages[0] : pfn) * PAGE;
    if (b->n > 0 && pfn == b->last_pfn + 1 && b->r[b->n - 1].block == blk)
        b->r[b->n - 1].length += PAGE;
    else
        b->r[b->n++] = (rdmamig_range){.block = blk, .offset = off, .length = PAGE};
    b->last_pfn = pfn;
    if (++b->pfns == MAX_BATCH_SIZE) return flush_batch(conn, b);
    return RDMAMIG_OK;
}

/* The stream's image header (big-endian, as Xen's). */
static rdmamig_status write_image_header(rdmamig_conn *conn) {
    uint8_t h[24] = {0};
    uint64_t marker = IHDR_MARKER;
    memcpy(h, &marker, 8);
    h[8] = IHDR_ID >> 24, h[9] = IHDR_ID >> 16 & 0xff, h[10] = IHDR_ID >> 8 & 0xff, h[11] = IHDR_ID & 0xff;
    h[15] = IHDR_VERSION;
    return rdmamig_conn_put(conn, h, sizeof h);
}

static int save(unsigned mib, uint16_t port) {
    struct domain d;
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = NULL;
    rdmamig_conn *conn = NULL;
    struct batch *batch = calloc(1, sizeof *batch);
    uint64_t *taken = NULL, words = 0;
    uint8_t *ctx = malloc(HVM_CONTEXT_SIZE);
    int rc = 1;
    if (domain_init(&d, mib, 1) != 0 || !cfg || !batch || !ctx) goto out;
    words = (d.total + 63) / 64;
    taken = calloc(words, 8);
    ram = registry(&d);
    if (!ram || !taken) goto out;
    TRY("save", NULL, rdmamig_connect(rdma_ip(), port, cfg, ram, &conn));
    TRY("save", conn, write_image_header(conn));

    /* Live rounds: round 0 every pfn, then the pfns the log-dirty bitmap
     * names (taken and cleaned at the round's start, as
     * XEN_DOMCTL_SHADOW_OP_CLEAN); the domain keeps running and dirtying. */
    for (uint32_t round = 0; round <= LIVE_ROUNDS; round++) {
        int suspended = round == LIVE_ROUNDS; /* suspend_domain() before the last round */
        uint64_t pages = 0;
        batch->batches = 0;
        TRY("save", conn, rdmamig_conn_iteration_begin(conn));
        for (uint64_t w = 0; w < words; w++) {
            taken[w] = round == 0 ? ~UINT64_C(0) : d.logdirty[w];
            d.logdirty[w] = 0;
        }
        if (suspended) {
            /* The domain is suspended: the last bitmap as it is, one call per block. */
            for (uint64_t w = 0; w < words; w++) pages += (uint64_t)__builtin_popcountll(taken[w]);
            TRY("save", conn, rdmamig_conn_save_bitmap(conn, 0, taken, 0, d.pages[0], PAGE));
            /* ram.high starts at pfn pages[0], a multiple of 64: its bits start on a word. */
            TRY("save", conn, rdmamig_conn_save_bitmap(conn, 1, taken + d.pages[0] / 64, 0, d.pages[1], PAGE));
        } else {
            int ran = 0;
            for (uint64_t pfn = 0; pfn < d.total; pfn++) {
                if (!(taken[pfn / 64] >> (pfn % 64) & 1)) continue;
                TRY("save", conn, add_to_batch(conn, &d, batch, pfn));
                pages++;
                if (!ran && batch->batches > 0) {
                    /* The domain runs while the round goes on: pages already
                     * queued may be read before or after it writes them;
                     * either way they are dirty again for the next round. */
                    domain_run(&d, 1);
                    ran = 1;
                }
            }
            TRY("save", conn, flush_batch(conn, batch));
            if (!ran) domain_run(&d, 1);
        }
        TRY("save", conn, rdmamig_conn_iteration_end(conn));
        struct rdma_round rr = {round, batch->batches, pages, (uint64_t)round + 1};
        TRY("save", conn, write_record(conn, REC_RDMA_ROUND, &rr, sizeof rr));
    }

    hvm_context(ctx);
    TRY("save", conn, write_record(conn, REC_HVM_CONTEXT, ctx, HVM_CONTEXT_SIZE));
    TRY("save", conn, write_record(conn, REC_HVM_PARAMS, hvm_params, sizeof hvm_params));
    TRY("save", conn, write_record(conn, REC_END, NULL, 0));
    TRY("save", conn, rdmamig_conn_flush(conn)); /* every record out, so that the counters include them */
    rdmamig_stats st = {.size = sizeof st};
    TRY("save", conn, rdmamig_conn_get_stats(conn, &st));
    TRY("save", conn, rdmamig_conn_close(conn)); /* RDMAMIG_OK: the restore side acknowledged the end */
    printf("xen_save_restore: save: %u MiB, %d rounds, %" PRIu64 " bytes written, %" PRIu64 " zero ranges, %" PRIu64
           " stream bytes, completed\n",
           mib, LIVE_ROUNDS + 1, st.bytes_written, st.zero_chunks, st.stream_bytes);
    rc = 0;
out:
    if (rc != 0 && conn) rdmamig_conn_abort(conn);
    rdmamig_conn_free(conn);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    free(batch);
    free(taken);
    free(ctx);
    domain_free(&d);
    return rc;
}

/* ------------------------------------------------------------- restore */

/* Reads exactly n stream bytes (rdmamig_conn_get returns what is there). */
static rdmamig_status read_exact(const rdmamig_conn *conn, void *buf, size_t n) {
    uint8_t *p = buf;
    while (n > 0) {
        size_t got = 0;
        rdmamig_status st = rdmamig_conn_get(conn, p, n, TIMEOUT_MS, &got);
        if (st != RDMAMIG_OK) return st == RDMAMIG_END_COMPLETED ? RDMAMIG_ERR_PROTOCOL : st; /* ended early */
        p += got;
        n -= got;
    }
    return RDMAMIG_OK;
}

static int restore(unsigned mib, int port_fd) {
    struct domain d;
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = NULL;
    rdmamig_listener *l = NULL;
    rdmamig_conn *conn = NULL;
    uint8_t *body = NULL, *want = malloc(HVM_CONTEXT_SIZE), page[PAGE];
    int rc = 1, have_ctx = 0, have_params = 0;
    uint32_t rounds = 0;
    if (domain_init(&d, mib, 0) != 0 || !cfg || !want) goto out;
    ram = registry(&d);
    if (!ram) goto out;
    TRY("restore", NULL, rdmamig_listener_new(rdma_ip(), 0, cfg, &l));
    uint16_t port = rdmamig_listener_port(l);
    if (write(port_fd, &port, sizeof port) != (ssize_t)sizeof port) goto out;
    close(port_fd);
    TRY("restore", NULL, rdmamig_listener_accept(l, ram, TIMEOUT_MS, &conn));

    uint8_t ihdr[24];
    TRY("restore", conn, read_exact(conn, ihdr, sizeof ihdr));
    if (ihdr[8] != 'X' || ihdr[9] != 'E' || ihdr[10] != 'N' || ihdr[11] != 'F' || ihdr[15] != IHDR_VERSION) {
        fprintf(stderr, "xen_save_restore: restore: FAIL bad image header\n");
        goto out;
    }
    /* xc_domain_restore's loop: records until END. */
    for (;;) {
        struct rec_hdr h;
        TRY("restore", conn, read_exact(conn, &h, sizeof h));
        uint32_t padded = (h.length + 7) & ~7u;
        free(body);
        body = malloc(padded ? padded : 1);
        if (!body) goto out;
        TRY("restore", conn, read_exact(conn, body, padded));
        if (h.type == REC_END) break;
        if (h.type == REC_RDMA_ROUND && h.length == sizeof(struct rdma_round)) {
            struct rdma_round rr;
            memcpy(&rr, body, sizeof rr);
            uint64_t done = 0; /* the round's pages are in place once its window is complete */
            TRY("restore", conn, rdmamig_conn_wait_iteration(conn, rr.windows, TIMEOUT_MS, &done));
            rounds++;
        } else if (h.type == REC_HVM_CONTEXT) {
            hvm_context(want);
            have_ctx = h.length == HVM_CONTEXT_SIZE && memcmp(body, want, HVM_CONTEXT_SIZE) == 0;
        } else if (h.type == REC_HVM_PARAMS) {
            have_params = h.length == sizeof hvm_params && memcmp(body, hvm_params, sizeof hvm_params) == 0;
        } else {
            fprintf(stderr, "xen_save_restore: restore: FAIL unknown record %#x\n", h.type);
            goto out;
        }
    }
    if (!have_ctx || !have_params || rounds != LIVE_ROUNDS + 1) {
        fprintf(stderr, "xen_save_restore: restore: FAIL records: context %s, params %s, %u rounds\n",
                have_ctx ? "identical" : "missing or different", have_params ? "identical" : "missing or different",
                rounds);
        goto out;
    }
    /* END read: only the completion handshake says all memory arrived. */
    rdmamig_status end = rdmamig_conn_wait_end(conn, TIMEOUT_MS);
    if (end != RDMAMIG_END_COMPLETED) {
        fail_msg("restore", "rdmamig_conn_wait_end", end, conn);
        goto out;
    }
    /* The domain as the save side left it: replay its runs (one per live
     * round), then compare every pfn. */
    for (int r = 0; r < LIVE_ROUNDS; r++) domain_run(&d, 0);
    for (uint64_t pfn = 0; pfn < d.total; pfn++) {
        page_content(page, pfn, d.versions[pfn]);
        if (memcmp(page, pfn_ptr(&d, pfn), PAGE) != 0) {
            fprintf(stderr, "xen_save_restore: restore: FAIL pfn %#" PRIx64 " (version %u) differs\n", pfn,
                    d.versions[pfn]);
            goto out;
        }
    }
    printf("xen_save_restore: restore: memory identical (%u MiB, %" PRIu64 " pfns in 2 blocks), %u rounds, "
           "context records identical, completed\n",
           mib, d.total, rounds);
    rc = 0;
out:
    if (rc != 0 && conn) rdmamig_conn_abort(conn);
    rdmamig_conn_free(conn);
    rdmamig_listener_free(l);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    free(body);
    free(want);
    domain_free(&d);
    return rc;
}

int main(int argc, char **argv) {
    unsigned mib = 32;
    if (argc == 3 && strcmp(argv[1], "--mib") == 0 && atoi(argv[2]) >= 4 && atoi(argv[2]) % 4 == 0)
        mib = (unsigned)atoi(argv[2]);
    else if (argc != 1) {
        fprintf(stderr, "usage: %s [--mib N (a multiple of 4)]\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int fds[2];
    if (pipe(fds) != 0) return 1;
    fflush(NULL);
    pid_t child = fork(); /* before any rdmamig call: fork() before connections */
    if (child < 0) return 1;
    if (child == 0) {
        close(fds[0]);
        alarm(300);
        _exit(restore(mib, fds[1]));
    }
    close(fds[1]);
    alarm(300);
    uint16_t port = 0;
    int rc = read(fds[0], &port, sizeof port) == (ssize_t)sizeof port ? save(mib, port) : 1;
    int status = 0;
    waitpid(child, &status, 0);
    int ok = rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("xen_save_restore: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
