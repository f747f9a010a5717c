#!/usr/bin/env bash
# The whole test suite: installs what it needs (Debian 12, as root), builds,
# and runs every ctest label that this machine supports (unit, integration;
# cluster and gpu tests skip themselves with a message when they cannot run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh --test
ctest --test-dir build --output-on-failure -j 2 "$@"

# Fuzzing (tests/fuzz, docs/fuzzing.md): each libFuzzer target for a short
# bounded time over its kept corpus; a crash, leak or timeout fails the run.
# DSL_FUZZ_SECONDS=0 skips it.
if [ "${DSL_FUZZ_SECONDS:-20}" != 0 ]; then
  bash tests/fuzz/run.sh "${DSL_FUZZ_SECONDS:-20}"
fi
