/* Test-only functions of librdmamig: exported (their symbols stay in the ABI
 * so that programs built against older headers keep loading) but not in the
 * public header include/rdmamig.h. Not installed; for the tests in c-tests/
 * only. scripts/check-abi.sh checks that the exported symbols are exactly
 * those of rdmamig.h and of this file. */
#ifndef RDMAMIG_TESTING_H
#define RDMAMIG_TESTING_H

#include "rdmamig.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The protocol version sent in the connection private data. Default 1 (the
 * only version QEMU speaks); tests set another to check that a mismatch is
 * refused (RDMAMIG_ERR_VERSION). RDMAMIG_ERR_NULL_PARAMETER for a NULL
 * config. (RDMAMIG_0.1) */
rdmamig_status rdmamig_config_set_protocol_version(rdmamig_config *config, uint32_t protocol_version);

#ifdef __cplusplus
}
#endif

#endif /* RDMAMIG_TESTING_H */
