"""Builds and tears down a cluster.sh cluster for a test module: up() returns
its DIR/env as a dict (plus "dir"), skipping the module with the script's
message when the machine cannot host one (exit 77; a failure under CI=1)."""
import atexit
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

CLUSTER_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster.sh")


def up(nodes, prefix, **env):
    if os.geteuid() != 0:
        raise unittest.SkipTest("cluster tests need root (network namespaces)")
    cluster = {"dir": os.path.join(tempfile.mkdtemp(prefix=prefix), "c")}
    p = subprocess.run([CLUSTER_SH, "up", str(nodes), cluster["dir"]], capture_output=True,
                       timeout=120, env=dict(os.environ, **env))
    if p.returncode == 77:
        if os.environ.get("CI"):
            raise RuntimeError("cannot build a test cluster under CI: " + p.stderr.decode())
        raise unittest.SkipTest("cannot build a test cluster here: " + p.stderr.decode())
    if p.returncode != 0:
        raise RuntimeError("cluster.sh up failed:\n" + p.stderr.decode())
    with open(os.path.join(cluster["dir"], "env")) as f:
        for line in f:
            key, _, value = line.strip().partition("=")
            cluster[key] = value.strip('"')
    return cluster


def down(cluster):
    if "dir" in cluster:
        subprocess.run([CLUSTER_SH, "down", cluster["dir"]], timeout=120)
        shutil.rmtree(os.path.dirname(cluster["dir"]), ignore_errors=True)


def need_torch(test):
    """Skips `test` without Debian's python3-torch (fails it under CI=1)."""
    if subprocess.run(["/usr/bin/python3", "-c", "import torch.distributed"],
                      capture_output=True).returncode != 0:
        if os.environ.get("CI"):
            test.fail("python3-torch is missing")
        test.skipTest("Debian's python3-torch is not installed")


def install_wheel(wheel, venv):
    """A fresh venv at `venv` with `wheel` installed from the file alone;
    returns the venv's bin/."""
    subprocess.run(["/usr/bin/python3", "-m", "venv", venv], check=True, timeout=120)
    subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "--no-index",
                    "--disable-pip-version-check", wheel], check=True, timeout=300)
    return os.path.join(venv, "bin")


def install_wheel_if_asked():
    """With DSL_CLUSTER_FROM_WHEEL=DIR (ctest sets it to the wheelhouse
    deploy/packages.sh fills), installs the one wheel there into a fresh venv
    and points DSL_BIN at the venv's bin/: the suite then runs the installed
    programs, as a user's venv on a shared filesystem has them. Without a
    wheel there the build's programs run, as said on stderr (an error under
    CI=1). Call before importing harness."""
    where = os.environ.get("DSL_CLUSTER_FROM_WHEEL")
    if not where:
        return None
    wheels = glob.glob(os.path.join(where, "dslaunch-*.whl"))
    if len(wheels) != 1:
        msg = "no single dslaunch wheel in %s (deploy/packages.sh makes it)" % where
        if os.environ.get("CI"):
            raise RuntimeError(msg)
        sys.stderr.write(msg + ": running the build's programs\n")
        return None
    tmp = tempfile.mkdtemp(prefix="dsl-wheel-venv-")
    atexit.register(shutil.rmtree, tmp, True)
    venv = os.path.join(tmp, "venv")
    os.environ["DSL_BIN"] = install_wheel(wheels[0], venv)
    sys.stderr.write("running the programs of %s, installed in %s\n" % (wheels[0], venv))
    return venv
