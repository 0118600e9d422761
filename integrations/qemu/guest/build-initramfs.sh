#!/usr/bin/env bash
# build-initramfs.sh OUT.cpio -- the initramfs of the guest that
# guest-test.py migrates: memcheck-init.c as /init (static), and the modules
# of virtio-serial from the rxe-vm harness's kernel (scripts/rxe-vm.sh
# --install-only unpacks it) under /lib/modules, in load order.  Prints the
# kernel command line's memcheck.modules=... argument.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
out=$1
kernel_dir=$(ls -d "${RXE_VM_CACHE:-/var/cache/rxe-vm}"/kernel/linux-image-*/lib/modules/* | head -n1)
MODULES=(virtio/virtio_ring.ko virtio/virtio.ko virtio/virtio_pci_legacy_dev.ko
         virtio/virtio_pci_modern_dev.ko virtio/virtio_pci.ko char/virtio_console.ko)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lib/modules"
gcc -static -O2 -Wall -Wextra -Werror -o "$tmp/init" "$HERE/memcheck-init.c"
names=()
for m in "${MODULES[@]}"; do
    cp "$kernel_dir/kernel/drivers/$m" "$tmp/lib/modules/"
    names+=("$(basename "$m")")
done
(cd "$tmp" && find . | cpio -o -H newc --quiet) > "$out.tmp"
mv "$out.tmp" "$out"
(IFS=,; echo "memcheck.modules=${names[*]}")
