"""Builds and tears down a cluster.sh cluster for a test module: up() returns
its DIR/env as a dict (plus "dir"), skipping the module with the script's
message when the machine cannot host one (exit 77; a failure under CI=1)."""
import os
import shutil
import subprocess
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
