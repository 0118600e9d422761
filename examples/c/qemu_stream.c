/* qemu_stream.c -- integration example (docs/integration/qemu-stream.md):
 * a QEMU-style buffered stream ("MigFile", shaped like QEMU's QEMUFile) on
 * top of rdmamig's stream callbacks (rdmamig_conn_stream_ops), carrying
 * device-state sections in QEMU's savevm layout, while guest RAM goes by RDMA
 * in iteration windows.
 *
 *   qemu_stream [--mib N]        RXE_VM_IP: the RDMA address (198.18.0.1)
 *
 * fork(): the child is the destination (listens on port 0, tells the parent
 * the port through a pipe), the parent the source. The source's guest keeps
 * writing pages during the precopy rounds; the final round runs with it
 * stopped. The destination rebuilds the expected guest from the same seeds
 * and compares every byte of RAM and of device state. Exit status 0 only if
 * both are identical and the migration ended RDMAMIG_END_COMPLETED.
 *
 * Build: cc -std=c11 qemu_stream.c $(pkg-config --cflags --libs rdmamig)
 * (in this repository: make c-tests, as target/c-tests/rdma_test_example_qemu_stream). */
#define _GNU_SOURCE
#include <rdmamig.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096u
#define MIB (UINT64_C(1) << 20)
#define TIMEOUT_MS 60000
#define ROUNDS 3          /* precopy rounds with the guest running, then the final one */
#define PAGES_PER_RUN 300 /* pages the guest writes in each of its runs */

/* ------------------------------------------------------------- MigFile */

/* A buffered stream over rdmamig_stream_ops, as QEMUFile is over
 * QEMUFileOps: small puts are copied into `buf`; large ones are queued by
 * reference (QEMU's qemu_put_buffer_async) and must stay valid until the
 * next flush; flush hands all of it to writev_buffer at once. Reads fill
 * `buf` through get_buffer. The first error sticks (QEMU's
 * qemu_file_get_error) and makes every later call a no-op. */
#define IO_BUF_SIZE 32768
#define MAX_IOV 64
#define ASYNC_MIN 4096 /* puts at least this long are not copied */

typedef struct {
    rdmamig_stream_ops ops;
    uint8_t buf[IO_BUF_SIZE];
    size_t buf_index; /* writer: bytes used in buf; reader: next byte to read */
    size_t buf_size;  /* reader: bytes in buf */
    struct iovec iov[MAX_IOV];
    int iovcnt;
    int64_t pos;  /* bytes written or read so far */
    int error;    /* 0, or the first negative errno */
    int eof;      /* reader: get_buffer returned 0 (the stream ended) */
} MigFile;

static int mf_open(MigFile *f, rdmamig_conn *conn) {
    memset(f, 0, sizeof *f);
    return rdmamig_conn_stream_ops(conn, &f->ops) == RDMAMIG_OK ? 0 : -1;
}

static void mf_flush(MigFile *f) {
    if (f->error || f->iovcnt == 0) return;
    size_t want = 0;
    for (int i = 0; i < f->iovcnt; i++) want += f->iov[i].iov_len;
    ssize_t n = f->ops.writev_buffer(f->ops.opaque, f->iov, f->iovcnt, f->pos);
    if (n < 0)
        f->error = (int)n;
    else if ((size_t)n != want)
        f->error = -EIO;
    else
        f->pos += n;
    f->iovcnt = 0;
    f->buf_index = 0;
}

/* Appends p..p+n to the iovec list, merging with the previous entry when
 * contiguous; a full list is flushed first (which empties buf: a caller
 * copying into buf makes room before it copies). */
static void mf_add_iov(MigFile *f, const uint8_t *p, size_t n) {
    if (f->iovcnt > 0) {
        struct iovec *last = &f->iov[f->iovcnt - 1];
        if ((const uint8_t *)last->iov_base + last->iov_len == p) {
            last->iov_len += n;
            return;
        }
    }
    if (f->iovcnt == MAX_IOV) mf_flush(f);
    f->iov[f->iovcnt++] = (struct iovec){.iov_base = (void *)p, .iov_len = n};
}

static void mf_put_buffer(MigFile *f, const void *data, size_t n) {
    const uint8_t *p = data;
    if (n >= ASYNC_MIN) { /* by reference: valid until mf_flush */
        if (!f->error) mf_add_iov(f, p, n);
        return;
    }
    while (n > 0 && !f->error) {
        if (f->iovcnt == MAX_IOV) mf_flush(f); /* so that mf_add_iov below does not flush */
        size_t room = IO_BUF_SIZE - f->buf_index, k = n < room ? n : room;
        memcpy(f->buf + f->buf_index, p, k);
        mf_add_iov(f, f->buf + f->buf_index, k);
        f->buf_index += k;
        p += k;
        n -= k;
        if (f->buf_index == IO_BUF_SIZE) mf_flush(f);
    }
}

static void mf_put_byte(MigFile *f, uint8_t v) { mf_put_buffer(f, &v, 1); }
static void mf_put_be32(MigFile *f, uint32_t v) {
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    mf_put_buffer(f, b, 4);
}
static void mf_put_be64(MigFile *f, uint64_t v) {
    mf_put_be32(f, (uint32_t)(v >> 32));
    mf_put_be32(f, (uint32_t)v);
}

/* Reader: refills buf with whatever the stream has (at least one byte). */
static void mf_fill(MigFile *f) {
    if (f->error || f->eof) return;
    size_t pending = f->buf_size - f->buf_index;
    memmove(f->buf, f->buf + f->buf_index, pending);
    f->buf_index = 0;
    f->buf_size = pending;
    ssize_t n = f->ops.get_buffer(f->ops.opaque, f->buf + pending, f->pos, IO_BUF_SIZE - pending);
    if (n < 0)
        f->error = (int)n; /* -EIO: the migration failed */
    else if (n == 0)
        f->eof = 1;        /* the stream ended without failing */
    else {
        f->buf_size += (size_t)n;
        f->pos += n;
    }
}

/* Reads exactly n bytes; 0, or -1 (error or early end: f->error says which). */
static int mf_get_buffer(MigFile *f, void *data, size_t n) {
    uint8_t *p = data;
    while (n > 0) {
        if (f->buf_index == f->buf_size) {
            mf_fill(f);
            if (f->error || (f->eof && f->buf_index == f->buf_size)) {
                if (!f->error) f->error = -EPIPE;
                return -1;
            }
        }
        size_t k = f->buf_size - f->buf_index;
        if (k > n) k = n;
        memcpy(p, f->buf + f->buf_index, k);
        f->buf_index += k;
        p += k;
        n -= k;
    }
    return 0;
}

static uint8_t mf_get_byte(MigFile *f) {
    uint8_t v = 0;
    mf_get_buffer(f, &v, 1);
    return v;
}
static uint32_t mf_get_be32(MigFile *f) {
    uint8_t b[4] = {0};
    mf_get_buffer(f, b, 4);
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}
static uint64_t mf_get_be64(MigFile *f) {
    uint64_t hi = mf_get_be32(f);
    return hi << 32 | mf_get_be32(f);
}

/* ------------------------------------------------ the stream's layout */

/* As QEMU's savevm.c: file header, sections, footer after each section, EOF. */
#define QEMU_VM_FILE_MAGIC 0x5145564d /* "QEVM" */
#define QEMU_VM_FILE_VERSION 3
#define QEMU_VM_EOF 0x01
#define QEMU_VM_SECTION_PART 0x02
#define QEMU_VM_SECTION_FULL 0x04
#define QEMU_VM_SECTION_FOOTER 0x7e
#define RAM_SECTION_ID 0 /* "ram": its PART sections say how many windows are done */

/* ----------------------------------------------------- the fake guest */

struct block {
    const char *name;
    uint64_t len;
    uint8_t *host;
    uint8_t *versions; /* per page: how many times the guest wrote it */
    uint64_t *dirty;   /* per page: a dirty bit (the source's log) */
};

struct guest {
    struct block b[2];
    uint64_t rng; /* drives which pages the guest writes */
};

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Page `page` of block `blk` as written for the `version`-th time. Every
 * fourth MiB starts as zeros (sent as zero ranges, not written). */
static void page_content(uint8_t *out, int blk, uint64_t page, uint8_t version) {
    if (version == 0 && (page * PAGE / MIB) % 4 == 3) {
        memset(out, 0, PAGE);
        return;
    }
    uint64_t s = (uint64_t)blk << 56 ^ page << 8 ^ version ^ UINT64_C(0x9E3779B97F4A7C15);
    for (unsigned i = 0; i < PAGE; i += 8) {
        uint64_t v = xorshift(&s);
        memcpy(out + i, &v, 8);
    }
}

static int guest_init(struct guest *g, unsigned mib, int fill) {
    memset(g, 0, sizeof *g);
    g->b[0] = (struct block){.name = "pc.ram", .len = (uint64_t)(mib - 2) * MIB};
    g->b[1] = (struct block){.name = "vga.vram", .len = 2 * MIB};
    g->rng = UINT64_C(0x51E55EED);
    for (int i = 0; i < 2; i++) {
        struct block *b = &g->b[i];
        uint64_t pages = b->len / PAGE;
        b->host = mmap(NULL, b->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        b->versions = calloc(pages, 1);
        b->dirty = calloc((pages + 63) / 64, 8);
        if (b->host == MAP_FAILED || !b->versions || !b->dirty) return -1;
        if (fill) /* the source's guest at boot */
            for (uint64_t p = 0; p < pages; p++) page_content(b->host + p * PAGE, i, p, 0);
        else      /* the destination's memory: garbage, so zero ranges must really be zeroed */
            memset(b->host, 0xAA, b->len);
    }
    return 0;
}

static void guest_free(struct guest *g) {
    for (int i = 0; i < 2; i++) {
        if (g->b[i].host && g->b[i].host != MAP_FAILED) munmap(g->b[i].host, g->b[i].len);
        free(g->b[i].versions);
        free(g->b[i].dirty);
    }
}

/* The guest runs: writes PAGES_PER_RUN pages (the page first, then its dirty
 * bit, as KVM's dirty log would see it). With `write` 0 (the destination)
 * it only replays which pages and versions, to know the expected RAM. */
static void guest_run(struct guest *g, int write) {
    for (int n = 0; n < PAGES_PER_RUN; n++) {
        uint64_t r = xorshift(&g->rng);
        int blk = (r >> 60) == 0; /* 1 in 16 in vga.vram */
        struct block *b = &g->b[blk];
        uint64_t page = (r >> 8) % (b->len / PAGE);
        uint8_t v = ++b->versions[page];
        if (write) {
            page_content(b->host + page * PAGE, blk, page, v);
            b->dirty[page / 64] |= UINT64_C(1) << (page % 64);
        }
    }
}

/* Device state: QEMU's `vmstate` of three devices, as (idstr, instance, version, payload). */
struct device {
    const char *idstr;
    uint32_t instance, version, size;
};
static const struct device devices[] = {
    {"cpu", 0, 5, 1536},   /* registers, MSRs */
    {"serial", 0, 3, 77},  /* an odd size: the fifo */
    {"virtio-blk", 1, 2, 70000}, /* large: goes by reference (async) */
};
#define NDEV (sizeof devices / sizeof devices[0])

static void device_state(uint8_t *out, unsigned d) {
    uint64_t s = UINT64_C(0xDE71CE00) + d;
    for (uint32_t i = 0; i < devices[d].size; i++) out[i] = (uint8_t)xorshift(&s);
}

/* ------------------------------------------------------------ source */

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
    fprintf(stderr, "qemu_stream: %s: FAIL %s: %s: %s\n", who, what, rdmamig_status_str(st), msg);
}

#define TRY(who, conn, call)                          \
    do {                                              \
        rdmamig_status st_ = (call);                  \
        if (st_ != RDMAMIG_OK) {                      \
            fail_msg(who, #call, st_, (conn));        \
            goto out;                                 \
        }                                             \
    } while (0)

static rdmamig_ram *registry(struct guest *g) {
    rdmamig_ram *ram = rdmamig_ram_new();
    for (int i = 0; ram && i < 2; i++)
        if (rdmamig_ram_add_block(ram, g->b[i].name, g->b[i].host, (uint64_t)i << 32, g->b[i].len, NULL) !=
            RDMAMIG_OK) {
            rdmamig_ram_free(ram);
            return NULL;
        }
    return ram;
}

static int source(unsigned mib, uint16_t port) {
    struct guest g;
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = NULL;
    rdmamig_conn *conn = NULL;
    MigFile *f = calloc(1, sizeof *f);
    uint8_t *state[NDEV] = {0};
    uint64_t *taken = NULL;
    int rc = 1;
    if (guest_init(&g, mib, 1) != 0 || !cfg || !f) goto out;
    ram = registry(&g);
    if (!ram) goto out;
    TRY("source", NULL, rdmamig_connect(rdma_ip(), port, cfg, ram, &conn));
    if (mf_open(f, conn) != 0) goto out;
    taken = calloc((g.b[0].len / PAGE + 63) / 64, 8);
    if (!taken) goto out;

    mf_put_be32(f, QEMU_VM_FILE_MAGIC);
    mf_put_be32(f, QEMU_VM_FILE_VERSION);

    /* Precopy: round 0 sends every page, later rounds the pages the guest
     * dirtied; the guest runs during each window (save only queues: the
     * library reads the memory by the time iteration_end returns, and a page
     * written meanwhile is dirty again for the next round). The last round
     * runs with the guest stopped. */
    for (int round = 0; round <= ROUNDS; round++) {
        TRY("source", conn, rdmamig_conn_iteration_begin(conn));
        for (int i = 0; i < 2; i++) {
            struct block *b = &g.b[i];
            uint64_t pages = b->len / PAGE, words = (pages + 63) / 64;
            if (round == 0) {
                TRY("source", conn, rdmamig_conn_save(conn, (uint32_t)i, 0, b->len));
                memset(b->dirty, 0, words * 8);
                continue;
            }
            memcpy(taken, b->dirty, words * 8); /* take the log and clear it */
            memset(b->dirty, 0, words * 8);
            TRY("source", conn, rdmamig_conn_save_bitmap(conn, (uint32_t)i, taken, 0, pages, PAGE));
        }
        if (round < ROUNDS) guest_run(&g, 1);
        TRY("source", conn, rdmamig_conn_iteration_end(conn));
        /* QEMU's ram section: here only how many windows the destination must have. */
        mf_put_byte(f, QEMU_VM_SECTION_PART);
        mf_put_be32(f, RAM_SECTION_ID);
        mf_put_be64(f, (uint64_t)round + 1);
        mf_put_byte(f, QEMU_VM_SECTION_FOOTER);
        mf_put_be32(f, RAM_SECTION_ID);
        mf_flush(f);
    }

    /* The guest is stopped: the devices' state, one full section each. */
    for (unsigned d = 0; d < NDEV; d++) {
        state[d] = malloc(devices[d].size);
        if (!state[d]) goto out;
        device_state(state[d], d);
        size_t idlen = strlen(devices[d].idstr);
        mf_put_byte(f, QEMU_VM_SECTION_FULL);
        mf_put_be32(f, d + 1);
        mf_put_byte(f, (uint8_t)idlen);
        mf_put_buffer(f, devices[d].idstr, idlen);
        mf_put_be32(f, devices[d].instance);
        mf_put_be32(f, devices[d].version);
        mf_put_be32(f, devices[d].size);
        mf_put_buffer(f, state[d], devices[d].size); /* 70000 bytes: by reference */
        mf_put_byte(f, QEMU_VM_SECTION_FOOTER);
        mf_put_be32(f, d + 1);
    }
    mf_put_byte(f, QEMU_VM_EOF);
    mf_flush(f); /* state[] may be freed only after this */
    if (f->error) {
        fail_msg("source", "writev_buffer", RDMAMIG_ERR_DISCONNECTED, conn);
        goto out;
    }
    if (f->ops.close(f->ops.opaque) != 0) { /* rdmamig_conn_flush: every stream byte is out */
        fail_msg("source", "stream close", RDMAMIG_ERR_DISCONNECTED, conn);
        goto out;
    }
    rdmamig_stats st = {.size = sizeof st};
    TRY("source", conn, rdmamig_conn_get_stats(conn, &st));
    /* RDMAMIG_OK: the destination checked the end marker and acknowledged. */
    TRY("source", conn, rdmamig_conn_close(conn));
    printf("qemu_stream: source: %u MiB, %d rounds, %" PRIu64 " bytes written, %" PRIu64
           " zero ranges, %" PRId64 " stream bytes, completed\n",
           mib, ROUNDS + 1, st.bytes_written, st.zero_chunks, f->pos);
    rc = 0;
out:
    if (rc != 0 && conn) rdmamig_conn_abort(conn);
    rdmamig_conn_free(conn);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    for (unsigned d = 0; d < NDEV; d++) free(state[d]);
    free(taken);
    free(f);
    guest_free(&g);
    return rc;
}

/* ------------------------------------------------------- destination */

/* qemu_loadvm_state's loop: sections until QEMU_VM_EOF. */
static int load_stream(MigFile *f, const rdmamig_conn *conn, unsigned *devices_ok) {
    if (mf_get_be32(f) != QEMU_VM_FILE_MAGIC || mf_get_be32(f) != QEMU_VM_FILE_VERSION) {
        fprintf(stderr, "qemu_stream: dest: FAIL bad file header\n");
        return -1;
    }
    uint8_t *want = malloc(70000), *got = malloc(70000);
    int rc = -1;
    if (!want || !got) goto out;
    for (;;) {
        uint8_t type = mf_get_byte(f);
        if (f->error) break;
        if (type == QEMU_VM_EOF) {
            rc = 0;
            break;
        }
        uint32_t id = mf_get_be32(f);
        if (type == QEMU_VM_SECTION_PART && id == RAM_SECTION_ID) {
            /* The RAM of these windows is in place once they are complete. */
            uint64_t windows = mf_get_be64(f), done = 0;
            rdmamig_status st = rdmamig_conn_wait_iteration(conn, windows, TIMEOUT_MS, &done);
            if (st != RDMAMIG_OK) {
                fail_msg("dest", "rdmamig_conn_wait_iteration", st, conn);
                break;
            }
        } else if (type == QEMU_VM_SECTION_FULL && id >= 1 && id <= NDEV) {
            const struct device *d = &devices[id - 1];
            char idstr[256] = {0};
            uint8_t idlen = mf_get_byte(f);
            mf_get_buffer(f, idstr, idlen);
            uint32_t instance = mf_get_be32(f), version = mf_get_be32(f), size = mf_get_be32(f);
            if (f->error || strcmp(idstr, d->idstr) != 0 || instance != d->instance || version != d->version ||
                size != d->size) {
                fprintf(stderr, "qemu_stream: dest: FAIL section %u: \"%s\" instance %u version %u size %u\n", id,
                        idstr, instance, version, size);
                break;
            }
            mf_get_buffer(f, got, size);
            device_state(want, id - 1);
            if (f->error || memcmp(got, want, size) != 0) {
                fprintf(stderr, "qemu_stream: dest: FAIL device \"%s\": state differs\n", d->idstr);
                break;
            }
            (*devices_ok)++;
        } else {
            fprintf(stderr, "qemu_stream: dest: FAIL unknown section type %#x id %u\n", type, id);
            break;
        }
        if (mf_get_byte(f) != QEMU_VM_SECTION_FOOTER || mf_get_be32(f) != id) {
            fprintf(stderr, "qemu_stream: dest: FAIL section %u: bad footer\n", id);
            break;
        }
    }
    if (f->error) fprintf(stderr, "qemu_stream: dest: FAIL the stream failed (%s)\n", strerror(-f->error));
out:
    free(want);
    free(got);
    return f->error ? -1 : rc;
}

/* The guest's RAM as the source left it: replay the guest's runs, then
 * compare every page. */
static int check_ram(struct guest *g) {
    uint8_t want[PAGE];
    for (int r = 0; r < ROUNDS; r++) guest_run(g, 0);
    for (int i = 0; i < 2; i++)
        for (uint64_t p = 0; p < g->b[i].len / PAGE; p++) {
            page_content(want, i, p, g->b[i].versions[p]);
            if (memcmp(want, g->b[i].host + p * PAGE, PAGE) != 0) {
                fprintf(stderr, "qemu_stream: dest: FAIL %s page %" PRIu64 " (version %u) differs\n", g->b[i].name,
                        p, g->b[i].versions[p]);
                return -1;
            }
        }
    return 0;
}

static int destination(unsigned mib, int port_fd) {
    struct guest g;
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = NULL;
    rdmamig_listener *l = NULL;
    rdmamig_conn *conn = NULL;
    MigFile *f = calloc(1, sizeof *f);
    unsigned devices_ok = 0;
    int rc = 1;
    if (guest_init(&g, mib, 0) != 0 || !cfg || !f) goto out;
    ram = registry(&g);
    if (!ram) goto out;
    TRY("dest", NULL, rdmamig_listener_new(rdma_ip(), 0, cfg, &l));
    uint16_t port = rdmamig_listener_port(l);
    if (write(port_fd, &port, sizeof port) != (ssize_t)sizeof port) goto out;
    close(port_fd);
    TRY("dest", NULL, rdmamig_listener_accept(l, ram, TIMEOUT_MS, &conn));
    if (mf_open(f, conn) != 0) goto out;

    if (load_stream(f, conn, &devices_ok) != 0 || devices_ok != NDEV) goto out;
    /* The stream proves nothing about RAM: only the end does. */
    rdmamig_status end = rdmamig_conn_wait_end(conn, TIMEOUT_MS);
    if (end != RDMAMIG_END_COMPLETED) {
        fail_msg("dest", "rdmamig_conn_wait_end", end, conn);
        goto out;
    }
    uint8_t extra;
    if (f->buf_index != f->buf_size || f->ops.get_buffer(f->ops.opaque, &extra, 0, 1) != 0) {
        fprintf(stderr, "qemu_stream: dest: FAIL bytes after QEMU_VM_EOF\n");
        goto out;
    }
    if (check_ram(&g) != 0) goto out;
    printf("qemu_stream: dest: RAM identical (%u MiB in 2 blocks), %u device sections identical, completed\n", mib,
           devices_ok);
    rc = 0;
out:
    if (rc != 0 && conn) rdmamig_conn_abort(conn);
    rdmamig_conn_free(conn);
    rdmamig_listener_free(l);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    free(f);
    guest_free(&g);
    return rc;
}

int main(int argc, char **argv) {
    unsigned mib = 32;
    if (argc == 3 && strcmp(argv[1], "--mib") == 0 && atoi(argv[2]) >= 4)
        mib = (unsigned)atoi(argv[2]);
    else if (argc != 1) {
        fprintf(stderr, "usage: %s [--mib N (>= 4)]\n", argv[0]);
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
        _exit(destination(mib, fds[1]));
    }
    close(fds[1]);
    alarm(300);
    uint16_t port = 0;
    int rc = read(fds[0], &port, sizeof port) == (ssize_t)sizeof port ? source(mib, port) : 1;
    int status = 0;
    waitpid(child, &status, 0);
    int ok = rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("qemu_stream: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
