"""--launcher join in real containers: deploy/Containerfile built by podman
(runc, cgroupfs) over a debian:12-slim made here by mmdebstrap and `podman
import` (no registry is reachable), from the Debian package
deploy/packages.sh made (--build-arg DEBS=prebuilt). A launcher container and
three worker containers on a podman network of their own, each as an
arbitrary non-root UID with GID 0 and a read-only root filesystem (what
OpenShift's restricted-v2 gives a pod), the job secret a mounted file
readable by group 0: the job runs to the end, and a rank failing in one
container ends all of them. Needs root, podman and mmdebstrap; skips itself
otherwise (fails under CI=1). Every container and the network are removed
afterwards."""
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("DSL_BIN", os.path.join(ROOT, "build", "bin"))
PACKAGES = os.environ.get("DSL_PACKAGES", os.path.join(os.path.dirname(BIN), "packages"))
BASE = "localhost/dsl-test-debian:12-slim"
IMAGE = "localhost/dslaunch-test:0.1.0"
UID = 1000680000  # an OpenShift-style UID: no passwd entry in the image
WORKERS = 3
STATE = {}


def skip_or_fail(why):
    if os.environ.get("CI"):
        raise RuntimeError(why + " (CI is set: not skipping)")
    raise unittest.SkipTest(why)


def podman(*args, timeout=120, check=True):
    p = subprocess.run(["podman", *args], capture_output=True, timeout=timeout,
                       env=dict(os.environ, CONTAINERS_CONF=STATE["conf"]))
    if check and p.returncode != 0:
        raise AssertionError("podman %s: %s" % (" ".join(args), p.stderr.decode()[-2000:]))
    return p


def setUpModule():
    if os.geteuid() != 0:
        skip_or_fail("the container tests need root (podman with runc)")
    for tool in ("podman", "runc", "mmdebstrap"):
        if shutil.which(tool) is None:
            skip_or_fail("%s is missing (deploy/setup.sh --test)" % tool)
    if not os.path.exists(os.path.join(PACKAGES, "deb", "dslaunch_0.1.0_amd64.deb")):
        skip_or_fail("no Debian package in %s/deb (deploy/packages.sh)" % PACKAGES)
    STATE["dir"] = tempfile.mkdtemp(prefix="dsl-containers-")
    os.chmod(STATE["dir"], 0o755)
    # podman as these machines run it, and the base image (podman_base.sh).
    p = subprocess.run([os.path.join(HERE, "podman_base.sh"), STATE["dir"]],
                       capture_output=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError("podman_base.sh: " + p.stderr.decode()[-2000:])
    STATE["conf"] = os.path.join(STATE["dir"], "containers.conf")
    assert p.stdout.decode().strip() == BASE, p.stdout
    p = podman("build", "-f", os.path.join(ROOT, "deploy", "Containerfile"),
               "--build-arg", "DEBS=prebuilt", "--build-arg", "BASE=" + BASE,
               "--build-arg", "SLIM=" + BASE, "-t", IMAGE, ROOT, timeout=900)
    STATE["build_log"] = p.stdout.decode()
    STATE["net"] = "dslc" + secrets.token_hex(3)
    # A /24 of 10.215/16 no other suite uses.
    STATE["subnet"] = "10.215.%d" % (secrets.randbelow(200) + 20)
    podman("network", "create", "--subnet", STATE["subnet"] + ".0/24", STATE["net"])
    STATE["secret"] = os.path.join(STATE["dir"], "secret")
    with open(STATE["secret"], "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.chown(STATE["secret"], 0, 0)
    os.chmod(STATE["secret"], 0o440)  # as a Secret with defaultMode 0440


def tearDownModule():
    if "net" in STATE:
        podman("network", "rm", "-f", STATE["net"], check=False)
    if "dir" in STATE:
        shutil.rmtree(STATE["dir"], ignore_errors=True)


class JoinInContainers(unittest.TestCase):
    def setUp(self):
        self.names = []
        self.launcher_ip = STATE["subnet"] + ".2"

    def tearDown(self):
        if self.names:
            podman("rm", "-f", "-t", "0", *self.names, check=False)
            left = podman("ps", "-a", "--format", "{{.Names}}").stdout.decode().split()
            self.assertEqual([n for n in self.names if n in left], [])

    def run_container(self, name, ip, *argv):
        """A container as restricted-v2 makes a pod: UID without a passwd
        entry, GID 0, read-only /, a tmpfs /tmp, the secret as a file."""
        name = "%s-%s" % (STATE["net"], name)
        self.names.append(name)
        podman("run", "-d", "--name", name, "--network", STATE["net"], "--ip", ip,
               "--hostname", name, "--user", "%d:0" % UID, "--read-only",
               "--tmpfs", "/tmp:rw,mode=1777", "--shm-size", "64m",
               "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
               "-v", STATE["secret"] + ":/etc/dslaunch/secret:ro", IMAGE, *argv)
        return name

    def launcher(self, *program):
        return self.run_container(
            "launcher", self.launcher_ip, "dslaunch", "--launcher", "join", "--num_nodes",
            str(WORKERS), "--num_gpus", "2", "--secret_file", "/etc/dslaunch/secret",
            "--control_port", "29400", "--join_timeout", "120", "--no_local_rank",
            "--console", "lines", *program)

    def workers(self):
        return [self.run_container(
            "worker-%d" % i, "%s.%d" % (STATE["subnet"], 10 + i), "dsagent", "--join",
            "%s:29400" % self.launcher_ip, "--secret_file", "/etc/dslaunch/secret")
            for i in range(WORKERS)]

    def wait(self, name, timeout=180):
        p = podman("wait", name, timeout=timeout)
        return int(p.stdout.decode().split()[0])

    def logs(self, name):
        p = podman("logs", name)
        return p.stdout.decode() + p.stderr.decode()

    def test_the_image_is_the_package_on_slim_with_no_build_tools(self):
        p = podman("run", "--rm", "--user", "%d:0" % UID, "--read-only", IMAGE, "sh", "-c",
                   "id -u; id -g; dslaunch --version; command -v gcc cmake sshd || true;"
                   " dpkg-query -W -f='${Package} ${Version}\\n' dslaunch")
        out = p.stdout.decode().split("\n")
        self.assertEqual(out[:4], [str(UID), "0", "dslaunch 0.1.0 (protocol 2)",
                                   "dslaunch 0.1.0"], out)

    def test_a_job_runs_across_three_worker_containers(self):
        launcher = self.launcher("python3", "/opt/dslaunch/examples/demo_rank.py",
                                 "--steps", "10")
        workers = self.workers()
        code = self.wait(launcher)
        log = self.logs(launcher)
        self.assertEqual(code, 0, log[-3000:])
        self.assertIn("all %d agents joined: %d ranks" % (WORKERS, 2 * WORKERS), log)
        for rank in range(2 * WORKERS):
            self.assertIn("rank %d done" % rank, log)
        for w in workers:
            self.assertEqual(self.wait(w, timeout=30), 0, self.logs(w)[-2000:])

    def test_a_rank_failing_in_one_container_ends_them_all(self):
        rank = ("import os, sys, time\n"
                "r = int(os.environ['RANK'])\n"
                "print('rank', r, 'up', flush=True)\n"
                "time.sleep(2 if r == 3 else 300)\n"
                "sys.exit(7)\n")
        launcher = self.launcher("python3", "-c", rank)
        workers = self.workers()
        start = time.monotonic()
        code = self.wait(launcher)
        log = self.logs(launcher)
        self.assertEqual(code, 7, log[-3000:])
        self.assertRegex(log, r"FAILED: rank 3 on \S+worker-1 .*exited with code 7")
        for w in workers:
            self.assertEqual(self.wait(w, timeout=30), 7, self.logs(w)[-2000:])
        # Ranks sleeping 300 s were ended, not waited for.
        self.assertLess(time.monotonic() - start, 60)


if __name__ == "__main__":
    unittest.main()
