/* Host C test of the rdmamig C ABI conventions: version, status strings,
 * NULL handling, the panic boundary, the device probe. Runs on any host, and
 * in the rxe guest (where a device exists). Built by `make c-tests` with
 * -Wall -Wextra -Werror and ASan/UBSan. Last line: "N passed, M failed". */
#include "rdmamig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (cond) {                                                          \
            passed++;                                                        \
        } else {                                                             \
            failed++;                                                        \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);  \
        }                                                                    \
    } while (0)

#define CHECK_STATUS(expr, want)                                             \
    do {                                                                     \
        rdmamig_status got_ = (expr);                                        \
        if (got_ == (rdmamig_status)(want)) {                                \
            passed++;                                                        \
        } else {                                                             \
            failed++;                                                        \
            fprintf(stderr, "FAIL %s:%d: %s gave %u (%s), want %s\n",        \
                    __FILE__, __LINE__, #expr, (unsigned)got_,               \
                    rdmamig_status_str(got_), #want);                        \
        }                                                                    \
    } while (0)

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
    CHECK(n == RDMAMIG_ERR_BUFFER_TOO_SMALL + 1);
}

static void test_null_and_config(void) {
    CHECK_STATUS(rdmamig_config_set_pin_all(NULL, true), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_extensions(NULL, false), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_protocol_version(NULL, 1), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_config_set_timeout_ms(NULL, 1000), RDMAMIG_ERR_NULL_PARAMETER);
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
    rdmamig_config_free(c);
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

int main(void) {
    test_version();
    test_status();
    test_null_and_config();
    test_panic_boundary();
    test_device_probe();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
