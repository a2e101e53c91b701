#!/bin/sh
# Entrypoint of the container toolkit: wait until the validator has proven the driver on this node, take
# over what it found (driver root, device root, host or container driver), then run the installer.
# @include driver-ready-prelude.sh

# containerd 1.6.9 and later can send SIGTERM to a container started right after the runtime restarts;
# a short pause keeps the installer out of that window (and out of a crash loop).
sleep 5

exec nvidia-toolkit
