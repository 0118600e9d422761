/* The C tests' counters, CHECK and CHECK_STATUS: count a passed check, or print the failed
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

/* CHECK that `expr` gives the status `want` (printing both names if not). */
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

#endif
