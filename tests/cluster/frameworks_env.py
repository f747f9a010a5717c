"""Horovod, Hugging Face transformers and Accelerate from PyPI, each in a venv
over Debian's python3-torch (--system-site-packages), made by
`deploy/setup.sh --test`:
  $DSL_HOROVOD_VENV (default /opt/dslaunch-test/horovod-venv): Horovod 0.28.1
    built from PyPI's source with PyTorch, Gloo and OpenMPI (no GPU);
  $DSL_HF_VENV (default /opt/dslaunch-test/hf-venv): transformers 4.44.2 and
    accelerate 0.33.0 (the last lines that run on torch 1.13).
The venvs are on no node's login PATH: only the launcher's environment names
them, as when a user activated one before starting a job."""
import os
import subprocess

HOROVOD_VENV = os.environ.get("DSL_HOROVOD_VENV", "/opt/dslaunch-test/horovod-venv")
HF_VENV = os.environ.get("DSL_HF_VENV", "/opt/dslaunch-test/hf-venv")
HERE = os.path.dirname(os.path.abspath(__file__))
_have = {}


def _need(test, venv, code, what):
    """Skips `test` when `code` fails in `venv`'s python (fails it under CI=1)."""
    key = (venv, code)
    if key not in _have:
        p = subprocess.run([os.path.join(venv, "bin", "python"), "-c", code],
                           capture_output=True, timeout=120)
        _have[key] = p.returncode == 0
    if not _have[key]:
        msg = "no %s in %s (deploy/setup.sh --test makes it)" % (what, venv)
        if os.environ.get("CI"):
            test.fail(msg)
        test.skipTest(msg)


def need_horovod(test, mpi=False):
    _need(test, HOROVOD_VENV, "import horovod.torch", "Horovod")
    if mpi:
        _need(test, HOROVOD_VENV, "import horovod.torch as h; assert h.mpi_built()",
              "Horovod built with MPI")


def need_hf(test):
    _need(test, HF_VENV, "import transformers, accelerate", "transformers and accelerate")


def activated(venv, **env):
    """The launcher's environment with `venv` activated."""
    return dict(PATH=os.path.join(venv, "bin") + ":" + os.environ["PATH"],
                VIRTUAL_ENV=venv, OMP_NUM_THREADS="1", **env)


def script(name):
    return os.path.join(HERE, name)
