"""Configuring a fresh clone where no CUDA toolkit is: the default
(DSL_CUDA=AUTO) builds dsworker without its CUDA engine and says so, and
-DDSL_CUDA=ON fails naming nvcc. (A clean clone on a machine without nvcc
failed to configure until 2026-11-28: AUTO was taken as ON.) Where this
machine has the toolkit, it is hidden in a mount namespace of the test's own:
a tmpfs over /usr/local/cuda, and a PATH without it. Where nvcc is found, the
default builds the engine. Needs root for the namespace (skips otherwise)."""
import os
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CUDA = "/usr/local/cuda"
PLAIN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def configure(build, *defines, hide_cuda):
    env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "CUDA_PATH")}
    cmake = ["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DDSL_BUILD_TESTS=OFF"]
    cmake += list(defines)
    if hide_cuda:
        env["PATH"] = PLAIN_PATH
        hide = "mount -t tmpfs none %s && " % CUDA if os.path.isdir(CUDA) else ""
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                hide + 'exec "$@"', "sh"] + cmake
    else:
        argv = cmake
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


class Configure(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dsl-configure-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def need_namespace(self):
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            self.skipTest("needs root and unshare to hide the CUDA toolkit")
        if shutil.which("nvcc", path=PLAIN_PATH):
            self.skipTest("an nvcc in %s cannot be hidden" % shutil.which("nvcc", path=PLAIN_PATH))

    def test_without_nvcc_the_default_builds_without_the_cuda_engine(self):
        self.need_namespace()
        build = os.path.join(self.tmp, "b")
        r = configure(build, hide_cuda=True)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertIn("No nvcc: dsworker is built without its CUDA engine", r.stdout)
        with open(os.path.join(build, "build.ninja")) as f:
            ninja = f.read()
        self.assertIn("bin/dsworker", ninja)
        self.assertNotIn("libdsl_cuda.so", ninja)

    def test_without_nvcc_asking_for_the_cuda_engine_fails(self):
        self.need_namespace()
        r = configure(os.path.join(self.tmp, "b"), "-DDSL_CUDA=ON", hide_cuda=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("DSL_CUDA=ON, but no nvcc was found", r.stdout + r.stderr)

    def test_a_value_other_than_auto_on_or_off_is_refused(self):
        r = configure(os.path.join(self.tmp, "b"), "-DDSL_CUDA=maybe", hide_cuda=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("DSL_CUDA=maybe: use AUTO, ON or OFF", r.stdout + r.stderr)

    def test_with_nvcc_the_default_builds_the_cuda_engine(self):
        if not (shutil.which("nvcc") or os.path.exists(os.path.join(CUDA, "bin", "nvcc"))):
            self.skipTest("no nvcc on this machine")
        build = os.path.join(self.tmp, "b")
        r = configure(build, hide_cuda=False)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        with open(os.path.join(build, "build.ninja")) as f:
            self.assertIn("libdsl_cuda.so", f.read())


if __name__ == "__main__":
    unittest.main()
