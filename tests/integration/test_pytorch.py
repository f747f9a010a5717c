"""A real PyTorch job: Debian's python3-torch (/usr/bin/python3) runs a
DDP/gloo all-reduce across 6 ranks launched by dslaunch, the script
unchanged, using only the env contract (init_method env://)."""
import os
import subprocess
import unittest

from harness import LaunchTest

TORCH_PY = "/usr/bin/python3"
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_allreduce.py")


def have_torch():
    try:
        return subprocess.run([TORCH_PY, "-c", "import torch.distributed"],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class PyTorchDdp(LaunchTest):
    def test_ddp_gloo_allreduce_across_six_ranks(self):
        if not have_torch():
            if os.environ.get("CI"):
                self.fail("python3-torch is missing; deploy/setup.sh --test installs it")
            self.skipTest("Debian's python3-torch is not installed")
        # DeepSpeed-style: --local_rank=N is appended; the script accepts it.
        argv = [a for a in self.args() if a != "--no_local_rank"]
        p = self.run_job(argv + ["--master_port", "29631", TORCH_PY, SCRIPT], timeout=300,
                         OMP_NUM_THREADS="1")
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-3000:])
        for rank in range(6):
            self.assertIn("rank %d/6 allreduce ok sum=21.0 ddp ok" % rank, out)


if __name__ == "__main__":
    unittest.main()
