/* The C tests' counters and CHECK: count a passed check, or print the failed
 * condition with its place. Each test ends by printing "N passed, M failed". */
#ifndef RDMAMIG_C_TESTS_CHECK_H
#define RDMAMIG_C_TESTS_CHECK_H

#include <stdio.h>

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

#endif
