#!/usr/bin/env bash
# podman as these machines run it, and a debian:12-slim of our own, for
# tests/pods/test_containers.py and bench/first_minutes.sh:
#   podman_base.sh DIR
# writes DIR/containers.conf (runc, cgroupfs, no default ulimits; use it as
# CONTAINERS_CONF) and, unless podman has it, makes the image
# localhost/dsl-test-debian:12-slim the way debian:12-slim is made (minbase,
# without man pages, docs and locales) with mmdebstrap and `podman import`
# (no registry is reachable). Prints the image's name.
set -euo pipefail
dir=${1:?usage: podman_base.sh DIR}
base=localhost/dsl-test-debian:12-slim
cat >"$dir/containers.conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_CONF=$dir/containers.conf
if ! podman image exists "$base"; then
  mmdebstrap --variant=minbase --format=tar --dpkgopt=path-exclude=/usr/share/man/* \
    --dpkgopt=path-exclude=/usr/share/doc/* --dpkgopt=path-include=/usr/share/doc/*/copyright \
    --dpkgopt=path-exclude=/usr/share/locale/* bookworm "$dir/slim.tar" 2>"$dir/mmdebstrap.log" ||
    { tail -20 "$dir/mmdebstrap.log" >&2; exit 1; }
  podman import "$dir/slim.tar" "$base" >/dev/null
  rm -f "$dir/slim.tar"
fi
echo "$base"
