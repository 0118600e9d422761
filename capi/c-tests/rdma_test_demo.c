/* rdma_test_demo: a small C "hypervisor" live-migrating guest RAM and device
 * state over RDMA with librdmamig, through the public header only. It is the
 * C RDMA integration test (the rxe test runner runs every
 * target/c-tests/rdma_test_* with no arguments) and the `make demo` demo.
 *
 * One migration: fork(); the child is the destination, the parent the
 * source, over rdma_cm on $RXE_VM_IP (default 198.18.0.1). The destination
 * listens on port 0 and passes the port up a pipe.
 *
 * Source: N MiB of "guest RAM" in two blocks ("pc.ram" N-8 MiB, "vga.vram"
 * 8 MiB) filled with a pseudo-random pattern except some all-zero MiB-aligned
 * regions. A writer thread keeps dirtying random pages (write first, then set
 * the page's bit in an atomic dirty bitmap) while precopy rounds send the
 * dirty pages between iteration_begin/end: round 0 every page from two
 * threads at once (one rdmamig_conn_save per 4 KiB page, and one
 * rdmamig_conn_save_ranges of a MiB per range), then DIRTY_ROUNDS rounds of
 * the dirty pages (the bitmap taken, one rdmamig_conn_save_bitmap per
 * block). Then the writer stops, a final
 * round sends the last dirty pages (timed), and the stream carries a header,
 * a device-state blob (odd-sized puts) and the FNV-1a hash of the source's
 * whole RAM (writev_buffer of the stream callbacks); flush, close.
 *
 * Destination: RAM starts as 0xAA garbage (so zero ranges must really be
 * zeroed). Reads the stream with the rdmamig_stream_ops callbacks in
 * odd-sized pieces, waits for every round and for the completion handshake
 * (rdmamig_conn_wait_end must say RDMAMIG_END_COMPLETED before the RAM is
 * trusted), then compares the hash of its RAM, the blob, the zero regions and
 * its counters; its close then returns RDMAMIG_OK, as does the source's.
 *
 *   rdma_test_demo [--mib N] [--pin-all] [-v]
 *
 * With no arguments: a dynamic-registration and a pin-all migration of
 * 128 MiB each. -v: a second line of counters per migration. Last line: "N passed, M failed"; exit status 0 if all passed.
 */
#define _GNU_SOURCE
#include "rdmamig.h"
#include "rdma_util.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (UINT64_C(1) << 20)
#define PAGE UINT64_C(4096)
#define VRAM_MIB 8
#define MIN_MIB 48
#define DIRTY_ROUNDS 4
/* Pages the writer dirties per millisecond at most. */
#define DIRTY_PER_MS 8
#define BLOB_SIZE (1024 * 1024 + 4097)
#define STREAM_MAGIC UINT64_C(0x52444d414d494731) /* "RDMAMIG1" */
#define TIMEOUT_MS 60000
/* Each migration process kills itself after this long (a hung engine). */
#define WATCHDOG_S 400

/* ---------------------------------------------------------------- helpers */

static void blob_fill(uint8_t *blob, size_t n) {
    uint64_t s = UINT64_C(0xB10B5EED);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = rng_next(&s);
        memcpy(blob + i, &v, n - i < 8 ? n - i : 8);
    }
}

/* ------------------------------------------------------------ guest RAM */

struct block {
    const char *name;
    uint64_t len;
    uint8_t *host;
    uint64_t first_page; /* global page index of the block's first page */
    uint32_t index;      /* in the rdmamig_ram registry */
};

struct zero_region {
    int block;
    uint64_t start, len; /* MiB-aligned */
};

struct guest {
    unsigned mib;
    struct block blocks[2];
    struct zero_region zeros[3];
    uint64_t pages;
};

static void guest_layout(struct guest *g, unsigned mib) {
    memset(g, 0, sizeof *g);
    g->mib = mib;
    uint64_t pc = (uint64_t)(mib - VRAM_MIB) * MIB;
    g->blocks[0] = (struct block){.name = "pc.ram", .len = pc};
    g->blocks[1] = (struct block){.name = "vga.vram", .len = VRAM_MIB * MIB, .first_page = pc / PAGE};
    g->zeros[0] = (struct zero_region){0, 8 * MIB, 8 * MIB};
    g->zeros[1] = (struct zero_region){0, (pc / 2) & ~(MIB - 1), 4 * MIB};
    g->zeros[2] = (struct zero_region){1, 2 * MIB, 2 * MIB};
    g->pages = (pc + VRAM_MIB * MIB) / PAGE;
}

static int guest_map(struct guest *g, int fill) {
    for (int b = 0; b < 2; b++) {
        void *p = mmap(NULL, g->blocks[b].len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return -1;
        }
        g->blocks[b].host = p;
        if (fill >= 0) memset(p, fill, g->blocks[b].len);
    }
    return 0;
}

static void guest_unmap(struct guest *g) {
    for (int b = 0; b < 2; b++)
        if (g->blocks[b].host) munmap(g->blocks[b].host, g->blocks[b].len);
}

static int in_zero_region(const struct guest *g, int block, uint64_t off) {
    for (int z = 0; z < 3; z++)
        if (g->zeros[z].block == block && off >= g->zeros[z].start && off < g->zeros[z].start + g->zeros[z].len)
            return 1;
    return 0;
}

static void page_locate(const struct guest *g, uint64_t page, int *block, uint64_t *off) {
    *block = page >= g->blocks[1].first_page;
    *off = (page - g->blocks[*block].first_page) * PAGE;
}

/* Source RAM: the pattern everywhere except the zero regions (whole MiBs). */
static void guest_pattern(struct guest *g) {
    uint64_t s = UINT64_C(0x5EED0001);
    for (int b = 0; b < 2; b++) {
        struct block *bl = &g->blocks[b];
        for (uint64_t mb = 0; mb < bl->len; mb += MIB) {
            if (in_zero_region(g, b, mb)) continue;
            uint64_t *w = (uint64_t *)(bl->host + mb);
            for (uint64_t i = 0; i < MIB / 8; i++) w[i] = rng_next(&s);
        }
    }
}

static uint64_t guest_hash(const struct guest *g) {
    uint64_t h = FNV_OFFSET;
    for (int b = 0; b < 2; b++) h = fnv1a(h, g->blocks[b].host, g->blocks[b].len);
    return h;
}

/* Registers the blocks; each side uses other RAM offsets (the library translates). */
static rdmamig_ram *guest_registry(struct guest *g, uint64_t base) {
    rdmamig_ram *ram = rdmamig_ram_new();
    if (!ram) return NULL;
    uint64_t offsets[2] = {base, base + (UINT64_C(1) << 32)};
    for (int b = 0; b < 2; b++) {
        rdmamig_status st = rdmamig_ram_add_block(ram, g->blocks[b].name, g->blocks[b].host, offsets[b],
                                                  g->blocks[b].len, &g->blocks[b].index);
        if (st != RDMAMIG_OK) {
            char msg[256];
            rdmamig_last_error_message(msg, sizeof msg);
            fprintf(stderr, "rdmamig_ram_add_block(%s): %s: %s\n", g->blocks[b].name, rdmamig_status_str(st), msg);
            rdmamig_ram_free(ram);
            return NULL;
        }
    }
    if (rdmamig_ram_block_count(ram) != 2) {
        fprintf(stderr, "rdmamig_ram_block_count != 2\n");
        rdmamig_ram_free(ram);
        return NULL;
    }
    return ram;
}

/* ------------------------------------------------------------- reporting */

static int verbose;

/* The status of a call that must fail with `want` and say something containing `text`. */
static int expect_error(rdmamig_status got, rdmamig_status want, const rdmamig_conn *conn, const char *text,
                        const char *what) {
    char msg[512];
    rdmamig_conn_error_message(conn, msg, sizeof msg);
    if (got != want || !strstr(msg, text)) {
        fprintf(stderr, "%s: FAIL %s gave %s (\"%s\"), want %s and a message with \"%s\"\n", who, what,
                rdmamig_status_str(got), msg, rdmamig_status_str(want), text);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- destination */

/* Reads exactly n bytes through the stream callbacks, in odd-sized pieces. */
static int stream_read(const rdmamig_stream_ops *ops, void *buf, size_t n) {
    static const size_t sizes[] = {1, 7, 4093, 65537, 3, 131071, 12345};
    static unsigned next;
    uint8_t *p = buf;
    while (n > 0) {
        size_t want = sizes[next++ % (sizeof sizes / sizeof sizes[0])];
        if (want > n) want = n;
        ssize_t got = ops->get_buffer(ops->opaque, p, 0, want);
        if (got < 0) {
            report("get_buffer", RDMAMIG_ERR_DISCONNECTED, ops->opaque);
            fprintf(stderr, "%s: get_buffer returned %zd (%s)\n", who, got, strerror((int)-got));
            return -1;
        }
        if (got == 0) {
            fprintf(stderr, "%s: FAIL unexpected end of stream (%zu bytes missing)\n", who, n);
            return -1;
        }
        if ((size_t)got > want) {
            fprintf(stderr, "%s: FAIL get_buffer returned %zd > %zu\n", who, got, want);
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

static int destination(unsigned mib, int pin_all, int port_fd) {
    who = "dest";
    struct guest g;
    guest_layout(&g, mib);
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = NULL;
    rdmamig_listener *listener = NULL;
    rdmamig_conn *conn = NULL;
    uint8_t *blob = NULL, *want_blob = NULL;
    uint16_t port = 0;
    int rc = 1;

    if (guest_map(&g, 0xAA) != 0 || !cfg) goto fail;
    ram = guest_registry(&g, UINT64_C(0x40000000));
    EXPECT(ram != NULL);
    TRY(NULL, rdmamig_config_set_pin_all(cfg, true)); /* allow what the source asks for */
    TRY(NULL, rdmamig_listener_new(rdma_ip(), 0, cfg, &listener));
    port = rdmamig_listener_port(listener);
    EXPECT(port != 0);
    if (write(port_fd, &port, sizeof port) != (ssize_t)sizeof port) {
        perror("write port");
        goto fail;
    }
    close(port_fd);
    port_fd = -1;

    TRY(NULL, rdmamig_listener_accept(listener, ram, TIMEOUT_MS, &conn));
    rdmamig_listener_free(listener);
    listener = NULL;
    rdmamig_ram_free(ram); /* the connection has its own copy */
    ram = NULL;

    bool neg_pin_all = false, neg_ext = false;
    TRY(conn, rdmamig_conn_negotiated(conn, &neg_pin_all, &neg_ext));
    EXPECT(neg_pin_all == (pin_all != 0));
    EXPECT(neg_ext);

    /* Role checks: a destination cannot save. */
    if (expect_error(rdmamig_conn_save(conn, 0, 0, PAGE), RDMAMIG_ERR_STATE, conn, "destination",
                     "rdmamig_conn_save on a destination") != 0)
        goto fail;

    rdmamig_stream_ops ops;
    TRY(conn, rdmamig_conn_stream_ops(conn, &ops));
    EXPECT(ops.opaque == conn && ops.get_buffer && ops.close && !ops.put_buffer && !ops.writev_buffer);

    uint64_t header[3];
    if (stream_read(&ops, header, sizeof header) != 0) goto fail;
    EXPECT(header[0] == STREAM_MAGIC);
    uint64_t rounds = header[1];
    EXPECT(header[2] == BLOB_SIZE);
    blob = malloc(BLOB_SIZE);
    want_blob = malloc(BLOB_SIZE);
    EXPECT(blob && want_blob);
    if (stream_read(&ops, blob, BLOB_SIZE) != 0) goto fail;
    uint64_t source_hash;
    if (stream_read(&ops, &source_hash, sizeof source_hash) != 0) goto fail;

    uint64_t done = 0;
    TRY(conn, rdmamig_conn_wait_iteration(conn, rounds, TIMEOUT_MS, &done));
    EXPECT(done == rounds);

    /* The whole stream was read; only the completion handshake says the
     * migration completed: the hypervisor checks it before it runs the guest. */
    rdmamig_status end = rdmamig_conn_wait_end(conn, TIMEOUT_MS);
    if (end != RDMAMIG_END_COMPLETED) {
        report("rdmamig_conn_wait_end", end, conn);
        goto fail;
    }
    /* And the stream ends (0, not -EIO) once the source has closed. */
    uint8_t extra;
    ssize_t got = ops.get_buffer(ops.opaque, &extra, 0, 1);
    if (got != 0) {
        report("get_buffer at the end", RDMAMIG_ERR_PROTOCOL, conn);
        fprintf(stderr, "dest: FAIL get_buffer after the last byte returned %zd, want 0\n", got);
        goto fail;
    }
    size_t n_end = 1;
    EXPECT(rdmamig_conn_get(conn, &extra, 1, 1, &n_end) == RDMAMIG_END_COMPLETED && n_end == 0);
    EXPECT(ops.close(ops.opaque) == 0);

    blob_fill(want_blob, BLOB_SIZE);
    EXPECT(memcmp(blob, want_blob, BLOB_SIZE) == 0);
    uint64_t hash = guest_hash(&g);
    if (hash != source_hash) {
        fprintf(stderr, "dest: FAIL RAM hash %016" PRIx64 " != source's %016" PRIx64 "\n", hash, source_hash);
        goto fail;
    }
    for (int z = 0; z < 3; z++) {
        const uint8_t *p = g.blocks[g.zeros[z].block].host + g.zeros[z].start;
        for (uint64_t i = 0; i < g.zeros[z].len; i++) {
            if (p[i] != 0) {
                fprintf(stderr, "dest: FAIL zero region %d: byte %" PRIu64 " is %#x\n", z, i, p[i]);
                goto fail;
            }
        }
    }

    rdmamig_stats st = {.size = 8};
    EXPECT(rdmamig_conn_get_stats(conn, &st) == RDMAMIG_ERR_INVALID_ARGUMENT);
    st.size = sizeof st;
    TRY(conn, rdmamig_conn_get_stats(conn, &st));
    EXPECT(st.size == sizeof st);
    EXPECT(st.stream_bytes == sizeof header + BLOB_SIZE + sizeof source_hash);
    EXPECT(st.iterations == rounds);
    if (!pin_all) EXPECT(st.chunks_registered > 0 && st.zero_chunks > 0);

    /* Closing a completed migration reports it completed. */
    TRY(conn, rdmamig_conn_close(conn));
    printf("dest: RAM identical (%u MiB), blob intact, migration completed\n", mib);
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
    free(blob);
    free(want_blob);
    guest_unmap(&g);
    return rc;
}

/* ---------------------------------------------------------------- source */

struct source {
    struct guest g;
    rdmamig_conn *conn;
    _Atomic uint64_t *dirty; /* one bit per page */
    uint64_t *taken;         /* the bits a round took from `dirty` */
    uint64_t dirty_words;
    atomic_bool stop;
    _Atomic uint64_t dirtied; /* pages, by the writer */
    double xfer_s;            /* time inside rounds */
};

static void *writer_main(void *arg) {
    struct source *s = arg;
    uint64_t r = UINT64_C(0xD1D1D1D1);
    const struct timespec ms = {0, 1000000};
    while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
        for (int k = 0; k < DIRTY_PER_MS; k++) {
            uint64_t page = rng_next(&r) % s->g.pages;
            int b;
            uint64_t off;
            page_locate(&s->g, page, &b, &off);
            if (in_zero_region(&s->g, b, off)) continue;
            uint64_t *w = (uint64_t *)(s->g.blocks[b].host + off);
            for (int i = 0; i < 8; i++) w[rng_next(&r) % (PAGE / 8)] = rng_next(&r);
            /* write first, then mark dirty: a round that misses the write sees the bit */
            atomic_fetch_or_explicit(&s->dirty[page / 64], UINT64_C(1) << (page % 64), memory_order_release);
            atomic_fetch_add_explicit(&s->dirtied, 1, memory_order_relaxed);
        }
        nanosleep(&ms, NULL);
    }
    return NULL;
}

static rdmamig_status save_page(const struct source *s, uint64_t page) {
    int b;
    uint64_t off;
    page_locate(&s->g, page, &b, &off);
    return rdmamig_conn_save(s->conn, s->g.blocks[b].index, off, PAGE);
}

struct saver {
    const struct source *s;
    int part; /* saves the pages of every other MiB */
    rdmamig_status st;
};

/* Part 0 saves its MiBs a page per call, part 1 as one array of ranges (a MiB each). */
static void *saver_main(void *arg) {
    struct saver *sv = arg;
    const struct guest *g = &sv->s->g;
    sv->st = RDMAMIG_OK;
    if (sv->part == 0) {
        for (uint64_t p = 0; p < g->pages && sv->st == RDMAMIG_OK; p++)
            if ((p * PAGE / MIB) % 2 == 0) sv->st = save_page(sv->s, p);
        return NULL;
    }
    size_t n = 0;
    rdmamig_range *ranges = calloc(g->pages * PAGE / MIB, sizeof *ranges);
    if (!ranges) {
        sv->st = RDMAMIG_ERR_INVALID_ARGUMENT;
        return NULL;
    }
    for (uint64_t p = 0; p < g->pages; p += MIB / PAGE) {
        if ((p * PAGE / MIB) % 2 == 0) continue;
        int b;
        uint64_t off;
        page_locate(g, p, &b, &off);
        ranges[n++] = (rdmamig_range){.block = g->blocks[b].index, .offset = off, .length = MIB};
    }
    sv->st = rdmamig_conn_save_ranges(sv->s->conn, ranges, n);
    free(ranges);
    return NULL;
}

static int source_self_checks(struct source *s, int in_window);

/* One precopy round: every page (from two threads at once), or the dirty ones. */
static int source_round(struct source *s, int all, uint64_t *sent) {
    *sent = 0;
    double start = now_s();
    TRY(s->conn, rdmamig_conn_iteration_begin(s->conn));
    if (all) {
        if (source_self_checks(s, 1) != 0) goto fail;
        struct saver sv[2] = {{s, 0, RDMAMIG_OK}, {s, 1, RDMAMIG_OK}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++) EXPECT(pthread_create(&t[i], NULL, saver_main, &sv[i]) == 0);
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
        for (int i = 0; i < 2; i++) TRY(s->conn, sv[i].st);
        *sent = s->g.pages;
    } else {
        /* The dirty bits taken, then each block's slice in one call (blocks
         * are whole MiBs, so each starts on a word). */
        for (uint64_t w = 0; w < s->dirty_words; w++) {
            s->taken[w] = atomic_exchange_explicit(&s->dirty[w], 0, memory_order_acquire);
            *sent += (uint64_t)__builtin_popcountll(s->taken[w]);
        }
        for (int b = 0; b < 2; b++) {
            const struct block *bl = &s->g.blocks[b];
            TRY(s->conn, rdmamig_conn_save_bitmap(s->conn, bl->index, s->taken + bl->first_page / 64, 0,
                                                  bl->len / PAGE, PAGE));
        }
    }
    TRY(s->conn, rdmamig_conn_iteration_end(s->conn));
    s->xfer_s += now_s() - start;
    return 0;
fail:
    return -1;
}

/* Lets the guest run until it dirtied `pages` more pages (at most 2 s), as
 * precopy rounds do not follow each other immediately. */
static void guest_runs(struct source *s, uint64_t pages) {
    uint64_t from = atomic_load(&s->dirtied);
    const struct timespec ms = {0, 1000000};
    for (int i = 0; i < 2000 && atomic_load(&s->dirtied) - from < pages; i++) nanosleep(&ms, NULL);
}

/* Checks that calls which do not fit the state or role fail with a message
 * (and do not break the connection). `in_window`: inside round 0's window. */
static int source_self_checks(struct source *s, int in_window) {
    size_t n = 0;
    char c;
    if (in_window) {
        if (expect_error(rdmamig_conn_save(s->conn, 7, 0, PAGE), RDMAMIG_ERR_INVALID_ARGUMENT, s->conn, "7",
                         "rdmamig_conn_save of block 7") != 0)
            return -1;
        if (expect_error(rdmamig_conn_save(s->conn, 1, VRAM_MIB * MIB - PAGE, 2 * PAGE),
                         RDMAMIG_ERR_INVALID_ARGUMENT, s->conn, "outside", "rdmamig_conn_save past the block end") != 0)
            return -1;
        rdmamig_range bad = {.block = 0, .reserved = 1, .offset = 0, .length = PAGE};
        if (expect_error(rdmamig_conn_save_ranges(s->conn, &bad, 1), RDMAMIG_ERR_INVALID_ARGUMENT, s->conn,
                         "reserved", "rdmamig_conn_save_ranges with reserved != 0") != 0)
            return -1;
        const uint64_t one = 1;
        if (expect_error(rdmamig_conn_save_bitmap(s->conn, 1, &one, VRAM_MIB * MIB / PAGE, 1, PAGE),
                         RDMAMIG_ERR_INVALID_ARGUMENT, s->conn, "outside",
                         "rdmamig_conn_save_bitmap past the block end") != 0)
            return -1;
        return expect_error(rdmamig_conn_iteration_begin(s->conn), RDMAMIG_ERR_STATE, s->conn, "open",
                            "rdmamig_conn_iteration_begin twice");
    }
    if (expect_error(rdmamig_conn_save(s->conn, 0, 0, PAGE), RDMAMIG_ERR_STATE, s->conn, "window",
                     "rdmamig_conn_save outside a window") != 0)
        return -1;
    if (expect_error(rdmamig_conn_get(s->conn, &c, 1, 1, &n), RDMAMIG_ERR_STATE, s->conn, "source",
                     "rdmamig_conn_get on a source") != 0)
        return -1;
    if (expect_error(rdmamig_conn_wait_iteration(s->conn, 1, 1, NULL), RDMAMIG_ERR_STATE, s->conn, "source",
                     "rdmamig_conn_wait_iteration on a source") != 0)
        return -1;
    if (expect_error(rdmamig_conn_put(s->conn, NULL, 1), RDMAMIG_ERR_NULL_PARAMETER, s->conn, "NULL",
                     "rdmamig_conn_put(NULL, 1)") != 0)
        return -1;
    rdmamig_stats st = {.size = RDMAMIG_STATS_SIZE_V1 - 1};
    return expect_error(rdmamig_conn_get_stats(s->conn, &st), RDMAMIG_ERR_INVALID_ARGUMENT, s->conn, "size",
                        "rdmamig_conn_get_stats with a small size");
}

static int source(unsigned mib, int pin_all, uint16_t port) {
    who = "demo";
    const char *mode = pin_all ? "pin-all" : "dynamic";
    struct source s;
    memset(&s, 0, sizeof s);
    atomic_init(&s.stop, false);
    atomic_init(&s.dirtied, 0);
    guest_layout(&s.g, mib);
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = NULL;
    uint8_t *blob = NULL;
    pthread_t writer;
    int writer_running = 0, rc = 1;

    s.dirty_words = (s.g.pages + 63) / 64;
    s.dirty = calloc(s.dirty_words, sizeof *s.dirty);
    s.taken = calloc(s.dirty_words, sizeof *s.taken);
    blob = malloc(BLOB_SIZE);
    if (!cfg || !s.dirty || !s.taken || !blob || guest_map(&s.g, -1) != 0) goto fail;
    guest_pattern(&s.g);
    blob_fill(blob, BLOB_SIZE);
    ram = guest_registry(&s.g, 0);
    EXPECT(ram != NULL);

    TRY(NULL, rdmamig_config_set_pin_all(cfg, pin_all != 0));
    TRY(NULL, rdmamig_config_set_timeout_ms(cfg, TIMEOUT_MS));
    TRY(NULL, rdmamig_connect(rdma_ip(), port, cfg, ram, &s.conn));
    rdmamig_ram_free(ram); /* the connection has its own copy */
    ram = NULL;
    bool neg_pin_all = false, neg_ext = false;
    TRY(s.conn, rdmamig_conn_negotiated(s.conn, &neg_pin_all, &neg_ext));
    EXPECT(neg_pin_all == (pin_all != 0));
    if (source_self_checks(&s, 0) != 0) goto fail;

    /* Precopy: round 0 sends everything while the guest keeps writing. */
    EXPECT(pthread_create(&writer, NULL, writer_main, &s) == 0);
    writer_running = 1;
    uint64_t sent, rounds = 0;
    if (source_round(&s, 1, &sent) != 0) goto fail;
    rounds++;
    for (int r = 0; r < DIRTY_ROUNDS; r++) {
        guest_runs(&s, 256);
        if (source_round(&s, 0, &sent) != 0) goto fail;
        rounds++;
    }
    /* Stop the guest; the last round sends what is still dirty. */
    guest_runs(&s, 256);
    atomic_store(&s.stop, true);
    pthread_join(writer, NULL);
    writer_running = 0;
    double tf = now_s();
    if (source_round(&s, 0, &sent) != 0) goto fail;
    rounds++;
    double t1 = now_s();
    uint64_t final_sent = sent;

    /* Device state: header, blob in odd-sized puts, hash through writev_buffer. */
    uint64_t header[3] = {STREAM_MAGIC, rounds, BLOB_SIZE};
    TRY(s.conn, rdmamig_conn_put(s.conn, header, sizeof header));
    static const size_t sizes[] = {1, 3, 4093, 65537, 7, 131071, 12345, 0};
    size_t off = 0;
    for (unsigned i = 0; off < BLOB_SIZE; i++) {
        size_t n = sizes[i % (sizeof sizes / sizeof sizes[0])];
        if (n > BLOB_SIZE - off) n = BLOB_SIZE - off;
        TRY(s.conn, rdmamig_conn_put(s.conn, blob + off, n));
        off += n;
    }
    uint64_t hash = guest_hash(&s.g);
    rdmamig_stream_ops ops;
    TRY(s.conn, rdmamig_conn_stream_ops(s.conn, &ops));
    EXPECT(ops.opaque == s.conn && ops.put_buffer && ops.writev_buffer && ops.close && !ops.get_buffer);
    struct iovec iov[2] = {{(uint8_t *)&hash, 3}, {(uint8_t *)&hash + 3, sizeof hash - 3}};
    ssize_t put = ops.writev_buffer(ops.opaque, iov, 2, 0);
    if (put != (ssize_t)sizeof hash) {
        report("writev_buffer", RDMAMIG_ERR_STATE, s.conn);
        goto fail;
    }
    if (ops.close(ops.opaque) != 0) {
        report("stream close", RDMAMIG_ERR_STATE, s.conn);
        goto fail;
    }
    TRY(s.conn, rdmamig_conn_flush(s.conn));

    rdmamig_stats st = {.size = sizeof st};
    TRY(s.conn, rdmamig_conn_get_stats(s.conn, &st));
    EXPECT(st.size == sizeof st);
    EXPECT(st.iterations == rounds);
    EXPECT(st.stream_bytes == sizeof header + BLOB_SIZE + sizeof hash);
    /* RDMAMIG_OK: the destination acknowledged the end (the completion handshake). */
    TRY(s.conn, rdmamig_conn_close(s.conn));
    EXPECT(rdmamig_conn_flush(s.conn) == RDMAMIG_ERR_STATE); /* only _free after close */

    double secs = s.xfer_s;
    printf("demo: mode=%s ram=%u MiB bytes=%" PRIu64 " Gbit/s=%.3f rounds=%" PRIu64 " final_round_ms=%.1f"
           " zero_chunks=%" PRIu64 " registrations=%" PRIu64 "\n",
           mode, mib, st.bytes_written, (double)st.bytes_written * 8 / secs / 1e9, rounds, (t1 - tf) * 1e3,
           st.zero_chunks, st.registration_round_trips);
    if (verbose)
        printf("demo: counters mode=%s dirtied=%" PRIu64 " pages final_round_pages=%" PRIu64 " registered_chunks=%" PRIu64
           " control_messages=%" PRIu64 " pinned_peak=%" PRIu64 " MiB staged=%" PRIu64 " MiB iteration_end_ms=%.1f\n",
           mode, atomic_load(&s.dirtied), final_sent, st.chunks_registered, st.control_messages, st.pinned_bytes_peak / MIB,
           st.staged_bytes / MIB, (double)st.iteration_end_ns / 1e6);
    rc = 0;
fail:
    if (writer_running) {
        atomic_store(&s.stop, true);
        pthread_join(writer, NULL);
    }
    if (rc != 0 && s.conn) rdmamig_conn_abort(s.conn);
    rdmamig_conn_free(s.conn);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    free(blob);
    free((void *)s.dirty);
    free(s.taken);
    guest_unmap(&s.g);
    return rc;
}

/* ------------------------------------------------------------ one mode */

/* One migration: the destination in a child, the source here. 0 if both passed. */
static int migrate(unsigned mib, int pin_all) {
    int fds[2];
    if (pipe(fds) != 0) {
        perror("pipe");
        return 1;
    }
    fflush(NULL);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        alarm(WATCHDOG_S);
        close(fds[0]);
        int rc = destination(mib, pin_all, fds[1]);
        fflush(NULL);
        _exit(rc);
    }
    close(fds[1]);
    uint16_t port = 0;
    ssize_t n = read(fds[0], &port, sizeof port);
    close(fds[0]);
    int rc = 1;
    if (n != (ssize_t)sizeof port || port == 0)
        fprintf(stderr, "demo: FAIL the destination did not start listening\n");
    else
        rc = source(mib, pin_all, port);
    int status = 0;
    if (waitpid(child, &status, 0) != child) {
        perror("waitpid");
        return 1;
    }
    if (WIFSIGNALED(status))
        fprintf(stderr, "demo: FAIL the destination died of signal %d%s\n", WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? " (watchdog)" : "");
    else if (WEXITSTATUS(status) != 0)
        fprintf(stderr, "demo: FAIL the destination exited with %d\n", WEXITSTATUS(status));
    return rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

/* Runs one migration in its own process, so a crash or hang fails only it. */
static int run_mode(unsigned mib, int pin_all) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        alarm(WATCHDOG_S);
        int rc = migrate(mib, pin_all);
        fflush(NULL);
        _exit(rc);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return 1;
    if (WIFSIGNALED(status))
        fprintf(stderr, "demo: FAIL mode=%s: the source died of signal %d%s\n", pin_all ? "pin-all" : "dynamic",
                WTERMSIG(status), WTERMSIG(status) == SIGALRM ? " (watchdog)" : "");
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("demo: %s mode=%s ram=%u MiB\n", ok ? "PASS" : "FAIL", pin_all ? "pin-all" : "dynamic", mib);
    return !ok;
}

static void usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--mib N] [--pin-all] [-v]\n"
                    "  no arguments: dynamic then pin-all, %u MiB each\n", argv0, 128u);
}

int main(int argc, char **argv) {
    who = "demo";
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsigned mib = 128;
    int pin_all = 0, explicit_mode = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
            char *end;
            unsigned long v = strtoul(argv[++i], &end, 10);
            if (*end || v < MIN_MIB || v > 65536) {
                fprintf(stderr, "--mib: a number from %u to 65536\n", MIN_MIB);
                return 2;
            }
            mib = (unsigned)v;
            explicit_mode = 1;
        } else if (strcmp(argv[i], "-v") == 0) {
            verbose = 1;
        } else if (strcmp(argv[i], "--pin-all") == 0) {
            pin_all = 1;
            explicit_mode = 1;
        } else {
            usage(argv[0]);
            return 2;
        }
    }
    printf("demo: rdmamig %s, RDMA address %s\n", rdmamig_version(), rdma_ip());
    int passed = 0, failed = 0;
    if (explicit_mode) {
        if (run_mode(mib, pin_all)) failed++; else passed++;
    } else {
        for (int p = 0; p < 2; p++)
            if (run_mode(128, p)) failed++; else passed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
