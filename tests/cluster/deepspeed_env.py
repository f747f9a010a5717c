"""A real DeepSpeed (PyPI, CPU, DS_BUILD_OPS=0) in a venv that sees Debian's
python3-torch (--system-site-packages), made by `deploy/setup.sh --test` at
$DSL_DEEPSPEED_VENV (default /opt/dslaunch-test/deepspeed-venv). The venv is
on no node's login PATH: only the launcher's environment names it, as when a
user activated it before starting a job. `deepspeed` itself runs the same
script on this machine for the reference losses."""
import json
import os
import subprocess
import tempfile

VENV = os.environ.get("DSL_DEEPSPEED_VENV", "/opt/dslaunch-test/deepspeed-venv")
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ds_train.py")
CONFIG = os.path.join(HERE, "ds_config.json")
_reference = {}


def need_deepspeed(test):
    """Skips `test` without the venv (fails it under CI=1)."""
    if not os.access(os.path.join(VENV, "bin", "deepspeed"), os.X_OK):
        if os.environ.get("CI"):
            test.fail("no DeepSpeed venv at %s (deploy/setup.sh --test makes it)" % VENV)
        test.skipTest("no DeepSpeed venv at %s (deploy/setup.sh --test makes it)" % VENV)


def activated(**env):
    """The launcher's environment with the venv activated."""
    return dict(PATH=os.path.join(VENV, "bin") + ":" + os.environ["PATH"],
                VIRTUAL_ENV=VENV, OMP_NUM_THREADS="1", **env)


def script_args(out):
    return [SCRIPT, "--deepspeed_config", CONFIG, "--out", out]


def read_losses(out, world):
    records = []
    for rank in range(world):
        with open(os.path.join(out, "losses-%d.json" % rank)) as f:
            records.append(json.load(f))
    return records


def reference(world):
    """Each rank's losses under `deepspeed --num_gpus WORLD` on this machine
    (computed once per world size)."""
    if world not in _reference:
        with tempfile.TemporaryDirectory(prefix="dsl-ds-ref-") as out:
            env = dict(os.environ, **activated())
            p = subprocess.run([os.path.join(VENV, "bin", "deepspeed"), "--num_gpus", str(world),
                                *script_args(out)], capture_output=True, timeout=600, env=env)
            if p.returncode != 0:
                raise RuntimeError("deepspeed itself failed:\n" + p.stderr.decode()[-3000:])
            _reference[world] = [r["losses"] for r in read_losses(out, world)]
    return _reference[world]


def check_same_losses(test, out, world, local_size):
    """The job's ranks got DeepSpeed's own losses, ran the venv's interpreter
    and got DeepSpeed's --local_rank."""
    want = reference(world)
    for rank, record in enumerate(read_losses(out, world)):
        test.assertEqual(record["world"], world)
        test.assertEqual(record["prefix"], VENV, "rank %d ran another python" % rank)
        test.assertEqual(record["virtual_env"], VENV)
        test.assertEqual(record["local_rank_arg"], rank % local_size)
        test.assertEqual(len(record["losses"]), len(want[rank]))
        for got, expected in zip(record["losses"], want[rank]):
            test.assertAlmostEqual(got, expected, delta=1e-5 * max(1.0, abs(expected)),
                                   msg="rank %d: %s vs deepspeed's %s"
                                   % (rank, record["losses"], want[rank]))


def check_hook_records(test, out, logs, world):
    """dslaunch's progress hook reported each rank's optimizer steps with the
    losses the script computed itself (metrics.jsonl under --log_dir)."""
    with open(os.path.join(logs, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"step"' in line]
    for rank, got in enumerate(read_losses(out, world)):
        mine = [r for r in records if r["rank"] == rank]
        test.assertEqual([r["step"] for r in mine], list(range(1, len(got["losses"]) + 1)))
        for r, loss in zip(mine, got["losses"]):
            test.assertAlmostEqual(r["loss"], loss, delta=1e-6 * max(1.0, abs(loss)))
            test.assertGreater(r["lr"], 0)
