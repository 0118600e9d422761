/* Host C test of the rdmamig C ABI conventions: version, status strings,
 * NULL handling, the panic boundary, the device probe, the migration API's
 * argument checks. Runs on any host, and in the rxe guest (where a device
 * exists). Built by `make c-tests` with
 * -Wall -Wextra -Werror and ASan/UBSan. Last line: "N passed, M failed". */
#include "rdmamig.h"
#include "rdmamig_testing.h" /* rdmamig_config_set_protocol_version: not in the public header */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#define STR_(x) #x
#define STR(x) STR_(x)

static void test_version(void) {
    const char *v = rdmamig_version();
    CHECK(v != NULL);
    if (!v) return;
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", RDMAMIG_VERSION_MAJOR, RDMAMIG_VERSION_MINOR,
             RDMAMIG_VERSION_PATCH);
    CHECK(strcmp(v, want) == 0);
    CHECK(strcmp(v, STR(RDMAMIG_VERSION_MAJOR) "." STR(RDMAMIG_VERSION_MINOR) "." STR(
                        RDMAMIG_VERSION_PATCH)) == 0);
    CHECK(RDMAMIG_VERSION_NUMBER ==
          RDMAMIG_VERSION_MAJOR * 10000 + RDMAMIG_VERSION_MINOR * 100 + RDMAMIG_VERSION_PATCH);
    CHECK(rdmamig_version() == v); /* static string */
    printf("rdmamig_version() = %s\n", v);
}

static void test_status(void) {
    CHECK(sizeof(rdmamig_status) == 4);
    CHECK(RDMAMIG_OK == 0);
    CHECK(RDMAMIG_ERR_NULL_PARAMETER == 1);
    CHECK(RDMAMIG_ERR_PANIC == 2);
    CHECK(RDMAMIG_ERR_NO_DEVICE == 4);
    CHECK(RDMAMIG_ERR_BUFFER_TOO_SMALL == 15);
    CHECK(RDMAMIG_END_COMPLETED == 16);
    CHECK(RDMAMIG_END_UNVERIFIED == 17);
    CHECK(RDMAMIG_ERR_CANCELLED == 18);
    CHECK(RDMAMIG_ERR_PIN_BUDGET == 19);

    CHECK(strcmp(rdmamig_status_str(RDMAMIG_OK), "success") == 0);
    CHECK(strcmp(rdmamig_status_str(RDMAMIG_ERR_TIMEOUT), "timed out") == 0);
    CHECK(strcmp(rdmamig_status_str(RDMAMIG_ERR_NULL_PARAMETER),
                 "a required pointer argument was NULL") == 0);
    CHECK(strcmp(rdmamig_status_str(1000), "unknown status") == 0);
    CHECK(strcmp(rdmamig_status_str(UINT32_MAX), "unknown status") == 0);

    /* Every known value has its own non-empty string, and the first unknown one does not. */
    unsigned n = 0;
    for (uint32_t s = 0; s < 64; s++) {
        const char *str = rdmamig_status_str(s);
        CHECK(str != NULL && str[0] != '\0');
        if (str && strcmp(str, "unknown status") != 0) {
            n++;
            for (uint32_t t = 0; t < s; t++) CHECK(strcmp(str, rdmamig_status_str(t)) != 0);
        }
    }
    CHECK(n == RDMAMIG_ERR_WOULD_BLOCK + 1);

    /* Success is three values; everything else is an error, unknown values included. */
    for (uint32_t s = 0; s < 64; s++) {
        bool success = s == RDMAMIG_OK || s == RDMAMIG_END_COMPLETED || s == RDMAMIG_END_UNVERIFIED;
        CHECK(rdmamig_status_is_error(s) == !success);
    }
    CHECK(rdmamig_status_is_error(RDMAMIG_ERR_WOULD_BLOCK));
    CHECK(rdmamig_status_is_error(UINT32_MAX));
}

static void test_null_and_config(void) {
    CHECK_STATUS(rdmamig_config_set_pin_all(NULL, true), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_extensions(NULL, false), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_protocol_version(NULL, 1), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_timeout_ms(NULL, 1000), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_liveness_ms(NULL, 1000), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_pin_budget(NULL, 1 << 20), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_unregister_worker(NULL, true), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_auth_key(NULL, NULL, 0), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_allow_source(NULL, "192.0.2.1"), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_tos(NULL, 0xb8), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_return_path(NULL, true), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_max_bandwidth(NULL, 1), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_max_queued_bytes(NULL, 1), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_postcopy_recovery_ms(NULL, 1), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_handshake_timeout_ms(NULL, 1), RDMAMIG_ERR_NULL_PARAMETER);
    rdmamig_config_free(NULL); /* no-op */
    passed++;

    rdmamig_config *c = rdmamig_config_new();
    CHECK(c != NULL);
    if (!c) return;
    CHECK_STATUS(rdmamig_config_set_pin_all(c, true), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_extensions(c, false), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_protocol_version(c, 1), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_timeout_ms(c, 5000), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_timeout_ms(c, 0), RDMAMIG_ERR_INVALID_ARGUMENT);
    {   /* config failures keep their message too (one argument-checking toolkit) */
        char msg[128];
        rdmamig_last_error_message(msg, sizeof msg);
        CHECK(strcmp(msg, "rdmamig_config_set_timeout_ms: timeout_ms is 0") == 0);
        CHECK_STATUS(rdmamig_config_set_tos(NULL, 0), RDMAMIG_ERR_NULL_PARAMETER);
        rdmamig_last_error_message(msg, sizeof msg);
        CHECK(strcmp(msg, "rdmamig_config_set_tos: config is NULL") == 0);
    }
    CHECK_STATUS(rdmamig_config_set_handshake_timeout_ms(c, 2000), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_handshake_timeout_ms(c, 0), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_config_set_liveness_ms(c, 2000), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_liveness_ms(c, 0), RDMAMIG_OK); /* off */
    CHECK_STATUS(rdmamig_config_set_postcopy_recovery_ms(c, 30000), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_postcopy_recovery_ms(c, 0), RDMAMIG_OK); /* off */
    CHECK_STATUS(rdmamig_config_set_pin_budget(c, 64u << 20), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_pin_budget(c, 0), RDMAMIG_OK); /* from RLIMIT_MEMLOCK */
    CHECK_STATUS(rdmamig_config_set_unregister_worker(c, false), RDMAMIG_OK);
    static const uint8_t key[32] = "a 32-byte key for test_abi.c ..";
    CHECK_STATUS(rdmamig_config_set_auth_key(c, key, 15), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_config_set_auth_key(c, NULL, 16), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_auth_key(c, key, sizeof key), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_auth_key(c, NULL, 0), RDMAMIG_OK); /* removed */
    CHECK_STATUS(rdmamig_config_allow_source(c, "192.0.2.0/24"), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_allow_source(c, "2001:db8::/32"), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_allow_source(c, "192.0.2.0/33"), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_config_allow_source(c, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_tos(c, 0x6a), RDMAMIG_OK); /* DSCP 26, ECN 10 */
    CHECK_STATUS(rdmamig_config_set_tos(c, 0), RDMAMIG_OK);    /* the kernel's default */
    CHECK_STATUS(rdmamig_config_set_return_path(c, true), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_max_bandwidth(c, 100u << 20), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_max_bandwidth(c, 0), RDMAMIG_OK); /* no cap */
    CHECK_STATUS(rdmamig_config_set_max_queued_bytes(c, 4u << 20), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_config_set_max_queued_bytes(c, 0), RDMAMIG_OK); /* no bound */
    rdmamig_config_free(c);
    /* No connection, no worker: nothing to wait for. */
    CHECK_STATUS(rdmamig_unregister_flush(), RDMAMIG_OK);
}

static void test_panic_boundary(void) {
    fprintf(stderr, "(a panic message from rdmamig_selftest_panic_boundary follows; expected)\n");
    CHECK_STATUS(rdmamig_selftest_panic_boundary(), RDMAMIG_ERR_PANIC);
    /* The library still works after a caught panic. */
    CHECK_STATUS(rdmamig_selftest_panic_boundary(), RDMAMIG_ERR_PANIC);
    CHECK(rdmamig_version() != NULL);
}

static void test_device_probe(void) {
    char name[RDMAMIG_DEVICE_NAME_MAX + 1];
    memset(name, 'x', sizeof name);
    rdmamig_status s = rdmamig_device_probe(NULL, name, sizeof name);
    if (s == RDMAMIG_OK) {
        /* rxe guest or a host with a NIC. */
        printf("device probe: found %s\n", name);
        CHECK(memchr(name, '\0', sizeof name) != NULL && name[0] != '\0');
        char again[RDMAMIG_DEVICE_NAME_MAX + 1];
        CHECK_STATUS(rdmamig_device_probe(name, again, sizeof again), RDMAMIG_OK);
        CHECK(strcmp(name, again) == 0);
        char tiny[2];
        CHECK_STATUS(rdmamig_device_probe(NULL, tiny, sizeof tiny), RDMAMIG_ERR_BUFFER_TOO_SMALL);
        CHECK(tiny[1] == '\0');
        CHECK_STATUS(rdmamig_device_probe(NULL, NULL, 0), RDMAMIG_OK);
    } else {
        printf("device probe: %s\n", rdmamig_status_str(s));
        CHECK_STATUS(s, RDMAMIG_ERR_NO_DEVICE);
        CHECK(name[0] == 'x'); /* outputs are written only on success */
        CHECK_STATUS(rdmamig_device_probe(NULL, NULL, 0), RDMAMIG_ERR_NO_DEVICE);
    }
    CHECK_STATUS(rdmamig_device_probe("rdmamig-no-such-device", name, sizeof name),
                 RDMAMIG_ERR_NO_DEVICE);
    CHECK_STATUS(rdmamig_device_probe(NULL, NULL, 16), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_device_probe("\xff\xfe", name, sizeof name), RDMAMIG_ERR_INVALID_ARGUMENT);
}

/* The structs are named, so a caller can forward-declare them (this does not
 * compile, -Werror, if `struct rdmamig_stats` is not the type `rdmamig_stats`). */
struct rdmamig_stats;
static uint32_t stats_size_of(const struct rdmamig_stats *st) { return st->size; }

/* The migration API without a device: NULL arguments, the registry, the
 * thread's last error message, the stats struct's size. */
static void test_migration_api_args(void) {
    char msg[256];
    static char mem[8192];
    rdmamig_listener *l = NULL;
    rdmamig_conn *c = NULL;
    bool b = false;
    uint64_t u = 0;
    size_t n = 0;
    uint32_t idx = 99;
    rdmamig_stats st = {.size = sizeof st};
    rdmamig_stream_ops ops;

    CHECK(sizeof(rdmamig_stats) == RDMAMIG_STATS_SIZE_V2);
    CHECK(offsetof(rdmamig_stats, pin_budget) == RDMAMIG_STATS_SIZE_V1);
    CHECK(sizeof(rdmamig_postcopy_progress) == RDMAMIG_POSTCOPY_PROGRESS_SIZE_V2);
    CHECK(offsetof(rdmamig_postcopy_progress, recoveries) == RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1);
    /* No implicit padding: `reserved` fills the 4 bytes after `size`. */
    CHECK(offsetof(rdmamig_stats, reserved) == 4 && offsetof(rdmamig_stats, bytes_written) == 8);
    CHECK(sizeof(rdmamig_stats) == 8 + 8 * ((sizeof(rdmamig_stats) - 8) / 8));
    CHECK_STATUS(rdmamig_ram_add_block(NULL, "pc.ram", mem, 0, 4096, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    n = rdmamig_last_error_message(msg, sizeof msg);
    CHECK(n == strlen(msg) && strstr(msg, "ram is NULL") != NULL);
    CHECK(rdmamig_last_error_message(NULL, 0) == n); /* size query */
    CHECK(rdmamig_ram_block_count(NULL) == 0);
    CHECK_STATUS(rdmamig_ram_set_backing(NULL, 0, 0, 0), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(rdmamig_listener_port(NULL) == 0);
    CHECK_STATUS(rdmamig_listener_cancel(NULL), RDMAMIG_ERR_NULL_PARAMETER);
    rdmamig_ram_free(NULL); /* no-ops */
    rdmamig_listener_free(NULL);
    rdmamig_conn_free(NULL);
    passed++;

    CHECK_STATUS(rdmamig_listener_new(NULL, 0, NULL, &l), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_listener_accept(NULL, NULL, 1, &c), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_connect(NULL, 1, NULL, NULL, &c), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(l == NULL && c == NULL); /* outputs are written only on success */
    CHECK_STATUS(rdmamig_conn_close(NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_negotiated(NULL, &b, &b), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_negotiated_postcopy_recovery(NULL, &b), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_negotiated_authenticated(NULL, &b), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_iteration_begin(NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_save(NULL, 0, 0, 4096), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_iteration_end(NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_put(NULL, mem, 1), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_put_return(NULL, mem, 1), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_set_max_bandwidth(NULL, 1), RDMAMIG_ERR_NULL_PARAMETER);
    rdmamig_range range = {0};
    CHECK_STATUS(rdmamig_conn_save_ranges(NULL, &range, 1), RDMAMIG_ERR_NULL_PARAMETER);
    static const uint64_t bits[2] = {1, 1};
    CHECK_STATUS(rdmamig_conn_save_bitmap(NULL, 0, bits, 0, 65, 4096), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_flush(NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_get(NULL, mem, 1, 1, &n), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_wait_iteration(NULL, 1, 1, &u), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_wait_end(NULL, 1), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_abort(NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_hint(NULL, 0, 0, 4096, RDMAMIG_HINT_COLD), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_conn_get_stats(NULL, &st), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(st.size == sizeof st && stats_size_of(&st) == sizeof st);
    CHECK_STATUS(rdmamig_conn_stream_ops(NULL, &ops), RDMAMIG_ERR_NULL_PARAMETER);
    rdmamig_last_error_message(msg, sizeof msg);
    CHECK(strcmp(msg, "rdmamig_conn_stream_ops: conn is NULL") == 0);
    memset(msg, 'x', sizeof msg);
    CHECK(rdmamig_conn_error_message(NULL, msg, sizeof msg) == 0 && msg[0] == '\0');

    /* The registry needs no device. */
    rdmamig_ram *ram = rdmamig_ram_new();
    rdmamig_ram *empty = rdmamig_ram_new();
    rdmamig_config *cfg = rdmamig_config_new();
    CHECK(ram != NULL && empty != NULL && cfg != NULL);
    if (!ram || !empty || !cfg) goto out;
    CHECK_STATUS(rdmamig_ram_add_block(ram, "pc.ram", mem, 0, 4096, &idx), RDMAMIG_OK);
    CHECK(idx == 0);
    CHECK_STATUS(rdmamig_ram_add_block(ram, "vga.vram", mem + 4096, 1u << 30, 4096, NULL), RDMAMIG_OK);
    idx = 99;
    CHECK_STATUS(rdmamig_ram_add_block(ram, "pc.ram", mem, 0, 4096, &idx), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK(idx == 99);
    rdmamig_last_error_message(msg, sizeof msg);
    CHECK(strstr(msg, "pc.ram") != NULL);
    CHECK_STATUS(rdmamig_ram_add_block(ram, "zero", mem, 0, 0, &idx), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_ram_add_block(ram, "nohost", NULL, 0, 4096, &idx), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_ram_add_block(ram, NULL, mem, 0, 4096, &idx), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_ram_add_block(ram, "\xff", mem, 0, 4096, &idx), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK(rdmamig_ram_block_count(ram) == 2);
    /* A backing file: the block index, the descriptor and the file are checked. */
    CHECK_STATUS(rdmamig_ram_set_backing(ram, 2, 0, 0), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_ram_set_backing(ram, 0, -1, 0), RDMAMIG_ERR_INVALID_ARGUMENT);
    int pipe_fds[2];
    CHECK(pipe(pipe_fds) == 0); /* not a regular file */
    CHECK_STATUS(rdmamig_ram_set_backing(ram, 0, pipe_fds[0], 0), RDMAMIG_ERR_INVALID_ARGUMENT);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    /* An empty registry is refused before any device is touched. */
    CHECK_STATUS(rdmamig_connect("127.0.0.1", 1, cfg, empty, &c), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK(c == NULL);
    rdmamig_last_error_message(msg, sizeof msg);
    CHECK(strstr(msg, "empty") != NULL);
    CHECK_STATUS(rdmamig_connect("127.0.0.1", 1, NULL, ram, &c), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_connect("127.0.0.1", 1, cfg, ram, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_listener_new("0.0.0.0", 0, cfg, NULL), RDMAMIG_ERR_NULL_PARAMETER);
out:
    rdmamig_config_free(cfg);
    rdmamig_ram_free(empty);
    rdmamig_ram_free(ram);
}

int main(void) {
    test_version();
    test_status();
    test_null_and_config();
    test_panic_boundary();
    test_device_probe();
    test_migration_api_args();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
