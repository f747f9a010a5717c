#!/usr/bin/env bash
# A 3-node x 2-rank job on this machine (127.0.0.1-3 act as three nodes,
# started with --launcher local): each rank prints what it got and reports
# progress records; logs and metrics land in $LOG_DIR. The script runs as
# under DeepSpeed's launcher: python3 -u demo_rank.py --local_rank=N ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
hosts=$(mktemp /tmp/dslaunch-hello-hosts.XXXXXX)
trap 'rm -f "$hosts"' EXIT
printf '127.0.0.1 slots=2\n127.0.0.2 slots=2\n127.0.0.3 slots=2\n' >"$hosts"
LOG_DIR=${LOG_DIR:-/tmp/dslaunch-hello}
build/bin/dslaunch --hostfile "$hosts" --launcher local --log_dir "$LOG_DIR" \
  examples/demo_rank.py --steps "${STEPS:-20}"
echo "logs: $LOG_DIR/rank-*.log   metrics: $LOG_DIR/metrics.jsonl"
