#!/usr/bin/env bash
# The main job: prepares a demo corpus (the King James Bible from Debian's
# bible-kjv package), trains a byte-level BPE tokenizer and a small GPT with
# ZeRO stage 2 on 2 ranks through dslaunch on this machine (a few minutes),
# with live progress, then prints a sample from the trained model.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo runs (dslaunch, dsagent, dsworker); examples/test.sh
# builds the rest.
bash deploy/setup.sh --programs
mkdir -p data
if [ ! -s data/kjv.txt ]; then
  # bible prints "Ge1:1 In the beginning ..."; keep the text only.
  bible -f "Gen1:1-Rev22:21" | sed 's/^[A-Za-z0-9]*[0-9]:[0-9]* //' >data/kjv.txt
fi
if [ ! -s data/kjv/train_000.bin ]; then
  build/bin/dsworker prepare --input data/kjv.txt --out data/kjv --vocab 2048
fi
hosts=$(mktemp /tmp/dslaunch-demo-hosts.XXXXXX)
trap 'rm -f "$hosts"' EXIT
echo "127.0.0.1 slots=2" >"$hosts"
build/bin/dslaunch --hostfile "$hosts" --log_dir data/logs \
  build/bin/dsworker train --config examples/ds_config.json --save data/model.bin "$@"
echo "--- a sample from the trained model:"
build/bin/dsworker sample --model data/model.bin --tokenizer data/kjv/tokenizer.bpe \
  --prompt "And God said" --tokens 80
echo "logs: data/logs/rank-*.log   metrics: data/logs/metrics.jsonl   checkpoints: data/checkpoints"
