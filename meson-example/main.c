/* Smallest rdmamig consumer: prints the library version and a status string. */
#include <rdmamig.h>

#include <stdio.h>
#include <string.h>

int main(void) {
    const char *version = rdmamig_version();
    printf("rdmamig %s (header %d.%d.%d)\n", version, RDMAMIG_VERSION_MAJOR,
           RDMAMIG_VERSION_MINOR, RDMAMIG_VERSION_PATCH);
    printf("RDMAMIG_ERR_NO_DEVICE: %s\n", rdmamig_status_str(RDMAMIG_ERR_NO_DEVICE));
    return strcmp(rdmamig_status_str(RDMAMIG_OK), "success") == 0 ? 0 : 1;
}
