#!/usr/bin/env bash
# The whole test suite: installs what it needs (Debian 12, as root), builds,
# and runs every ctest label that this machine supports (unit, integration;
# cluster and gpu tests skip themselves with a message when they cannot run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh --test
ctest --test-dir build --output-on-failure -j 2 "$@"
