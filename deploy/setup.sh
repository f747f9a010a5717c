#!/usr/bin/env bash
# Installs what dslaunch needs on Debian 12 (as root, idempotent) and builds it.
#   deploy/setup.sh            build dependencies + build
#   deploy/setup.sh --test     also what the test suite needs (PyTorch, OpenMPI, sshd)
#   deploy/setup.sh --no-build only install packages
#   deploy/setup.sh --programs build only dslaunch, dsagent and dsworker (and
#                              the CUDA engine where nvcc is): what the demo runs
set -euo pipefail
cd "$(dirname "$0")/.."

want_tests=0
build=1
targets=()
for arg in "$@"; do
  case "$arg" in
    --test) want_tests=1 ;;
    --no-build) build=0 ;;
    --programs) targets=(dslaunch dsagent dsworker) ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 64 ;;
  esac
done

build_pkgs=(build-essential cmake ninja-build pkg-config
  libprotobuf-dev protobuf-compiler libboost-dev libboost-system-dev
  libssl-dev libssh-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libgloo-dev libopenblas-dev python3
  bible-kjv bible-kjv-text)
test_pkgs=(python3 python3-torch openmpi-bin libopenmpi-dev python3-mpi4py
  iproute2 procps openssh-server openssh-client pdsh
  elfutils gdb  # eu-stack, gdb: the agent's stack collection (CollectStacks)
  prometheus  # promtool and a real server: tests/integration/test_prometheus.py
  tmux  # a real terminal for the live table: tests/integration/test_observe.py
  slurm-wlm munge  # tests/cluster/test_slurm.py (a real SLURM cluster)
  clang-14 libclang-rt-14-dev libomp-14-dev  # tests/fuzz (libFuzzer)
  # A real DeepSpeed in a venv (tests/cluster/deepspeed_env.py): its CPU
  # launcher runs numactl, and its CPU comm op is built at first use.
  python3-venv python3-dev numactl pybind11-dev libtorch-dev
  python3-yaml  # tests/deploy (the Kubernetes manifests)
  mmdebstrap  # tests/deploy/test_packages.py (a fresh Debian 12 for the .deb)
  podman runc)  # tests/pods/test_containers.py (deploy/Containerfile, for real)

pkgs=("${build_pkgs[@]}")
if [ "$want_tests" = 1 ]; then pkgs+=("${test_pkgs[@]}"); fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup.sh: missing packages: ${missing[*]} (run as root to install them)" >&2
    exit 69
  fi
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# DeepSpeed from PyPI (CPU, no prebuilt ops) over Debian's torch, once.
if [ "$want_tests" = 1 ]; then
  venv=${DSL_DEEPSPEED_VENV:-/opt/dslaunch-test/deepspeed-venv}
  if [ ! -x "$venv/bin/deepspeed" ]; then
    echo "setup.sh: installing DeepSpeed 0.14.4 into $venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    DS_BUILD_OPS=0 "$venv/bin/pip" install -q --disable-pip-version-check \
      "deepspeed==0.14.4"
  fi
  # The CPU accelerator's shared-memory comm op, built now rather than by the
  # first test's ranks all at once (cached in ~/.cache/torch_extensions).
  if ! "$venv/bin/python" -c "from deepspeed.ops.op_builder.cpu import \
ShareMemCommBuilder as B; B().load()" >/tmp/dslaunch-ds-op.log 2>&1; then
    tail -20 /tmp/dslaunch-ds-op.log >&2
    echo "setup.sh: DeepSpeed's CPU comm op does not build" >&2
    exit 70
  fi
fi

# kubernetes-validate from PyPI, once: it ships the Kubernetes API's JSON
# schemas, so tests/deploy/test_manifests.py validates the manifests offline.
if [ "$want_tests" = 1 ]; then
  kvenv=${DSL_K8S_VENV:-/opt/dslaunch-test/k8s-venv}
  if ! "$kvenv/bin/python" -c "import kubernetes_validate.version as v; \
assert v.__version__ == '1.37.0'" 2>/dev/null; then
    echo "setup.sh: installing kubernetes-validate 1.37.0 into $kvenv"
    /usr/bin/python3 -m venv --clear "$kvenv"
    "$kvenv/bin/pip" install -q --disable-pip-version-check \
      "kubernetes-validate==1.37.0" "jsonschema==4.26.0" "referencing==0.37.0" \
      "PyYAML==6.0.4"
  fi
fi

# TensorBoard from PyPI, once: tests/integration/test_tensorboard.py reads
# the event files of dslaunch --tensorboard and dsworker with its loader.
if [ "$want_tests" = 1 ]; then
  tbvenv=${DSL_TENSORBOARD_VENV:-/opt/dslaunch-test/tensorboard-venv}
  if ! "$tbvenv/bin/python" -c "import tensorboard as t; \
assert t.__version__ == '2.18.0'" 2>/dev/null; then
    echo "setup.sh: installing TensorBoard 2.18.0 into $tbvenv"
    /usr/bin/python3 -m venv --clear "$tbvenv"
    "$tbvenv/bin/pip" install -q --disable-pip-version-check \
      "tensorboard==2.18.0" "protobuf==7.36.2" "numpy==2.4.6"
  fi
fi

# py-spy from PyPI, once: tests/integration/test_stacks.py has the agent
# dump a hung Python rank's stacks with it (optional for users: the agent
# falls back to eu-stack or gdb).
if [ "$want_tests" = 1 ]; then
  spyvenv=${DSL_PYSPY_VENV:-/opt/dslaunch-test/pyspy-venv}
  if [ "$("$spyvenv/bin/py-spy" --version 2>/dev/null)" != "py-spy 0.4.3" ]; then
    echo "setup.sh: installing py-spy 0.4.3 into $spyvenv"
    /usr/bin/python3 -m venv --clear "$spyvenv"
    "$spyvenv/bin/pip" install -q --disable-pip-version-check "py-spy==0.4.3"
  fi
fi

# Horovod 0.28.1 built from PyPI's source over Debian's torch (PyTorch, Gloo
# and OpenMPI; no GPU), once: tests/cluster/test_frameworks.py runs its
# ranks under dslaunch as horovodrun --gloo would start them, and under
# --launcher openmpi. No wheel cache: one built without MPI must not come back.
if [ "$want_tests" = 1 ]; then
  hvenv=${DSL_HOROVOD_VENV:-/opt/dslaunch-test/horovod-venv}
  if ! "$hvenv/bin/python" -c "import horovod, horovod.torch as h; \
assert horovod.__version__ == '0.28.1' and h.gloo_built() and h.mpi_built()" 2>/dev/null; then
    echo "setup.sh: building Horovod 0.28.1 into $hvenv (a few minutes)"
    /usr/bin/python3 -m venv --clear --system-site-packages "$hvenv"
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 CUDA_HOME= \
    MAKEFLAGS="-j$(nproc)" "$hvenv/bin/pip" install -q --disable-pip-version-check \
      --no-build-isolation --no-cache-dir "horovod==0.28.1"
  fi
fi

# Hugging Face transformers and Accelerate from PyPI over Debian's torch
# (1.13: transformers 4.35 and accelerate 0.25 are the last that run on it),
# once: tests/cluster/test_frameworks.py.
if [ "$want_tests" = 1 ]; then
  hfvenv=${DSL_HF_VENV:-/opt/dslaunch-test/hf-venv}
  if ! "$hfvenv/bin/python" -c "import transformers as t, accelerate as a; \
assert (t.__version__, a.__version__) == ('4.35.2', '0.25.0')" 2>/dev/null; then
    echo "setup.sh: installing transformers 4.35.2 and accelerate 0.25.0 into $hfvenv"
    /usr/bin/python3 -m venv --system-site-packages "$hfvenv"
    "$hfvenv/bin/pip" install -q --disable-pip-version-check \
      "transformers==4.35.2" "accelerate==0.25.0"
  fi
fi

if [ "$build" = 1 ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j "$(nproc)" ${targets[@]+--target "${targets[@]}"}
fi
