#!/usr/bin/env bash
# Installs the Node.js tools that tests/ops needs (the official `openai` client and
# `playwright-core`, which drives Debian's /usr/bin/chromium; no browser is downloaded), exactly
# as pinned in package-lock.json, into node_modules/. Idempotent: skips npm when node_modules
# already matches the lock file. Called at the end of scripts/install_deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v npm >/dev/null 2>&1; then
  echo "install_test_tools: npm is missing (scripts/install_deps.sh installs it)" >&2
  exit 1
fi

stamp=node_modules/.ringserve-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && \
   [ -d node_modules/openai ] && [ -d node_modules/playwright-core ]; then
  echo "test tools (npm): up to date"
  exit 0
fi
# PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD: playwright-core downloads nothing, but be explicit.
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
echo "$want" > "$stamp"
echo "test tools (npm): $(cd node_modules && echo openai@$(node -p "require('./openai/package.json').version") playwright-core@$(node -p "require('./playwright-core/package.json').version"))"
