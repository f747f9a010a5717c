#!/usr/bin/env bash
# The main job: prepares a demo corpus (the King James Bible from Debian's
# bible-kjv package), trains a byte-level BPE tokenizer and a small GPT with
# ZeRO stage 2 on 2 ranks through dslaunch on this machine (a few minutes),
# with live progress, then prints a sample from the trained model.
set -euo pipefail
cd "$(dirname "$0")/.."
# The programs: $DSL_DEMO_BIN, else an installed dslaunch of this version
# on the PATH (the wheel's commands in an active venv, or the Debian
# package's), which starts training within a minute; else a build of only
# what the demo runs (dslaunch, dsagent, dsworker: about 3 minutes on 2
# cores; examples/test.sh builds the rest).
version=$(sed -n 's/.*kVersion = "\(.*\)";/\1/p' proto/version.h)
bin=${DSL_DEMO_BIN:-}
if [ -z "$bin" ] && command -v dslaunch >/dev/null &&
    [ "$(dslaunch --version 2>/dev/null)" = "dslaunch $version (protocol 2)" ]; then
  bin=$(dirname "$(command -v dslaunch)")
fi
if [ -n "$bin" ]; then
  echo "demo.sh: using the installed dslaunch in $bin"
  if ! command -v bible >/dev/null; then
    [ "$(id -u)" = 0 ] || { echo "demo.sh: needs Debian's bible-kjv (run as root to install it)" >&2; exit 69; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      bible-kjv bible-kjv-text >/dev/null
  fi
else
  bash deploy/setup.sh --programs
  bin=build/bin
fi
mkdir -p data
if [ ! -s data/kjv.txt ]; then
  # bible prints "Ge1:1 In the beginning ..."; keep the text only.
  bible -f "Gen1:1-Rev22:21" | sed 's/^[A-Za-z0-9]*[0-9]:[0-9]* //' >data/kjv.txt
fi
if [ ! -s data/kjv/train_000.bin ]; then
  "$bin/dsworker" prepare --input data/kjv.txt --out data/kjv --vocab 2048
fi
hosts=$(mktemp /tmp/dslaunch-demo-hosts.XXXXXX)
trap 'rm -f "$hosts"' EXIT
echo "127.0.0.1 slots=2" >"$hosts"
"$bin/dslaunch" --hostfile "$hosts" --log_dir data/logs \
  "$bin/dsworker" train --config examples/ds_config.json --save data/model.bin "$@"
echo "--- a sample from the trained model:"
"$bin/dsworker" sample --model data/model.bin --tokenizer data/kjv/tokenizer.bpe \
  --prompt "And God said" --tokens 80
echo "logs: data/logs/rank-*.log   metrics: data/logs/metrics.jsonl   checkpoints: data/checkpoints"
