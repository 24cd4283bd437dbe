#!/usr/bin/env bash
# The main job (grows with the ring issue): builds if needed, then generates tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/stage/model/generate_cli ] || { scripts/install_deps.sh && scripts/build.sh; }
exec build/stage/model/generate_cli "$@"
