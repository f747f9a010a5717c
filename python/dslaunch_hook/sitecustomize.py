"""dslaunch's progress hook, started by the interpreter of every Python rank
of a job: dsagent puts this directory first on the rank's PYTHONPATH
(unless dslaunch --no_progress_hook), and Python imports `sitecustomize`
from there at start. It installs dslaunch._hook (reports DeepSpeed's and the
Hugging Face Trainer's progress when the script imports them), then runs the
sitecustomize it shadows, if any, as Python would have. A hook that cannot
install says so once and the script runs on without it."""
import os
import sys


def _install():
    if not os.environ.get("DSLAUNCH_PROGRESS"):
        return
    try:
        from dslaunch import _hook
        _hook.install()
    except Exception as e:  # never the script's problem
        sys.stderr.write("dslaunch: the progress hook is off: %s: %s\n"
                         % (type(e).__name__, e))


def _chain():
    """The next sitecustomize on sys.path (Debian's, a venv's), run as the
    module `sitecustomize` would have been."""
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.origin is None:
        return
    if os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
_chain()
