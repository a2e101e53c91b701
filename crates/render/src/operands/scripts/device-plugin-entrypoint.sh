#!/bin/sh
# Entrypoint of the device plugin: wait until the validator has proven the driver on this node, take over
# what it found, offer GDRCopy and GPUDirect Storage devices when their modules are loaded (unless the
# policy already decided), then run the plugin.
# @include driver-ready-prelude.sh

if lsmod | grep -q '^gdrdrv '; then
  : "${GDRCOPY_ENABLED:=true}"
fi
if lsmod | grep -q '^nvidia_fs '; then
  : "${GDS_ENABLED:=true}"
  : "${MOFED_ENABLED:=true}"
fi

echo "starting nvidia-device-plugin"
exec nvidia-device-plugin
