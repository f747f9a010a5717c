"""The packages deploy/packages.sh makes from the build (build/packages/):
  - the wheel (scikit-build-core, repaired by auditwheel): tagged manylinux
    for the glibc auditwheel finds it needs; installed into a fresh venv from
    the file alone, its commands run a 2-node job of dsworker (ZeRO-1 over
    Gloo) and of Python ranks that import the client (the SSH cluster suite,
    tests/cluster/test_cluster.py, runs from such an install under ctest);
  - the Debian packages: installed by apt into a fresh Debian 12 made by
    mmdebstrap (which fetches the Depends dpkg-shlibdeps wrote), where the
    three programs say their version and a job of two Python ranks runs;
  - every option `dslaunch --help` lists is in the README.
Needs root for the chroot (skips it otherwise); the
packages missing skips everything (a failure under CI=1)."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
import cluster_env  # noqa: E402
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("DSL_BIN", os.path.join(ROOT, "build", "bin"))
PACKAGES = os.environ.get("DSL_PACKAGES", os.path.join(os.path.dirname(BIN), "packages"))
WHEEL_VENV = os.environ.get("DSL_WHEEL_VENV", "/opt/dslaunch-test/wheel-venv")
VERSION = "0.1.0"
CORPUS = ("In the beginning God created the heaven and the earth. And the earth was "
          "without form, and void; and darkness was upon the face of the deep. ") * 300
RANK = ("import os, dslaunch; dslaunch.report(step=1, loss=0.25 + int(os.environ['RANK']));"
        " print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], dslaunch.__file__)")


def skip_or_fail(test, why):
    if os.environ.get("CI"):
        test.fail(why)
    test.skipTest(why)


def one(test, pattern):
    found = glob.glob(os.path.join(PACKAGES, pattern))
    if not found:
        skip_or_fail(test, "no %s in %s (deploy/packages.sh makes it)" % (pattern, PACKAGES))
    test.assertEqual(len(found), 1, found)
    return found[0]


def run(argv, timeout=120, **kw):
    return subprocess.run(argv, capture_output=True, timeout=timeout, **kw)


class Wheel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="dsl-wheel-")
        cls.venv = os.path.join(cls.tmp.name, "venv")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def install(self):
        """A fresh venv with the repaired wheel, installed from the file alone."""
        wheel = one(self, "wheelhouse/dslaunch-*.whl")
        return cluster_env.install_wheel(wheel, self.venv)

    def test_tagged_for_the_glibc_it_needs(self):
        wheel = one(self, "wheelhouse/dslaunch-*.whl")
        m = re.fullmatch(r"dslaunch-%s-py3-none-(manylinux_2_(\d+)_x86_64)\.whl" % VERSION,
                         os.path.basename(wheel))
        self.assertIsNotNone(m, wheel)
        p = run([os.path.join(WHEEL_VENV, "bin", "auditwheel"), "show", wheel],
                env=dict(os.environ, PATH=os.path.join(WHEEL_VENV, "bin") + ":" +
                         os.environ["PATH"]))
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        out = " ".join(p.stdout.decode().split())
        # auditwheel's own verdict: the symbols the programs use constrain the
        # wheel to the tag it carries (cuBLAS, left out on purpose, keeps
        # `show` from calling the whole wheel manylinux).
        self.assertIn('This constrains the platform tag to "%s"' % m.group(1), out)
        # The newest glibc symbol any program needs is that tag's.
        needed = max(int(v) for v in re.findall(r"GLIBC_2\.(\d+)", out))
        self.assertEqual(needed, int(m.group(2)), out)

    def test_the_venvs_commands_run_a_two_node_job(self):
        bin_dir = self.install()
        for prog in ("dslaunch", "dsagent", "dsworker"):
            p = run([os.path.join(bin_dir, prog), "--version"])
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            self.assertEqual(p.stdout.decode().strip(), "%s %s (protocol 2)" % (prog, VERSION))
        work = tempfile.mkdtemp(dir=self.tmp.name)
        hosts = os.path.join(work, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
        launch = [os.path.join(bin_dir, "dslaunch"), "--hostfile", hosts, "--launcher", "local",
                  "--no_local_rank"]
        # Python ranks: the client imports from the wheel's own copy.
        logs = os.path.join(work, "logs-py")
        p = run(launch + ["--log_dir", logs, os.path.join(bin_dir, "python"), "-c", RANK])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        for rank in range(2):
            self.assertRegex(p.stdout.decode(), r"rank %d of 2 %s" % (
                rank, re.escape(os.path.join(self.venv, "lib"))))
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            losses = sorted(json.loads(x)["loss"] for x in f if '"step"' in x)
        self.assertEqual(losses, [0.25, 1.25])
        # dsworker, ZeRO-1 across the two nodes (Gloo, OpenBLAS: the vendored libraries).
        with open(os.path.join(work, "corpus.txt"), "w") as f:
            f.write(CORPUS)
        p = run([os.path.join(bin_dir, "dsworker"), "prepare", "--input",
                 os.path.join(work, "corpus.txt"), "--out", os.path.join(work, "data"),
                 "--vocab", "300"])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        config = os.path.join(work, "ds.json")
        with open(config, "w") as f:
            json.dump({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
                       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                       "zero_optimization": {"stage": 1},
                       "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16,
                                 "vocab_size": 300},
                       "data": {"train": os.path.join(work, "data", "train_000.bin")},
                       "train": {"steps": 4, "seed": 7}}, f)
        logs = os.path.join(work, "logs-w")
        p = run(launch + ["--log_dir", logs, os.path.join(bin_dir, "dsworker"), "train",
                          "--config", config], timeout=300,
                env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            steps = [json.loads(x) for x in f if '"step"' in x]
        self.assertEqual(sorted((r["rank"], r["step"]) for r in steps),
                         [(r, s) for r in range(2) for s in range(1, 5)])


class DebianPackage(unittest.TestCase):
    def test_installs_and_runs_on_a_fresh_debian_12(self):
        deb = one(self, "deb/dslaunch_%s_amd64.deb" % VERSION)
        if os.geteuid() != 0:
            skip_or_fail(self, "a chroot needs root")
        if shutil.which("mmdebstrap") is None:
            skip_or_fail(self, "mmdebstrap is missing (deploy/setup.sh --test)")
        with tempfile.TemporaryDirectory(prefix="dsl-deb-") as tmp:
            root = os.path.join(tmp, "root")
            # apt installs the package and what its Depends name, nothing else
            # of ours: the file is bind-mounted in for the install only.
            p = run(["mmdebstrap", "--variant=apt", "--include=python3",
                     "--hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount",
                     "--include=" + deb, "bookworm", root], timeout=900)
            self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
            self.assertFalse(os.path.exists(os.path.join(root, BIN.lstrip("/"))))
            for prog in ("dslaunch", "dsagent", "dsworker"):
                p = run(["chroot", root, prog, "--version"])
                self.assertEqual(p.returncode, 0, p.stderr.decode())
                self.assertEqual(p.stdout.decode().strip(),
                                 "%s %s (protocol 2)" % (prog, VERSION))
            with open(os.path.join(root, "root", "hosts"), "w") as f:
                f.write("127.0.0.1 slots=2\n")
            # A job inside: its own /proc, /dev and /tmp, gone with the namespace.
            script = ("mount -t proc proc {r}/proc && mount --bind /dev {r}/dev && "
                      "mount -t tmpfs tmpfs {r}/tmp && exec chroot {r} dslaunch "
                      "--hostfile /root/hosts --launcher local --no_local_rank python3 -c "
                      "\"$0\"").format(r=root)
            p = run(["unshare", "--mount", "--pid", "--fork", "--propagation", "private",
                     "sh", "-c", script, RANK], timeout=120)
            out = p.stdout.decode()
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            for rank in range(2):
                self.assertIn("rank %d of 2 /usr/share/dslaunch/python/dslaunch/__init__.py"
                              % rank, out)


class Help(unittest.TestCase):
    def test_every_option_of_dslaunch_help_is_in_the_readme(self):
        p = run([os.path.join(BIN, "dslaunch"), "--help"])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        options = set(re.findall(r"^\s+(?:-\w,)?(--\w+)", p.stdout.decode(), re.M))
        self.assertGreater(len(options), 30, p.stdout.decode())
        with open(os.path.join(ROOT, "README.md")) as f:
            readme = f.read()
        missing = sorted(o for o in options - {"--help", "--version"}
                         if not re.search(re.escape(o) + r"\b", readme))
        self.assertEqual(missing, [], "options of dslaunch --help the README does not name")


if __name__ == "__main__":
    unittest.main()
