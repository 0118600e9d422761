/* Host C test of the vSwitch reconfiguration planner's C API (rdmamig_fabric_*):
 * a generated 2-level fat tree of 8-port switches (8 leaves, 4 spines, 4
 * hypervisors per leaf with a PF and one VF each); a swap between two
 * hypervisors of one leaf (1 LFT SMP, on that leaf, plus 3 hypervisor SMPs),
 * applied and read back; a swap and a copy across leaves (at most 2 and 1 SMPs
 * per switch), applied; a fabric built piece by piece as from the SM's tables;
 * NULL and invalid arguments refused with their status and message. Built by
 * `make c-tests` with -Wall -Wextra -Werror and ASan/UBSan. Last line:
 * "N passed, M failed". */
#include "rdmamig.h"

#include <stdio.h>
#include <string.h>

#include "check.h"

static char msg[256];

static const char *last(void) {
    rdmamig_last_error_message(msg, sizeof msg);
    return msg;
}

/* The first VF LID of hypervisor `h`. */
static uint16_t vf_lid(const rdmamig_fabric *f, uint32_t h) {
    uint16_t lids[4] = {0};
    size_t n = 0;
    CHECK_STATUS(rdmamig_fabric_get_vf_lids(f, h, lids, 4, &n), RDMAMIG_OK);
    CHECK(n == 1);
    return lids[0];
}

static void test_fat_tree(void) {
    rdmamig_fabric *f = NULL;
    CHECK_STATUS(rdmamig_fabric_new_fat_tree(8, 2, 0, 0, 1, &f), RDMAMIG_OK);
    CHECK(f != NULL);
    if (!f) return;
    CHECK(rdmamig_fabric_hypervisor_count(f) == 32);
    rdmamig_fabric_hypervisor h0, h1, h31;
    CHECK_STATUS(rdmamig_fabric_get_hypervisor(f, 0, &h0), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_get_hypervisor(f, 1, &h1), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_get_hypervisor(f, 31, &h31), RDMAMIG_OK);
    CHECK(h0.switch_lid == h1.switch_lid && h0.port == 1 && h1.port == 2 && h0.vf_count == 1);
    CHECK(h31.switch_lid != h0.switch_lid);
    /* LIDs in order: hypervisor 0 has PF 1 and VF 2, hypervisor 1 PF 3 and VF 4. */
    CHECK(h0.pf_lid == 1 && vf_lid(f, 0) == 2 && vf_lid(f, 1) == 4);

    /* Same leaf: only that leaf's block 0 changes. */
    rdmamig_fabric_plan *p = NULL;
    CHECK_STATUS(rdmamig_fabric_plan_new(f, 2, 0, 1, RDMAMIG_FABRIC_SWAP, 0, &p), RDMAMIG_OK);
    rdmamig_fabric_counts c;
    CHECK_STATUS(rdmamig_fabric_plan_counts(p, &c), RDMAMIG_OK);
    CHECK(c.lft_smps == 1 && c.switches_touched == 1 && c.hypervisor_smps == 3 && c.total == 4);
    /* 12 switches x ceil((76 + 1) / 64) blocks. */
    CHECK(c.full_reconfiguration == 24);
    rdmamig_fabric_smp smp;
    CHECK_STATUS(rdmamig_fabric_plan_smp(p, 0, &smp), RDMAMIG_OK);
    CHECK(smp.kind == RDMAMIG_FABRIC_SMP_LFT && smp.switch_lid == h0.switch_lid && smp.block == 0);
    CHECK(smp.ports[2] == 2 && smp.ports[4] == 1);
    CHECK_STATUS(rdmamig_fabric_plan_smp(p, 1, &smp), RDMAMIG_OK);
    CHECK(smp.kind == RDMAMIG_FABRIC_SMP_VF_LID && smp.hypervisor == 0 && smp.old_lid == 2 && smp.new_lid == 4);
    CHECK_STATUS(rdmamig_fabric_plan_smp(p, 2, &smp), RDMAMIG_OK);
    CHECK(smp.kind == RDMAMIG_FABRIC_SMP_VF_LID && smp.hypervisor == 1 && smp.old_lid == 4 && smp.new_lid == 2);
    CHECK_STATUS(rdmamig_fabric_plan_smp(p, 3, &smp), RDMAMIG_OK);
    CHECK(smp.kind == RDMAMIG_FABRIC_SMP_VGUID && smp.hypervisor == 0 && smp.peer_hypervisor == 1);
    CHECK_STATUS(rdmamig_fabric_plan_smp(p, 4, &smp), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_fabric_apply(f, p), RDMAMIG_OK);
    uint8_t ports[3];
    CHECK_STATUS(rdmamig_fabric_get_lft(f, h0.switch_lid, 2, ports, 3), RDMAMIG_OK);
    CHECK(ports[0] == 2 && ports[2] == 1);
    uint32_t owner = 99;
    CHECK_STATUS(rdmamig_fabric_hypervisor_of_lid(f, 2, &owner), RDMAMIG_OK);
    CHECK(owner == 1);
    /* The plan was for the fabric as it was. */
    CHECK_STATUS(rdmamig_fabric_apply(f, p), RDMAMIG_ERR_INVALID_ARGUMENT);
    rdmamig_fabric_plan_free(p);

    /* Across leaves: the VM (LID 2, now on hypervisor 1) to hypervisor 31. */
    p = NULL;
    CHECK_STATUS(rdmamig_fabric_plan_new(f, 2, 1, 31, RDMAMIG_FABRIC_SWAP, 0, &p), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_plan_counts(p, &c), RDMAMIG_OK);
    CHECK(c.lft_smps >= 2 && c.lft_smps <= 2 * 12 && c.total == c.lft_smps + 3);
    CHECK_STATUS(rdmamig_fabric_apply(f, p), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_get_lft(f, h31.switch_lid, 2, ports, 1), RDMAMIG_OK);
    CHECK(ports[0] == h31.port);
    rdmamig_fabric_plan_free(p);
    /* And back by copy, onto hypervisor 1's now free VF. */
    p = NULL;
    CHECK_STATUS(rdmamig_fabric_plan_new(f, 2, 31, 1, RDMAMIG_FABRIC_COPY, 0, &p), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_plan_counts(p, &c), RDMAMIG_OK);
    CHECK(c.lft_smps >= 1 && c.lft_smps <= 12 && c.switches_touched == c.lft_smps);
    CHECK_STATUS(rdmamig_fabric_apply(f, p), RDMAMIG_OK);
    rdmamig_fabric_plan_free(p);

    /* Refusals: each with its message. */
    p = NULL;
    CHECK_STATUS(rdmamig_fabric_plan_new(f, 6, 0, 1, RDMAMIG_FABRIC_SWAP, 0, &p), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(last(), "not on a VF of the source") != NULL);
    CHECK_STATUS(rdmamig_fabric_plan_new(f, 4000, 0, 1, RDMAMIG_FABRIC_SWAP, 0, &p), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(last(), "unknown LID 4000") != NULL);
    CHECK_STATUS(rdmamig_fabric_plan_new(f, 6, 2, 2, RDMAMIG_FABRIC_SWAP, 0, &p), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_fabric_plan_new(f, 6, 2, 3, 9, 0, &p), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(last(), "unknown mode 9") != NULL);
    CHECK(p == NULL);
    rdmamig_fabric_free(f);
}

static void test_piece_by_piece(void) {
    /* Two leaves (LIDs 1, 2) on one spine (3), a hypervisor on each leaf. */
    rdmamig_fabric *f = rdmamig_fabric_new();
    CHECK(f != NULL);
    CHECK_STATUS(rdmamig_fabric_add_switch(f, 1, 4), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_add_switch(f, 2, 4), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_add_switch(f, 3, 4), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_add_switch(f, 0xC000, 4), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(rdmamig_fabric_add_link(f, 1, 4, 3, 1), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_add_link(f, 2, 4, 3, 2), RDMAMIG_OK);
    const uint16_t vfs_a[] = {11, 12}, vfs_b[] = {21, 22};
    uint32_t a = 9, b = 9;
    CHECK_STATUS(rdmamig_fabric_add_hypervisor(f, 1, 1, 10, vfs_a, 2, &a), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_add_hypervisor(f, 2, 1, 20, vfs_b, 2, &b), RDMAMIG_OK);
    CHECK(a == 0 && b == 1);
    CHECK_STATUS(rdmamig_fabric_add_hypervisor(f, 2, 1, 30, NULL, 0, NULL), RDMAMIG_ERR_INVALID_ARGUMENT);
    /* The LFTs, as SubnGet(LinearForwardingTable) would give them (LIDs 0..23). */
    uint8_t leaf1[24], leaf2[24], spine[24];
    memset(leaf1, RDMAMIG_FABRIC_NO_ROUTE, sizeof leaf1);
    memset(leaf2, RDMAMIG_FABRIC_NO_ROUTE, sizeof leaf2);
    memset(spine, RDMAMIG_FABRIC_NO_ROUTE, sizeof spine);
    for (int lid = 10; lid <= 12; lid++) leaf1[lid] = 1, leaf2[lid] = 4, spine[lid] = 1;
    for (int lid = 20; lid <= 22; lid++) leaf1[lid] = 4, leaf2[lid] = 1, spine[lid] = 2;
    CHECK_STATUS(rdmamig_fabric_set_lft(f, 1, 0, leaf1, 24), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_set_lft(f, 2, 0, leaf2, 24), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_set_lft(f, 3, 0, spine, 24), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_set_vf_in_use(f, 21, true), RDMAMIG_OK);
    rdmamig_fabric_plan *p = NULL;
    /* Swap onto the first free VF of b: 22. All in block 0: one SMP per switch. */
    CHECK_STATUS(rdmamig_fabric_plan_new(f, 11, a, b, RDMAMIG_FABRIC_SWAP, 0, &p), RDMAMIG_OK);
    rdmamig_fabric_counts c;
    CHECK_STATUS(rdmamig_fabric_plan_counts(p, &c), RDMAMIG_OK);
    CHECK(c.lft_smps == 3 && c.switches_touched == 3 && c.full_reconfiguration == 3);
    rdmamig_fabric_smp smp;
    CHECK_STATUS(rdmamig_fabric_plan_smp(p, 4, &smp), RDMAMIG_OK);
    CHECK(smp.kind == RDMAMIG_FABRIC_SMP_VF_LID && smp.old_lid == 22 && smp.new_lid == 11);
    CHECK_STATUS(rdmamig_fabric_apply(f, p), RDMAMIG_OK);
    uint8_t got;
    CHECK_STATUS(rdmamig_fabric_get_lft(f, 3, 11, &got, 1), RDMAMIG_OK);
    CHECK(got == 2);
    rdmamig_fabric_plan_free(p);
    /* b has no free VF left. */
    p = NULL;
    CHECK_STATUS(rdmamig_fabric_plan_new(f, 12, a, b, RDMAMIG_FABRIC_SWAP, 0, &p), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(last(), "no free VF") != NULL);
    rdmamig_fabric_free(f);
}

static void test_null_arguments(void) {
    rdmamig_fabric *f = NULL;
    rdmamig_fabric_plan *p = NULL;
    CHECK_STATUS(rdmamig_fabric_new_fat_tree(8, 2, 0, 0, 1, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(strcmp(last(), "rdmamig_fabric_new_fat_tree: out is NULL") == 0);
    CHECK_STATUS(rdmamig_fabric_new_fat_tree(7, 2, 0, 0, 1, &f), RDMAMIG_ERR_INVALID_ARGUMENT);
    CHECK(f == NULL);
    CHECK_STATUS(rdmamig_fabric_add_switch(NULL, 1, 4), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(strcmp(last(), "rdmamig_fabric_add_switch: fabric is NULL") == 0);
    CHECK_STATUS(rdmamig_fabric_add_link(NULL, 1, 1, 2, 1), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_set_lft(NULL, 1, 0, NULL, 0), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_get_lft(NULL, 1, 0, NULL, 0), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_add_hypervisor(NULL, 1, 1, 2, NULL, 0, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_set_vf_in_use(NULL, 2, true), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(rdmamig_fabric_hypervisor_count(NULL) == 0);
    CHECK_STATUS(rdmamig_fabric_get_hypervisor(NULL, 0, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_get_vf_lids(NULL, 0, NULL, 0, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_hypervisor_of_lid(NULL, 1, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_plan_new(NULL, 2, 0, 1, RDMAMIG_FABRIC_SWAP, 0, &p), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(strcmp(last(), "rdmamig_fabric_plan_new: fabric is NULL") == 0);
    CHECK_STATUS(rdmamig_fabric_plan_counts(NULL, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_plan_smp(NULL, 0, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_apply(NULL, NULL), RDMAMIG_ERR_NULL_PARAMETER);

    CHECK_STATUS(rdmamig_fabric_new_fat_tree(8, 2, 0, 0, 1, &f), RDMAMIG_OK);
    CHECK_STATUS(rdmamig_fabric_plan_new(f, 2, 0, 1, RDMAMIG_FABRIC_SWAP, 0, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(strcmp(last(), "rdmamig_fabric_plan_new: out is NULL") == 0);
    CHECK_STATUS(rdmamig_fabric_set_lft(f, 1, 0, NULL, 3), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_get_hypervisor(f, 0, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK_STATUS(rdmamig_fabric_apply(f, NULL), RDMAMIG_ERR_NULL_PARAMETER);
    CHECK(strcmp(last(), "rdmamig_fabric_apply: plan is NULL") == 0);
    size_t n = 0;
    CHECK_STATUS(rdmamig_fabric_get_vf_lids(f, 0, NULL, 0, &n), RDMAMIG_ERR_BUFFER_TOO_SMALL);
    CHECK(n == 1);
    rdmamig_fabric_free(f);
    rdmamig_fabric_free(NULL);
    rdmamig_fabric_plan_free(NULL);
}

int main(void) {
    test_fat_tree();
    test_piece_by_piece();
    test_null_arguments();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
