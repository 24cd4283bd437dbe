#!/usr/bin/env bash
# Builds the training corpus of the demo model (models/ringserve-tiny) from public-domain English
# text that Debian packages ship: the King James Bible (bible-kjv-text, read through the `bible`
# program of bible-kjv) and Ambrose Bierce's The Devil's Dictionary (dict-devil). Installs the
# packages if they are missing, then writes
#   OUT/train.txt    documents separated by one blank line
#   OUT/heldout.txt  every 20th document (KJV chapters, dictionary entries), never trained on
#   OUT/SHA256SUMS   the digests the training log records
#   OUT/SOURCES      the packages and versions the text came from
# Deterministic: the same package versions give the same bytes (the digest says so).
#
# Usage: scripts/corpus/make_corpus.sh [OUT]   (default build/corpus)
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-build/corpus}"
packages=(bible-kjv bible-kjv-text dict-devil)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# One verse a line, chapters under "Book N" headings (-l: no wrapping).
bible -l 100000 "gen1:1-rev22:21" > "$work/kjv.txt"
zcat /usr/share/dictd/devil.dict.dz > "$work/devil.txt"
python3 scripts/corpus/extract_corpus.py --kjv "$work/kjv.txt" --devil "$work/devil.txt" \
  --out "$out"
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Package} ${Version}\n' "$p"
done > "$out/SOURCES"
(cd "$out" && sha256sum train.txt heldout.txt > SHA256SUMS && cat SHA256SUMS)
