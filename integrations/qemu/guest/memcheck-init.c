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
#include <unistd.h>

#define MEMCHECK_MIB 96
#define PAGE_WORDS (4096 / sizeof(uint64_t))

static FILE *serial, *virtio;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    FILE *out[] = { serial, virtio };

    for (size_t i = 0; i < 2; i++) {
        if (!out[i]) {
            continue;
        }
        va_start(ap, fmt);
        vfprintf(out[i], fmt, ap);
        va_end(ap);
        fflush(out[i]);
    }
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
    const size_t pages = (size_t)MEMCHECK_MIB << 20 >> 12;
    uint64_t *mem;
    char *modules;

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
        }
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
