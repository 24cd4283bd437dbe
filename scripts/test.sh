#!/usr/bin/env bash
# The test command: installs dependencies, builds, checks formatting, and runs every test that
# does not need a GPU (labels unit and integration; gpu and multigpu tests are excluded here and
# skip themselves on machines without a GPU anyway).
# Then every libFuzzer target runs briefly (scripts/fuzz.sh; RINGSERVE_FUZZ_SECONDS per target,
# default 20, 0 skips them); a crash fails the run.
# Usage: scripts/test.sh [extra ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/check_format.sh
ctest --test-dir build -LE 'gpu|multigpu' --output-on-failure -j "$(nproc)" "$@"
fuzz_seconds="${RINGSERVE_FUZZ_SECONDS:-20}"
if [ "$fuzz_seconds" != "0" ]; then
  scripts/fuzz.sh "$fuzz_seconds"
fi
