#!/usr/bin/env bash
# Fails when a tracked C++/CUDA file is not clang-formatted (.clang-format, Google base).
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')
[ -z "$files" ] && exit 0
if ! echo "$files" | xargs clang-format --dry-run --Werror 2>/tmp/ringserve-format.log; then
  echo "clang-format: these files need formatting (run: git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i):"
  grep -o '^[^:]*' /tmp/ringserve-format.log | sort -u
  exit 1
fi
echo "clang-format: clean"
