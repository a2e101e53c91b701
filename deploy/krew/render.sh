#!/usr/bin/env bash
# Renders the krew manifest of `kubectl gpu` from real release archives.
#
#   deploy/krew/render.sh VERSION BASE_URL DIR > gpu.yaml
#
# DIR holds the four archives the release builds, each a .tar.gz with the `kubectl-gpu` executable at its
# root: kubectl-gpu_VERSION_{linux,darwin}_{amd64,arm64}.tar.gz. BASE_URL is where they are published
# (each archive's URI is BASE_URL/NAME). The sha256 of each is computed here, from the file. A missing
# archive, or one without kubectl-gpu, is an error: no manifest is better than a wrong one.
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 VERSION BASE_URL DIR" >&2
    exit 2
fi
version=$1
base_url=${2%/}
dir=$3
here=$(cd "$(dirname "$0")" && pwd)

if [[ ! $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$ ]]; then
    echo "error: version $version is not a semantic version with a leading v (krew wants v1.2.3)" >&2
    exit 2
fi

sha256() {
    if command -v sha256sum >/dev/null; then
        sha256sum "$1" | cut -d' ' -f1
    else
        shasum -a 256 "$1" | cut -d' ' -f1
    fi
}

platforms=""
for os in linux darwin; do
    for arch in amd64 arm64; do
        name="kubectl-gpu_${version}_${os}_${arch}.tar.gz"
        archive="$dir/$name"
        if [[ ! -f $archive ]]; then
            echo "error: $archive does not exist: build and package the $os/$arch release first" >&2
            exit 1
        fi
        if ! tar -tzf "$archive" | grep -qx '\(\./\)\?kubectl-gpu'; then
            echo "error: $archive has no kubectl-gpu at its root" >&2
            exit 1
        fi
        platforms+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $base_url/$name
    sha256: $(sha256 "$archive")
    files:
    - from: kubectl-gpu
      to: .
    bin: kubectl-gpu
"
    done
done

while IFS= read -r line; do
    case $line in
        "@PLATFORMS@") printf '%s' "$platforms" ;;
        *)
            line=${line//@VERSION@/$version}
            printf '%s\n' "$line"
            ;;
    esac
done < "$here/gpu.yaml.tmpl"
