/*
 * memcheck-init: PID 1 of the Linux guest that integrations/qemu/guest-test.py
 * migrates.  It loads the virtio-serial modules (given on the kernel
 * command line as memcheck.modules=a.ko,b.ko,..., in load order), then
 * rewrites MEMCHECK_MIB of memory for ever, one pass after another: before
 * rewriting a page it checks that the page still holds what the previous
 * pass wrote there (each 8-byte word: the page's index << 32 | the pass).
 * Memory a migration lost or tore therefore shows up in the next pass.  One
 * line per pass goes to the virtio port (/dev/vport0p1) and to the serial
 * console:
 *
 *   memcheck: pass N ok
 *   memcheck: pass N CORRUPT: B pages, first page P holds 0x... (expected 0x...)
 *
 * Before it, the first-touch probe's lines of that pass, for each of its
 * two reads, "recent" and "old":
 *
 *   memcheck: pass N slow recent touches (us before this line:us): A:L ...  (virtio only)
 *   memcheck: pass N recent touches: K slow, p50 X us, p99 Y us, max Z us
 *
 * With each page it rewrites, the guest times (TSC) one read of the page it
 * rewrote RECENT_LAG_PAGES before ("recent") and, before checking the page,
 * its first read of the page ("old": last written a pass ago).  A page
 * post-copy has not yet brought to the destination stops the vCPU on such a
 * read until the page is there.  The pages stale at the switch to post-copy
 * are the ones the guest wrote since the migration's last rounds began,
 * just behind the page it was at: the recent read sweeps them when the guest
 * goes on on the destination; the old read meets present pages, and counts
 * what slows a read that does not fault (interrupts, the hosts'
 * scheduling), with the same exposure.  K counts the reads slower than
 * memcheck.slow_us= on the kernel command line (SLOW_TOUCH_US by default),
 * X, Y, Z are their percentiles; the virtio-only line gives each of them,
 * when it began (A us before the line was written) and how long it took (L
 * us), so that the host can keep those of a time window (guest-test.py
 * --bench-postcopy).  memcheck.slow_us=0 counts every read.
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MEMCHECK_MIB 96
#define PAGE_WORDS (4096 / sizeof(uint64_t))
#define PAGES ((size_t)MEMCHECK_MIB << 20 >> 12)
/*
 * Under TCG in the rxe guest (nested), a present page's first read took
 * 2.4 us at the median and 10-13 us at the 99th percentile (every first
 * touch of four passes, no migration); a userfaultfd fault costs two
 * thread wake-ups and a copy, over 100 us there (docs/benchmarks.md).
 * Reads the guest's or the hosts' interrupts and scheduling stretch past
 * 50 us (50-130 a pass) are not faults either: the old read counts them.
 */
#define SLOW_TOUCH_US 50
/*
 * 4 MiB: the guest rewrites that in 0.4-1.2 s there, less than the first
 * round through its 256 MiB takes (1-2 s): at the switch the pages from
 * RECENT_LAG_PAGES behind on are stale, unless sent again since.
 */
#define RECENT_LAG_PAGES 1024

/* The slow reads of one kind in the current pass. */
struct probe {
    const char *name;
    size_t count;
    uint64_t ticks[PAGES], at[PAGES];
};

static FILE *serial, *virtio;

static void vsay(int to_serial, const char *fmt, va_list ap)
{
    FILE *out[] = { to_serial ? serial : NULL, virtio };

    for (size_t i = 0; i < 2; i++) {
        va_list copy;

        if (!out[i]) {
            continue;
        }
        va_copy(copy, ap);
        vfprintf(out[i], fmt, copy);
        va_end(copy);
        fflush(out[i]);
    }
}

/* Prints to the serial console and the virtio port. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsay(1, fmt, ap);
    va_end(ap);
}

/* Prints to the virtio port alone: the emulated UART's byte-by-byte output
 * would delay the line by milliseconds (ages are counted to the write). */
static void say_virtio(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say_virtio(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsay(0, fmt, ap);
    va_end(ap);
}

/* The TSC: under TCG QEMU's rdtsc reads the host's, which runs on while a
 * vCPU waits for a page and stops while the VM is stopped. */
static inline uint64_t tsc(void)
{
    uint32_t lo, hi;

    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi) : : "memory");
    return (uint64_t)hi << 32 | lo;
}

/* TSC ticks per microsecond, against CLOCK_MONOTONIC over 200 ms. */
static double tsc_per_us(void)
{
    struct timespec t0, t1;
    uint64_t c0, c1;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    c0 = tsc();
    usleep(200 * 1000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    c1 = tsc();
    return (double)(c1 - c0) /
           ((t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3);
}

static int by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* The nearest-rank PERCENT percentile of the N sorted values V, in us. */
static double percentile_us(const uint64_t *v, size_t n, unsigned percent,
                            double ticks_per_us)
{
    size_t rank = (n * percent + 99) / 100;

    return n ? v[rank ? rank - 1 : 0] / ticks_per_us : 0;
}

/* Times one read of WORD; keeps it in PROBE if slower than SLOW_TICKS. */
static inline void timed_read(struct probe *probe, const uint64_t *word, uint64_t slow_ticks)
{
    uint64_t at = tsc(), ticks;

    (void)*(const volatile uint64_t *)word;
    ticks = tsc() - at;
    if (ticks > slow_ticks) {
        probe->at[probe->count] = at;
        probe->ticks[probe->count++] = ticks;
    }
}

/* PROBE's lines of PASS (see the top); empties it. */
static void print_probe(uint64_t pass, struct probe *probe, double ticks_per_us)
{
    static char line[PAGES * 24 + 128];
    size_t len = 0, n = probe->count;
    uint64_t now = tsc(), *v = probe->ticks;

    for (size_t i = 0; i < n && len < sizeof(line) - 64; i++) {
        len += snprintf(line + len, sizeof(line) - len, " %.0f:%.1f",
                        (now - probe->at[i]) / ticks_per_us, v[i] / ticks_per_us);
    }
    line[len] = 0;
    say_virtio("memcheck: pass %llu slow %s touches (us before this line:us):%s\n",
               (unsigned long long)pass, probe->name, line);
    qsort(v, n, sizeof(v[0]), by_value);
    say("memcheck: pass %llu %s touches: %zu slow, p50 %.1f us, p99 %.1f us, max %.1f us\n",
        (unsigned long long)pass, probe->name, n, percentile_us(v, n, 50, ticks_per_us),
        percentile_us(v, n, 99, ticks_per_us), percentile_us(v, n, 100, ticks_per_us));
    probe->count = 0;
}

/* Loads each module of the comma-separated list under /lib/modules. */
static void load_modules(const char *list)
{
    char *copy = strdup(list), *save = NULL;

    for (char *m = strtok_r(copy, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
        char path[256];
        int fd;

        snprintf(path, sizeof(path), "/lib/modules/%s", m);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || syscall(SYS_finit_module, fd, "", 0) != 0) {
            say("memcheck: cannot load %s: %m\n", path);
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    free(copy);
}

/* The value of NAME=... on the kernel command line, or NULL. */
static char *cmdline_arg(const char *name)
{
    static char line[4096];
    size_t len = strlen(name);
    FILE *f = fopen("/proc/cmdline", "r");

    if (!f || !fgets(line, sizeof(line), f)) {
        return NULL;
    }
    fclose(f);
    for (char *w = strtok(line, " \n"); w; w = strtok(NULL, " \n")) {
        if (!strncmp(w, name, len) && w[len] == '=') {
            return w + len + 1;
        }
    }
    return NULL;
}

int main(void)
{
    const size_t pages = PAGES;
    static struct probe recent = { .name = "recent" }, old = { .name = "old" };
    uint64_t *mem, slow_ticks;
    char *modules, *slow_us;
    double ticks_per_us;

    mkdir("/dev", 0755);
    mkdir("/proc", 0755);
    mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
    mount("proc", "/proc", "proc", 0, NULL);
    mkdir("/sys", 0755);
    mount("sysfs", "/sys", "sysfs", 0, NULL);
    serial = fopen("/dev/ttyS0", "w");
    modules = cmdline_arg("memcheck.modules");
    if (modules) {
        load_modules(modules);
    }
    /*
     * The virtio-serial port (QEMU's virtserialport, port 1): its open fails
     * (ENXIO) until the driver has probed the device and QEMU has said the
     * port is ready.
     */
    for (int i = 0; i < 100 && !virtio; i++) {
        int fd = open("/dev/vport0p1", O_WRONLY | O_CLOEXEC);

        virtio = fd < 0 ? NULL : fdopen(fd, "w");
        if (!virtio) {
            usleep(100 * 1000);
        }
    }
    say("memcheck: %d MiB, virtio-serial %s\n", MEMCHECK_MIB,
        virtio ? "up" : "MISSING");
    slow_us = cmdline_arg("memcheck.slow_us");
    ticks_per_us = tsc_per_us();
    slow_ticks = (slow_us ? strtoull(slow_us, NULL, 10) : SLOW_TOUCH_US) * ticks_per_us;
    say("memcheck: timed reads slower than %.0f us are slow (TSC %.0f MHz)\n",
        slow_ticks / ticks_per_us, ticks_per_us);

    mem = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (mem == MAP_FAILED) {
        say("memcheck: mmap failed: %m\n");
        for (;;) {
            pause();
        }
    }
    for (uint64_t pass = 1;; pass++) {
        uint64_t bad = 0, first = 0, seen = 0, expected = 0;

        for (uint64_t p = 0; p < pages; p++) {
            uint64_t *w = mem + p * PAGE_WORDS;
            uint64_t want = p << 32 | (pass - 1), now = p << 32 | pass;
            timed_read(&old, w, slow_ticks);
            if (pass > 1) {
                for (size_t k = 0; k < PAGE_WORDS; k++) {
                    if (w[k] != want) {
                        if (!bad++) {
                            first = p;
                            seen = w[k];
                            expected = want;
                        }
                        break;
                    }
                }
            }
            for (size_t k = 0; k < PAGE_WORDS; k++) {
                w[k] = now;
            }
            timed_read(&recent, mem + (p + pages - RECENT_LAG_PAGES) % pages * PAGE_WORDS,
                       slow_ticks);
        }
        print_probe(pass, &recent, ticks_per_us);
        print_probe(pass, &old, ticks_per_us);
        if (bad) {
            say("memcheck: pass %llu CORRUPT: %llu pages, first page %llu holds "
                "0x%llx (expected 0x%llx)\n", (unsigned long long)pass,
                (unsigned long long)bad, (unsigned long long)first,
                (unsigned long long)seen, (unsigned long long)expected);
        } else {
            say("memcheck: pass %llu ok\n", (unsigned long long)pass);
        }
    }
}
