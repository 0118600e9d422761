/* rdma_test_cancel: a destination's shutdown through the public header: a
 * thread blocked in rdmamig_listener_accept with no timeout is released by
 * rdmamig_listener_cancel from another thread (RDMAMIG_ERR_CANCELLED, within
 * 500 ms), a later accept fails at once, and the listener is then freed.
 * Needs an RDMA device with the address $RXE_VM_IP (default 198.18.0.1).
 * Last line: "N passed, M failed"; exit status 0 if all passed. */
#define _GNU_SOURCE
#include "rdmamig.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

struct accept_call {
    const rdmamig_listener *listener;
    const rdmamig_ram *ram;
    rdmamig_status status;
    double returned_at;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *accept_forever(void *arg) {
    struct accept_call *a = arg;
    rdmamig_conn *conn = NULL;
    a->status = rdmamig_listener_accept(a->listener, a->ram, 0 /* for ever */, &conn);
    a->returned_at = now();
    rdmamig_conn_free(conn); /* NULL unless something connected */
    return NULL;
}

int main(void) {
    const char *ip = getenv("RXE_VM_IP");
    if (!ip || !*ip) ip = "198.18.0.1";
    static uint8_t guest[1 << 20];
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = rdmamig_ram_new();
    rdmamig_listener *listener = NULL;
    CHECK(cfg && ram);
    CHECK(rdmamig_ram_add_block(ram, "pc.ram", guest, 0, sizeof guest, NULL) == RDMAMIG_OK);
    rdmamig_status st = rdmamig_listener_new(ip, 0, cfg, &listener);
    CHECK(st == RDMAMIG_OK);
    if (st != RDMAMIG_OK) {
        char msg[256];
        rdmamig_last_error_message(msg, sizeof msg);
        fprintf(stderr, "rdmamig_listener_new(%s): %s: %s\n", ip, rdmamig_status_str(st), msg);
    } else {
        struct accept_call a = {.listener = listener, .ram = ram};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, accept_forever, &a) == 0);
        usleep(300 * 1000);
        double cancelled_at = now();
        CHECK(rdmamig_listener_cancel(listener) == RDMAMIG_OK);
        pthread_join(t, NULL);
        double took = a.returned_at - cancelled_at;
        printf("cancel: accept returned %s after %.1f ms\n", rdmamig_status_str(a.status), took * 1e3);
        CHECK(a.status == RDMAMIG_ERR_CANCELLED);
        CHECK(took < 0.5);
        rdmamig_conn *conn = NULL;
        CHECK(rdmamig_listener_accept(listener, ram, 10000, &conn) == RDMAMIG_ERR_CANCELLED && conn == NULL);
        char msg[256];
        CHECK(rdmamig_last_error_message(msg, sizeof msg) > 0);
        printf("cancel: later accept: %s\n", msg);
    }
    rdmamig_listener_free(listener);
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
