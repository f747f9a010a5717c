"""Progress records from unmodified training scripts (dslaunch's progress
hook; dslaunch_hook/sitecustomize.py installs it in every Python rank).
When the script imports them, it attaches to
  - DeepSpeed's engine (deepspeed.runtime.engine.DeepSpeedEngine): each
    optimizer step (a gradient accumulation boundary) reports step
    (global_steps), loss (the mean of the losses given to backward() since
    the last step), lr (get_lr()[0]), samples_per_s (this rank's samples
    over the step's wall time) and skipped_steps (fp16 overflows);
  - the Hugging Face Trainer (transformers.trainer.Trainer): a callback
    reports each log the Trainer makes (step: global_step, loss,
    learning_rate as lr, and its other numbers), but not the summary
    train() logs at its end.
Nothing is imported ahead of the script, and nothing else changes. Whatever
fails in the hook is said once on stderr and the hook stands down; the
script never sees an exception of ours."""
import importlib.abc
import sys
import time

import dslaunch

_failed = set()


def _fail(what, err):
    if what in _failed:
        return
    _failed.add(what)
    sys.stderr.write("dslaunch: progress hook for %s is off: %s: %s\n"
                     % (what, type(err).__name__, err))


# ---------------------------------------------------------------- DeepSpeed

def _patch_deepspeed(module):
    engine = module.DeepSpeedEngine
    backward, step = engine.backward, engine.step

    def hooked_backward(self, loss, *args, **kwargs):
        if "deepspeed" not in _failed:
            try:
                state = self.__dict__.setdefault(
                    "_dslaunch_progress", {"losses": [], "since": time.monotonic()})
                state["losses"].append(loss.detach())
            except Exception as e:
                _fail("deepspeed", e)
        return backward(self, loss, *args, **kwargs)

    def hooked_step(self, *args, **kwargs):
        before = getattr(self, "global_steps", None)
        out = step(self, *args, **kwargs)
        if "deepspeed" not in _failed:
            try:
                if self.global_steps != before:
                    _report_deepspeed(self)
            except Exception as e:
                _fail("deepspeed", e)
        return out

    engine.backward = hooked_backward
    engine.step = hooked_step


def _report_deepspeed(engine):
    now = time.monotonic()
    state = engine.__dict__.setdefault(
        "_dslaunch_progress", {"losses": [], "since": now})
    fields = {}
    losses = state["losses"]
    if losses:
        fields["loss"] = sum(float(x) for x in losses) / len(losses)
    lr = engine.get_lr()
    if lr:
        fields["lr"] = float(lr[0])
    elapsed = now - state["since"]
    if elapsed > 0:
        samples = (engine.train_micro_batch_size_per_gpu() *
                   engine.gradient_accumulation_steps())
        fields["samples_per_s"] = samples / elapsed
    fields["skipped_steps"] = int(getattr(engine, "skipped_steps", 0))
    state["losses"] = []
    state["since"] = now
    dslaunch.report(step=int(engine.global_steps), **fields)


# ---------------------------------------------------------------- transformers

def _patch_transformers(module):
    trainer = module.Trainer
    init = trainer.__init__

    def hooked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if "transformers" in _failed:
            return
        try:
            self.add_callback(_transformers_callback())
        except Exception as e:
            _fail("transformers", e)

    trainer.__init__ = hooked_init


def _transformers_callback():
    from transformers.trainer_callback import TrainerCallback

    class DslaunchProgress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            # The summary train() logs at its end (train_runtime, train_loss,
            # ...) is no step of its own: the last step was reported.
            if logs and "train_runtime" in logs:
                return
            try:
                fields = {}
                for k, v in (logs or {}).items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        fields["lr" if k == "learning_rate" else k] = v
                dslaunch.report(step=int(state.global_step), **fields)
            except Exception as e:
                _fail("transformers", e)

    return DslaunchProgress()


# ---------------------------------------------------------------- imports

_PATCHES = {
    "deepspeed.runtime.engine": ("deepspeed", _patch_deepspeed),
    "transformers.trainer": ("transformers", _patch_transformers),
}


class _Loader(importlib.abc.Loader):
    """The module's own loader; the patch runs once the module has run."""

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        what, patch = _PATCHES[self._name]
        try:
            patch(module)
        except Exception as e:
            _fail(what, e)

    def __getattr__(self, name):  # get_code, get_source, is_package, ...
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


def install():
    """Attaches to the modules above when they are imported (at once for
    any already imported)."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
    for name, (what, patch) in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            try:
                patch(module)
            except Exception as e:
                _fail(what, e)
