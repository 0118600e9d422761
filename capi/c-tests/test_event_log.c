/* Host C test of the event-loop and logging API's conventions: the wait
 * constants and RDMAMIG_ERR_WOULD_BLOCK, rdmamig_conn_event_fd's and the
 * non-blocking calls' NULL checks, and rdmamig_set_log_callback: its level
 * checks, a record delivered on the caller's thread (a connect that fails
 * before any device is reached: 127.0.0.1 has none, here or in the rxe
 * guest), the level filter, and removal. Built by `make c-tests` with
 * -Wall -Wextra -Werror and ASan/UBSan. Last line: "N passed, M failed". */
#include "rdmamig.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static void test_constants(void) {
    CHECK(RDMAMIG_WAIT_FOREVER == 0);
    CHECK(RDMAMIG_NO_WAIT == UINT32_MAX);
    CHECK(RDMAMIG_ERR_WOULD_BLOCK == 21);
    CHECK(strstr(rdmamig_status_str(RDMAMIG_ERR_WOULD_BLOCK), "not to wait") != NULL);
    CHECK(RDMAMIG_LOG_ERROR == 1 && RDMAMIG_LOG_WARN == 2 && RDMAMIG_LOG_INFO == 3 && RDMAMIG_LOG_DEBUG == 4);
    CHECK(sizeof(rdmamig_log_level) == 4);
}

static void test_null_conn(void) {
    int fd = -7;
    CHECK_STATUS(rdmamig_conn_event_fd(NULL, &fd), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(fd == -7);
    CHECK_STATUS(rdmamig_conn_event_fd(NULL, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    char msg[128];
    rdmamig_last_error_message(msg, sizeof msg);
    CHECK(strcmp(msg, "rdmamig_conn_event_fd: conn is NULL") == 0);
    CHECK_STATUS(rdmamig_listener_event_fd(NULL, &fd), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(fd == -7);
    rdmamig_last_error_message(msg, sizeof msg);
    CHECK(strcmp(msg, "rdmamig_listener_event_fd: listener is NULL") == 0);
    char buf[4];
    size_t n = 99;
    uint64_t done = 99;
    CHECK_STATUS(rdmamig_conn_get(NULL, buf, sizeof buf, RDMAMIG_NO_WAIT, &n), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(n == 99);
    CHECK_STATUS(rdmamig_conn_wait_iteration(NULL, 1, RDMAMIG_NO_WAIT, &done), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(done == 99);
    CHECK_STATUS(rdmamig_conn_wait_end(NULL, RDMAMIG_NO_WAIT), RDMAMIG_ERR_NULL_PARAMETER);
}

/* What the callback saw. */
struct seen {
    int records;
    int errors; /* of level RDMAMIG_LOG_ERROR */
    int on_caller_thread;
    pthread_t caller;
    char last[512];
};

static void collect(void *user_data, rdmamig_log_level level, const char *message) {
    struct seen *s = user_data;
    s->records++;
    if (level == RDMAMIG_LOG_ERROR) s->errors++;
    if (pthread_equal(pthread_self(), s->caller)) s->on_caller_thread++;
    snprintf(s->last, sizeof s->last, "%s", message);
}

/* A connect that fails quickly: 127.0.0.1 has no RDMA device. */
static void failing_connect(void) {
    rdmamig_config *cfg = rdmamig_config_new();
    rdmamig_ram *ram = rdmamig_ram_new();
    static char mem[4096];
    uint32_t idx;
    rdmamig_conn *c = NULL;
    CHECK(cfg && ram);
    if (!cfg || !ram) goto out;
    CHECK_STATUS(rdmamig_config_set_timeout_ms(cfg, 2000), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_ram_add_block(ram, "pc.ram", mem, 0, sizeof mem, &idx), RDMAMIG_OK);
    CHECK(rdmamig_connect("127.0.0.1", 1, cfg, ram, &c) != RDMAMIG_OK);
    CHECK(c == NULL);
out:
    rdmamig_ram_free(ram);
    rdmamig_config_free(cfg);
}

static void test_log_callback(void) {
    struct seen s;
    memset(&s, 0, sizeof s);
    s.caller = pthread_self();
    /* Unknown levels are refused and install nothing. */
    CHECK_STATUS(rdmamig_set_log_callback(collect, &s, 0), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_set_log_callback(collect, &s, 5), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_set_log_callback(collect, &s, UINT32_MAX), RDMAMIG_ERR_INVALID_ARGUMENT);
    failing_connect();
    CHECK(s.records == 0); /* silent by default */

    CHECK_STATUS(rdmamig_set_log_callback(collect, &s, RDMAMIG_LOG_ERROR), RDMAMIG_OK);
    failing_connect();
    CHECK(s.records == 1);
    CHECK(s.errors == 1);
    CHECK(s.on_caller_thread == 1);
    CHECK(strstr(s.last, "127.0.0.1:1") != NULL);
    printf("log record: %s\n", s.last);

    /* Replaced by a NULL callback: silent again (user_data, level ignored). */
    CHECK_STATUS(rdmamig_set_log_callback(NULL, NULL, 0), RDMAMIG_OK);
    failing_connect();
    CHECK(s.records == 1);
    /* Removing twice is fine. */
    CHECK_STATUS(rdmamig_set_log_callback(NULL, &s, 12345), RDMAMIG_OK);
}

int main(void) {
    test_constants();
    test_null_conn();
    test_log_callback();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
