#!/usr/bin/env bash
# Configures and builds ringserve into build/ (Release with debug info, Ninja).
# Usage: scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
werror=OFF
if [ "${CI:-}" = "true" ]; then werror=ON; fi
cmake -S . -B build -G Ninja -DRINGSERVE_WERROR=$werror "$@"
ninja -C build -j "$(nproc)"
