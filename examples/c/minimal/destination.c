/* destination.c -- the smallest rdmamig destination: listens on ADDRESS:PORT,
 * accepts one source, lets it write a 64 MiB RAM block, reads the device-state
 * stream (the pattern's seed) until the migration ends, checks every byte of
 * the block and prints OK. Its partner is source.c.
 *
 *   destination ADDRESS PORT      ADDRESS: an IP address of the RDMA device
 *
 * Build: cc -std=c11 destination.c $(pkg-config --cflags --libs rdmamig) */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <rdmamig.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define RAM_SIZE (64u << 20)
#define ACCEPT_TIMEOUT_MS 60000

/* Exits with the call that failed, its status and the library's message. */
#define CHECK(call) do { rdmamig_status st_ = (call); if (st_ != RDMAMIG_OK) fail(#call, st_); } while (0)

static void fail(const char *call, rdmamig_status st) {
    char msg[512];
    rdmamig_last_error_message(msg, sizeof msg);
    fprintf(stderr, "%s: %s: %s\n", call, rdmamig_status_str(st), msg);
    exit(1);
}

/* Word i of the block, as source.c writes it. */
static uint64_t pattern(uint64_t seed, size_t i) { return (seed + i) * UINT64_C(0x9E3779B97F4A7C15); }

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s ADDRESS PORT\n", argv[0]); return 2; }
    uint64_t *guest = mmap(NULL, RAM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (guest == MAP_FAILED) { perror("mmap"); return 1; }
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = rdmamig_ram_new();
    rdmamig_listener *listener;
    rdmamig_conn *conn;
    /* The same name and length as the source's block. */
    CHECK(rdmamig_ram_add_block(ram, "pc.ram", guest, 0, RAM_SIZE, NULL));
    CHECK(rdmamig_listener_new(argv[1], (uint16_t)atoi(argv[2]), cfg, &listener));
    CHECK(rdmamig_listener_accept(listener, ram, ACCEPT_TIMEOUT_MS, &conn));

    /* RAM arrives without our help; the stream ends with the migration's outcome. */
    unsigned char stream[64];
    size_t got = 0, n;
    rdmamig_status st = RDMAMIG_OK;
    while (got < sizeof stream &&
           (st = rdmamig_conn_get(conn, stream + got, sizeof stream - got, RDMAMIG_WAIT_FOREVER, &n)) == RDMAMIG_OK)
        got += n;
    if (st != RDMAMIG_END_COMPLETED) fail("rdmamig_conn_get", st);
    CHECK(rdmamig_conn_close(conn)); /* RDMAMIG_OK: completed, as the source's close says */
    rdmamig_conn_free(conn); /* the block is ours again */
    rdmamig_listener_free(listener);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    uint64_t seed;
    if (got != sizeof seed) {
        fprintf(stderr, "the stream held %zu bytes, not the seed's %zu\n", got, sizeof seed);
        return 1;
    }
    memcpy(&seed, stream, sizeof seed);
    for (size_t i = 0; i < RAM_SIZE / sizeof *guest; i++)
        if (guest[i] != pattern(seed, i)) {
            fprintf(stderr, "byte %zu: %#" PRIx64 ", expected %#" PRIx64 "\n", i * 8, guest[i], pattern(seed, i));
            return 1;
        }
    puts("OK");
    return 0;
}
