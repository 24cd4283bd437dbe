#!/usr/bin/env bash
# The test command: installs dependencies, builds, checks formatting, and runs every test that
# does not need a GPU (labels unit and integration; gpu and multigpu tests are excluded here and
# skip themselves on machines without a GPU anyway).
# Usage: scripts/test.sh [extra ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/check_format.sh
ctest --test-dir build -LE 'gpu|multigpu' --output-on-failure -j "$(nproc)" "$@"
