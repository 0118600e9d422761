/* source.c -- the smallest rdmamig source: fills a 64 MiB RAM block with a
 * pattern, connects to the destination at ADDRESS:PORT (retrying while
 * nobody listens there yet), migrates the block in two iterations (all of it,
 * then the page the guest dirtied meanwhile), sends the pattern's seed as
 * device state, closes and prints OK once the destination has acknowledged
 * the end. Its partner is destination.c.
 *
 *   source ADDRESS PORT           ADDRESS: the destination's address
 *
 * Build: cc -std=c11 source.c $(pkg-config --cflags --libs rdmamig) */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <rdmamig.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define RAM_SIZE (64u << 20)
#define PAGE 4096u
#define CONNECT_DEADLINE_S 60

/* Exits with the call that failed, its status and the library's message. */
#define CHECK(call) do { rdmamig_status st_ = (call); if (st_ != RDMAMIG_OK) fail(#call, st_); } while (0)

static void fail(const char *call, rdmamig_status st) {
    char msg[512];
    rdmamig_last_error_message(msg, sizeof msg);
    fprintf(stderr, "%s: %s: %s\n", call, rdmamig_status_str(st), msg);
    exit(1);
}

/* Word i of the block, as destination.c checks it. */
static uint64_t pattern(uint64_t seed, size_t i) { return (seed + i) * UINT64_C(0x9E3779B97F4A7C15); }

static void fill(uint64_t *guest, uint64_t seed, size_t from, size_t to) {
    for (size_t i = from / sizeof *guest; i < to / sizeof *guest; i++) guest[i] = pattern(seed, i);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s ADDRESS PORT\n", argv[0]); return 2; }
    uint64_t *guest = mmap(NULL, RAM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (guest == MAP_FAILED) { perror("mmap"); return 1; }
    uint64_t seed = (uint64_t)time(NULL);
    fill(guest, seed, 0, RAM_SIZE - PAGE); /* the guest writes its last page later */
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = rdmamig_ram_new();
    rdmamig_conn *conn;
    CHECK(rdmamig_ram_add_block(ram, "pc.ram", guest, 0, RAM_SIZE, NULL));
    /* A destination not listening yet refuses the connection (RDMAMIG_ERR_CONNECT). */
    time_t deadline = time(NULL) + CONNECT_DEADLINE_S;
    rdmamig_status st;
    while ((st = rdmamig_connect(argv[1], (uint16_t)atoi(argv[2]), cfg, ram, &conn)) == RDMAMIG_ERR_CONNECT &&
           time(NULL) < deadline)
        sleep(1);
    if (st != RDMAMIG_OK) fail("rdmamig_connect", st);

    CHECK(rdmamig_conn_iteration_begin(conn)); /* iteration 1: every page */
    CHECK(rdmamig_conn_save(conn, 0, 0, RAM_SIZE));
    CHECK(rdmamig_conn_iteration_end(conn));
    fill(guest, seed, RAM_SIZE - PAGE, RAM_SIZE); /* the guest ran on and dirtied one page */
    CHECK(rdmamig_conn_iteration_begin(conn)); /* iteration 2: the page dirtied meanwhile */
    CHECK(rdmamig_conn_save(conn, 0, RAM_SIZE - PAGE, PAGE));
    CHECK(rdmamig_conn_iteration_end(conn));
    CHECK(rdmamig_conn_put(conn, &seed, sizeof seed)); /* device state: here, the seed */
    CHECK(rdmamig_conn_flush(conn));
    CHECK(rdmamig_conn_close(conn)); /* RDMAMIG_OK: the destination acknowledged the end */
    rdmamig_conn_free(conn);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    puts("OK");
    return 0;
}
