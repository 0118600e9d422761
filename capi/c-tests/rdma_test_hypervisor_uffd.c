/* rdma_test_hypervisor_uffd: post-copy through the hypervisor's userfaultfd
 * (rdmamig_config_set_postcopy_hypervisor_userfaultfd,
 * rdmamig_conn_postcopy_userfaultfd; RDMAMIG_0.14) as QEMU's destination
 * does it: one process whose fault thread reads its own userfaultfd and
 * forwards each fault with rdmamig_conn_postcopy_fetch. The C side of
 * tests/rdma/hypervisor_uffd.rs.
 *
 * fork(): the child is the destination (the hypervisor), the parent the
 * source, over rdma_cm on $RXE_VM_IP (default 198.18.0.1). The destination
 * listens with the setting and without it, passes both ports up a pipe, then
 * a byte once it checked the connection without it; a second pipe carries
 * the source's byte "calling rdmamig_conn_postcopy" down. The guest's memory
 * is a function of page, word and version (1 after the change, for the
 * stale pages: three in four), so the destination knows the source's final
 * memory without a copy.
 *
 * Source: one block, one pre-copy window of every page, then the stale pages
 * change and their bitmap goes to rdmamig_conn_postcopy. Destination:
 * registers its guest RAM with its userfaultfd (missing mode) and hands it
 * over once the library said it waits for it (its log record);
 * its fault thread forwards every fault; at RDMAMIG_POSTCOPY_RUNNING four
 * vCPU threads read every page (each must hold the source's final content);
 * at RDMAMIG_POSTCOPY_DONE faults must have been forwarded and served, and
 * every page must hold the source's final content. Both ends: no error.
 * Refused before that: a NULL conn or addrs, a descriptor that is none or no
 * userfaultfd, addresses for two blocks or misaligned, the source's
 * connection, a destination without the setting, a second hand-over.
 *
 *   rdma_test_hypervisor_uffd [--mib N] [--no-postcopy]
 *
 * --no-postcopy: the argument checks and the pre-copy window only, then an
 * ordinary close (for valgrind, which has no userfaultfd).
 * Last line: "N passed, M failed"; exit status 0 if all passed.
 */
#define _GNU_SOURCE
#include "rdmamig.h"
#include "rdma_util.h"
#include "check.h"

#include <fcntl.h>
#include <inttypes.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>

#define MIB (UINT64_C(1) << 20)
#define PAGE UINT64_C(4096)
#define WORDS (PAGE / 8)
#define VCPUS 4
#define SETUP_TIMEOUT_MS 60000
#define WATCHDOG_S 300

/* Set by the library's log record saying it waits for the userfaultfd. */
static atomic_int library_waits;

static void on_log(void *user_data, rdmamig_log_level level, const char *message) {
    (void)user_data;
    (void)level;
    if (strstr(message, "waiting up to") && strstr(message, "userfaultfd")) atomic_store(&library_waits, 1);
}

static int no_postcopy;

static int is_stale(uint64_t page) {
    return page % 4 != 0;
}

/* Whether `page` of `host` holds the source's final content (a missing page faults first). */
static int holds_final(const uint8_t *host, uint64_t page) {
    uint64_t want[WORDS];
    for (uint64_t w = 0; w < WORDS; w++) want[w] = word(page, w, (uint64_t)is_stale(page));
    return memcmp(host + page * PAGE, want, PAGE) == 0;
}

/* Whether `got` is `want` and the thread's last error says `words` (another rule gives the same status). */
static int refused(rdmamig_status got, rdmamig_status want, const char *words) {
    char msg[512];
    rdmamig_last_error_message(msg, sizeof msg);
    if (got == want && strstr(msg, words)) return 1;
    fprintf(stderr, "%s: gave %s (\"%s\"), want %s saying \"%s\"\n", who, rdmamig_status_str(got), msg,
            rdmamig_status_str(want), words);
    return 0;
}

/* For TRY around the calls that may end a migration: any status that is no error is success. */
static rdmamig_status no_error(rdmamig_status st) {
    return rdmamig_status_is_error(st) ? st : RDMAMIG_OK;
}

/* ----------------------------------------------------------- destination */

/* The hypervisor's userfaultfd (API handshake done), or -1 with errno. */
static int userfaultfd_new(void) {
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api = {.api = UFFD_API};
    if (fd >= 0 && ioctl(fd, UFFDIO_API, &api) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The hypervisor's fault thread: forwards each fault on `uffd` (addresses
 * from `base` on are block 0's) until `stop`. */
struct faults {
    pthread_t thread;
    const rdmamig_conn *conn;
    int uffd, failed;
    uint64_t base, forwarded;
    atomic_int stop;
};

static void *forward_faults(void *arg) {
    struct faults *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd pfd = {.fd = f->uffd, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0) continue;
        struct uffd_msg msgs[16];
        ssize_t n = read(f->uffd, msgs, sizeof msgs);
        if (n < 0) continue; /* EAGAIN: a spurious wake */
        for (size_t i = 0; i < (size_t)n / sizeof *msgs; i++) {
            if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
            uint64_t offset = (msgs[i].arg.pagefault.address & ~(PAGE - 1)) - f->base;
            rdmamig_status st = rdmamig_conn_postcopy_fetch(f->conn, 0, offset, PAGE, SETUP_TIMEOUT_MS);
            if (st != RDMAMIG_OK) {
                report("rdmamig_conn_postcopy_fetch", st, f->conn);
                f->failed = 1;
                return NULL;
            }
            f->forwarded++;
        }
    }
    return NULL;
}

/* A vCPU reads its quarter of the pages from the end down (ahead of the
 * background pull, which goes up); `bad`: one did not hold its final content. */
struct vcpu {
    pthread_t thread;
    unsigned index, bad;
    const uint8_t *host;
    uint64_t pages;
};

static void *vcpu_run(void *arg) {
    struct vcpu *v = arg;
    for (uint64_t i = v->pages / VCPUS; i-- > 0 && !v->bad;) {
        uint64_t page = i * VCPUS + v->index;
        v->bad = !holds_final(v->host, page);
        if (v->bad) fprintf(stderr, "dest: FAIL vCPU %u: page %" PRIu64 " is not the source's final\n", v->index, page);
    }
    return NULL;
}

static int destination(unsigned mib, int up, int down) {
    who = "dest";
    uint64_t len = (uint64_t)mib * MIB, pages = len / PAGE;
    uint8_t *host = map_ram(len, 0xAA);
    rdmamig_config *cfg = rdmamig_config_new(), *plain = rdmamig_config_new();
    rdmamig_ram *ram = NULL;
    rdmamig_listener *listener = NULL, *plain_listener = NULL;
    rdmamig_conn *conn = NULL, *plain_conn = NULL;
    struct faults f = {.uffd = -1};
    struct vcpu v[VCPUS];
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC), uffd = userfaultfd_new(), rc = 1;
    uint16_t port = 0;

    EXPECT(host && cfg && plain && devnull >= 0);
    if (uffd < 0 && !no_postcopy) perror("userfaultfd");
    EXPECT(uffd >= 0 || no_postcopy);
    ram = registry(host, len);
    EXPECT(ram);
    TRY(NULL, rdmamig_config_set_postcopy_hypervisor_userfaultfd(cfg, true));
    TRY(NULL, rdmamig_listener_new(rdma_ip(), 0, cfg, &listener));
    TRY(NULL, rdmamig_listener_new(rdma_ip(), 0, plain, &plain_listener));
    port = rdmamig_listener_port(listener);
    uint16_t plain_port = rdmamig_listener_port(plain_listener);
    EXPECT(port != 0 && plain_port != 0);
    EXPECT(write(up, &port, sizeof port) == (ssize_t)sizeof port);
    EXPECT(write(up, &plain_port, sizeof plain_port) == (ssize_t)sizeof plain_port);

    /* Without the setting, the library serves post-copy with its own userfaultfd. */
    TRY(NULL, rdmamig_listener_accept(plain_listener, ram, SETUP_TIMEOUT_MS, &plain_conn));
    CHECK(refused(rdmamig_conn_postcopy_userfaultfd(plain_conn, uffd >= 0 ? uffd : devnull, NULL, 0),
                  RDMAMIG_ERR_STATE, "hypervisor_userfaultfd is off"));
    char checked = 1;
    EXPECT(write(up, &checked, 1) == 1);
    rdmamig_conn_abort(plain_conn);

    TRY(NULL, rdmamig_listener_accept(listener, ram, SETUP_TIMEOUT_MS, &conn));
    /* Refused arguments, before post-copy (a real userfaultfd, where there is one, so that only the rule refuses). */
    int fd = uffd >= 0 ? uffd : devnull;
    uint64_t two[2] = {(uint64_t)host, (uint64_t)host + len}, misaligned = (uint64_t)host + 8;
    CHECK_STATUS(rdmamig_conn_postcopy_userfaultfd(NULL, fd, NULL, 0), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_postcopy_userfaultfd(conn, fd, NULL, 1), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(refused(rdmamig_conn_postcopy_userfaultfd(conn, -1, NULL, 0), RDMAMIG_ERR_INVALID_ARGUMENT, "no descriptor"));
    CHECK(refused(rdmamig_conn_postcopy_userfaultfd(conn, devnull, NULL, 0), RDMAMIG_ERR_INVALID_ARGUMENT,
                  "no userfaultfd"));
    CHECK(refused(rdmamig_conn_postcopy_userfaultfd(conn, fd, two, 2), RDMAMIG_ERR_INVALID_ARGUMENT,
                  "block addresses"));
    CHECK(refused(rdmamig_conn_postcopy_userfaultfd(conn, fd, &misaligned, 1), RDMAMIG_ERR_INVALID_ARGUMENT,
                  "aligned"));
    EXPECT(failed == 0); /* and none of them failed the connection */

    if (!no_postcopy) {
        /* The source calls post-copy; once its request came the library says
         * it waits for the descriptor (an Info record), and post-copy does not
         * run without it. */
        char calling = 0;
        EXPECT(read(down, &calling, 1) == 1 && calling == 1);
        TRY(conn, rdmamig_set_log_callback(on_log, NULL, RDMAMIG_LOG_INFO));
        for (int i = 0; i < 6000 && !atomic_load(&library_waits); i++) usleep(10000);
        TRY(conn, rdmamig_set_log_callback(NULL, NULL, RDMAMIG_LOG_INFO));
        EXPECT(atomic_load(&library_waits));
        rdmamig_postcopy_progress p = {.size = sizeof p};
        TRY(conn, rdmamig_conn_postcopy_progress(conn, &p));
        EXPECT(p.phase == RDMAMIG_POSTCOPY_IDLE);
    }
    if (uffd < 0) printf("dest: no userfaultfd here (valgrind?): no hand-over\n");
    if (uffd >= 0) {
        struct uffdio_register reg = {.range = {.start = (uint64_t)host, .len = len},
                                      .mode = UFFDIO_REGISTER_MODE_MISSING};
        EXPECT(ioctl(uffd, UFFDIO_REGISTER, &reg) == 0);
        TRY(conn, rdmamig_conn_postcopy_userfaultfd(conn, uffd, NULL, 0));
        CHECK(refused(rdmamig_conn_postcopy_userfaultfd(conn, uffd, NULL, 0), RDMAMIG_ERR_STATE, "handed over"));
    }
    EXPECT(failed == 0);

    if (no_postcopy) {
        TRY(conn, no_error(rdmamig_conn_wait_end(conn, SETUP_TIMEOUT_MS)));
        TRY(conn, no_error(rdmamig_conn_close(conn)));
        printf("dest: argument checks passed; no post-copy (--no-postcopy)\n");
        rc = 0;
        goto fail;
    }

    f = (struct faults){.conn = conn, .uffd = uffd, .base = (uint64_t)host};
    EXPECT(pthread_create(&f.thread, NULL, forward_faults, &f) == 0);
    uint64_t stale = 0;
    for (uint64_t page = 0; page < pages; page++) stale += (uint64_t)is_stale(page);
    rdmamig_postcopy_progress p = {.size = sizeof p};
    TRY(conn, rdmamig_conn_wait_postcopy(conn, RDMAMIG_POSTCOPY_RUNNING, SETUP_TIMEOUT_MS, &p));
    EXPECT(p.pages_total == stale);
    /* The vCPUs run from here; a vCPU whose fault is never served blocks until the watchdog. */
    for (unsigned i = 0; i < VCPUS; i++) {
        v[i] = (struct vcpu){.index = i, .host = host, .pages = pages};
        EXPECT(pthread_create(&v[i].thread, NULL, vcpu_run, &v[i]) == 0);
    }
    unsigned bad = 0;
    for (unsigned i = 0; i < VCPUS; i++) {
        pthread_join(v[i].thread, NULL);
        bad |= v[i].bad;
    }
    EXPECT(!bad);
    rdmamig_postcopy_progress end = {.size = sizeof end};
    TRY(conn, rdmamig_conn_wait_postcopy(conn, RDMAMIG_POSTCOPY_DONE, 120000, &end));
    atomic_store(&f.stop, 1);
    pthread_join(f.thread, NULL);
    f.uffd = -1;
    EXPECT(!f.failed);
    if (f.forwarded == 0 || end.faults_served == 0)
        fprintf(stderr, "dest: FAIL no fault went through the hypervisor's userfaultfd (%" PRIu64
                        " forwarded, %" PRIu64 " served)\n", f.forwarded, end.faults_served);
    EXPECT(f.forwarded > 0 && end.faults_served > 0);
    EXPECT(end.pages_remaining == 0 && end.pages_total == stale);
    uint64_t differ = 0, first = 0;
    for (uint64_t page = 0; page < pages; page++)
        if (!holds_final(host, page) && differ++ == 0) first = page;
    if (differ)
        fprintf(stderr, "dest: FAIL %" PRIu64 " pages differ from the source's final memory (first %" PRIu64 ")\n",
                differ, first);
    EXPECT(differ == 0);
    TRY(conn, no_error(rdmamig_conn_wait_end(conn, SETUP_TIMEOUT_MS)));
    TRY(conn, no_error(rdmamig_conn_close(conn)));
    printf("dest: post-copy of %" PRIu64 " stale pages (%u MiB guest) through its own userfaultfd: %" PRIu64
           " faults forwarded, %" PRIu64 " served, %" PRIu64 " bytes pulled; every page the source's final\n",
           stale, mib, f.forwarded, end.faults_served, end.bytes_pulled);
    rc = 0;
fail:
    if (f.uffd >= 0) {
        /* A vCPU or the fault thread blocked on a page that never comes cannot be joined: exit without them. */
        fflush(stdout);
        _exit(1);
    }
    if (rc != 0 && !port && write(up, &port, sizeof port) < 0) perror("write"); /* tell the source we failed */
    if (rc != 0 && conn) rdmamig_conn_abort(conn);
    rdmamig_conn_free(conn);
    rdmamig_conn_free(plain_conn);
    rdmamig_listener_free(listener);
    rdmamig_listener_free(plain_listener);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    rdmamig_config_free(plain);
    if (uffd >= 0) close(uffd);
    if (devnull >= 0) close(devnull);
    if (host) munmap(host, len);
    return rc;
}

/* ---------------------------------------------------------------- source */

static int source(unsigned mib, uint16_t port, int up, int down) {
    who = "source";
    uint64_t len = (uint64_t)mib * MIB, pages = len / PAGE;
    size_t words = (size_t)((pages + 63) / 64);
    uint8_t *host = map_ram(len, -1);
    uint64_t *bitmap = calloc(words, sizeof *bitmap);
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = NULL;
    rdmamig_conn *conn = NULL, *plain_conn = NULL;
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC), rc = 1;

    EXPECT(host && bitmap && cfg && devnull >= 0);
    uint64_t *w64 = (uint64_t *)host;
    for (uint64_t page = 0; page < pages; page++)
        for (uint64_t w = 0; w < WORDS; w++) w64[page * WORDS + w] = word(page, w, 0);
    ram = registry(host, len);
    EXPECT(ram);
    TRY(NULL, rdmamig_config_set_timeout_ms(cfg, SETUP_TIMEOUT_MS));

    /* First the destination without the setting: connected until it checked. */
    uint16_t plain_port = 0;
    char checked = 0;
    EXPECT(read(up, &plain_port, sizeof plain_port) == (ssize_t)sizeof plain_port && plain_port != 0);
    TRY(NULL, rdmamig_connect(rdma_ip(), plain_port, cfg, ram, &plain_conn));
    EXPECT(read(up, &checked, 1) == 1 && checked == 1);
    rdmamig_conn_abort(plain_conn);

    TRY(NULL, rdmamig_connect(rdma_ip(), port, cfg, ram, &conn));
    /* The destination's call on a source: the wrong role. */
    CHECK_STATUS(rdmamig_conn_postcopy_userfaultfd(conn, devnull, NULL, 0), RDMAMIG_ERR_STATE);
    EXPECT(failed == 0);
    TRY(conn, rdmamig_conn_iteration_begin(conn));
    TRY(conn, rdmamig_conn_save(conn, 0, 0, len));
    TRY(conn, rdmamig_conn_iteration_end(conn));

    /* The guest keeps running: the stale pages change after they were sent. */
    uint64_t stale = 0;
    for (uint64_t page = 0; page < pages; page++) {
        if (!is_stale(page)) continue;
        for (uint64_t w = 0; w < WORDS; w++) w64[page * WORDS + w] = word(page, w, 1);
        bitmap[page / 64] |= UINT64_C(1) << (page % 64);
        stale++;
    }
    if (no_postcopy) {
        TRY(conn, no_error(rdmamig_conn_close(conn)));
        printf("source: argument checks passed; no post-copy (--no-postcopy)\n");
        rc = 0;
        goto fail;
    }
    char calling = 1;
    EXPECT(write(down, &calling, 1) == 1);
    rdmamig_stale_pages entry = {.block = 0, .bitmap = bitmap, .bitmap_words = words};
    rdmamig_postcopy_summary summary = {0};
    TRY(conn, rdmamig_conn_postcopy(conn, &entry, 1, &summary));
    EXPECT(summary.pages == stale);
    TRY(conn, no_error(rdmamig_conn_close(conn)));
    printf("source: %u MiB, %" PRIu64 " stale pages pulled by the destination (%" PRIu64 " faults), completed\n", mib,
           stale, summary.faults);
    rc = 0;
fail:
    if (rc != 0 && conn) rdmamig_conn_abort(conn);
    rdmamig_conn_free(conn);
    rdmamig_conn_free(plain_conn);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    free(bitmap);
    if (devnull >= 0) close(devnull);
    if (host) munmap(host, len);
    return rc;
}

/* run_pair's two ends, with the pipe down from the source to the destination. */
struct run {
    unsigned mib;
    int down[2];
};

static int run_destination(void *arg, int wr) {
    struct run *r = arg;
    close(r->down[1]);
    return destination(r->mib, wr, r->down[0]);
}

static int run_source(void *arg, uint16_t port, int rd) {
    struct run *r = arg;
    close(r->down[0]);
    return source(r->mib, port, rd, r->down[1]);
}

int main(int argc, char **argv) {
    who = "hypervisor_uffd";
    struct run run = {.mib = 16};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
            run.mib = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--no-postcopy") == 0)
            no_postcopy = 1;
        else {
            fprintf(stderr, "usage: %s [--mib N] [--no-postcopy]\n", argv[0]);
            return 2;
        }
    }
    if (run.mib < 1) run.mib = 1;
    if (pipe(run.down) != 0) {
        perror("pipe");
        return EXIT_FAILURE;
    }
    return run_pair(run_destination, run_source, &run, WATCHDOG_S);
}
