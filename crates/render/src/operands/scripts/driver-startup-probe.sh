#!/bin/sh
# Startup probe of the driver container. It passes once the kernel modules are loaded, the driver's
# daemons report Ready and nvidia-smi works; it then records which optional modules this pod loads in
# .driver-ctr-ready, the file the validator's driver step waits for.
set -eu

status_dir=/run/nvidia/validations
mkdir -p "$status_dir"

[ -f /sys/module/nvidia/refcnt ] || { echo "the nvidia kernel module is not loaded yet"; exit 1; }

if [ -f "$status_dir/.driver-daemons-status" ]; then
  daemons=$(cat "$status_dir/.driver-daemons-status")
  [ "$daemons" = "Ready" ] || { echo "driver daemons are $daemons, not Ready"; exit 1; }
fi

nvidia-smi || { echo "nvidia-smi failed"; exit 1; }

# Write to a temporary file and rename it, so readers never see half a file.
cat > "$status_dir/.driver-ctr-ready.tmp" <<READY
GDRCOPY_ENABLED: ${GDRCOPY_ENABLED:-false}
GDS_ENABLED: ${GDS_ENABLED:-false}
GPU_DIRECT_RDMA_ENABLED: ${GPU_DIRECT_RDMA_ENABLED:-false}
READY
mv "$status_dir/.driver-ctr-ready.tmp" "$status_dir/.driver-ctr-ready"
