#!/usr/bin/env bash
# A newcomer's first minutes (issue 22): seconds from a fresh clone to the
# demo's first training output (`bash examples/demo.sh`), in a fresh
# debian:12-slim container (podman, runc, cgroupfs; the base made by
# tests/pods/podman_base.sh, as for tests/pods/test_containers.py), 2 CPUs:
#   wheel   apt installs python3-venv and bible-kjv, pip installs dslaunch's
#           wheel (build/packages/wheelhouse: deploy/packages.sh), and the
#           demo runs the installed programs;
#   source  (with --source) the demo builds what it runs first
#           (deploy/setup.sh --programs: its packages, then about 3 minutes
#           of compiling on 2 cores).
# Prints a table: the first output, the build's first and last steps
# (source only), the first progress record, the end.
# Needs root, podman, runc, mmdebstrap and network access to Debian's mirror.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ways=(wheel)
[ "${1:-}" = --source ] && ways+=(source)
wheel=$(ls "$root"/build/packages/wheelhouse/dslaunch-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "first_minutes.sh: no wheel (run deploy/packages.sh)" >&2; exit 66; }
work=$(mktemp -d /tmp/dsl-first-minutes.XXXXXX)
trap 'rm -rf "$work"' EXIT
base=$("$root/tests/pods/podman_base.sh" "$work")
export CONTAINERS_CONF=$work/containers.conf
printf '| way | first output (s) | first build step (s) | built (s) | first progress record (s) | demo done (s) |\n'
printf '|---|---|---|---|---|---|\n'
for way in "${ways[@]}"; do
  rm -rf "$work/clone"
  git -C "$root" archive --format=tar HEAD | (mkdir -p "$work/clone" && tar -x -C "$work/clone")
  cp "$wheel" "$work/"
  if [ "$way" = wheel ]; then
    steps="apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq"
    steps+=" --no-install-recommends python3-venv bible-kjv bible-kjv-text >/dev/null"
    steps+=" && python3 -m venv /opt/venv"
    steps+=" && /opt/venv/bin/pip install -q --no-index /w/$(basename "$wheel")"
    steps+=" && . /opt/venv/bin/activate && bash examples/demo.sh"
  else
    steps='bash examples/demo.sh'
  fi
  # Each output line with the seconds since the container started.
  podman run --rm --cpus 2 -v "$work:/w" -w /w/clone "$base" bash -c \
    "start=\$(date +%s%N); ($steps) 2>&1 | while IFS= read -r l; do
       echo \"\$(( (\$(date +%s%N) - start) / 1000000 )) \$l\"; done" >"$work/$way.log" || true
  first=$(awk 'NR==1 {print $1/1000}' "$work/$way.log")
  # The build's first and last steps (ninja's [i/n] lines).
  packages=$(awk '$2 ~ /^\[1\// {print $1/1000; exit}' "$work/$way.log")
  built=$(awk '$2 ~ /^\[[0-9]+\/[0-9]+\]$/ {split($2, a, /[\[\/\]]/); if (a[2] == a[3]) t = $1/1000} END {print t}' "$work/$way.log")
  progress=$(awk '/progress\]/ {print $1/1000; exit}' "$work/$way.log")
  done_at=$(awk '/^[0-9]+ logs: data\/logs/ {print $1/1000}' "$work/$way.log")
  printf '| %s | %s | %s | %s | %s | %s |\n' "$way" "$first" "${packages:--}" "${built:--}" \
    "${progress:-none}" "${done_at:-failed}"
  [ -n "$done_at" ] || tail -20 "$work/$way.log" >&2
done
