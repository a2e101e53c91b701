#!/bin/sh
# Entrypoint of the MIG manager: wait until the validator has proven the driver on this node and take over
# what it found. With a driver installed on the host, the host's GPU clients (listed in the gpu-clients
# ConfigMap) are stopped while MIG is reconfigured.
# @include driver-ready-prelude.sh

WITH_SHUTDOWN_HOST_GPU_CLIENTS=$IS_HOST_DRIVER
echo "WITH_SHUTDOWN_HOST_GPU_CLIENTS=$WITH_SHUTDOWN_HOST_GPU_CLIENTS"

echo "starting nvidia-mig-manager"
exec nvidia-mig-manager
