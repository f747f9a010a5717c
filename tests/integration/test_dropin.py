"""DeepSpeed's launcher flags and conventions, end to end on this machine
(127.0.0.1-2 as nodes): .py scripts through the python3 first on PATH (a
venv-like directory), --module, --local_rank placement, the interpreter
environment, DS_ENV_FILE, --save_pid, --enable_each_rank_log,
--bind_cores_to_rank, --num_gpus without a hostfile, refused flags, and the
--master_addr warning."""
import json
import os
import unittest

from harness import DSLAUNCH, PY, LaunchTest

SCRIPT = r'''
import json, os, sys
r = os.environ["RANK"]
json.dump({"argv": sys.argv, "exe": sys.executable, "cwd": os.getcwd(),
           "affinity": sorted(os.sched_getaffinity(0)),
           "env": {k: os.environ.get(k) for k in
                   ("VIRTUAL_ENV", "FROM_DS_ENV", "OMP_NUM_THREADS", "PATH")}},
          open(os.path.join(os.environ["OUT_DIR"], "py-%s.json" % r), "w"))
print("rank %s says hello" % r, flush=True)
'''


class DropIn(LaunchTest):
    def setUp(self):
        super().setUp()
        # A venv-like interpreter directory: bin/python3 links to the real
        # interpreter, as `python3 -m venv` makes it.
        self.venv = os.path.join(self.dir, "venv")
        os.makedirs(os.path.join(self.venv, "bin"))
        self.python = os.path.join(self.venv, "bin", "python3")
        os.symlink(PY, self.python)
        self.script = os.path.join(self.dir, "train.py")
        with open(self.script, "w") as f:
            f.write(SCRIPT)
        os.makedirs(os.path.join(self.dir, "pkg"))
        with open(os.path.join(self.dir, "pkg", "__init__.py"), "w"):
            pass
        with open(os.path.join(self.dir, "pkg", "train.py"), "w") as f:
            f.write(SCRIPT)

    def venv_env(self, **kw):
        return dict(PATH=os.path.join(self.venv, "bin") + ":" + os.environ["PATH"],
                    VIRTUAL_ENV=self.venv, **kw)

    def py_files(self, world):
        out = []
        for rank in range(world):
            with open(os.path.join(self.out, "py-%d.json" % rank)) as f:
                out.append(json.load(f))
        return out

    def dslaunch(self, *args, nodes=2, slots=1):
        return [DSLAUNCH, "--hostfile", self.hostfile(nodes, slots), "--launcher", "local",
                *args]

    def test_a_py_script_runs_with_the_venvs_python_in_deepspeeds_order(self):
        p = self.run_job(self.dslaunch(self.script, "--deepspeed", "a b"),
                         **self.venv_env())
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        for rank, got in enumerate(self.py_files(2)):
            self.assertEqual(got["argv"], [self.script, "--local_rank=0", "--deepspeed", "a b"])
            # The launcher's interpreter environment came along.
            self.assertTrue(got["env"]["PATH"].startswith(os.path.dirname(self.python)))
            self.assertEqual(got["env"]["VIRTUAL_ENV"], self.venv)
            self.assertEqual(got["cwd"], os.getcwd())

    def test_the_interpreter_is_the_venvs_bin_python3(self):
        # What ran: the rank's own /proc/self/exe resolves to the real
        # interpreter, so check the command line the agent gave instead.
        probe = os.path.join(self.dir, "argv0.py")
        with open(probe, "w") as f:
            f.write("import os, sys\n"
                    "open(os.path.join(os.environ['OUT_DIR'], 'cmd-' + os.environ['RANK']), 'w')"
                    ".write(open('/proc/self/cmdline').read())\n")
        p = self.run_job(self.dslaunch(probe, "x", nodes=1), **self.venv_env())
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        with open(os.path.join(self.out, "cmd-0")) as f:
            self.assertEqual(f.read().split("\0")[:-1],
                             [self.python, "-u", probe, "--local_rank=0", "x"])

    def test_module_and_no_python_and_dslaunch_python(self):
        p = self.run_job(self.dslaunch("-m", "pkg.train", "--x", nodes=1),
                         PYTHONPATH=self.dir, **self.venv_env())
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(self.py_files(1)[0]["argv"][1:], ["--local_rank=0", "--x"])
        os.remove(os.path.join(self.out, "py-0.json"))
        wrapper = os.path.join(self.dir, "run.sh")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\nexec "%s" "%s" "$@"\n' % (PY, self.script))
        os.chmod(wrapper, 0o755)
        p = self.run_job(self.dslaunch("--no_python", wrapper, "--y", nodes=1))
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(self.py_files(1)[0]["argv"][1:], ["--local_rank=0", "--y"])
        p = self.run_job(self.dslaunch("--no_python", "-m", "pkg.train", nodes=1))
        self.assertEqual(p.returncode, 64, p.stderr.decode())
        self.assertIn("--no_python and --module cannot be used together", p.stderr.decode())
        p = self.run_job(self.dslaunch(self.script, nodes=1), DSLAUNCH_PYTHON=PY,
                         PATH="/nonexistent")
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        p = self.run_job(self.dslaunch(self.script, nodes=1), PATH="/nonexistent")
        self.assertEqual(p.returncode, 64)
        self.assertIn("no python3 on PATH", p.stderr.decode())

    def test_ds_env_file_and_num_gpus_without_a_hostfile(self):
        env_file = os.path.join(self.dir, "my.env")
        with open(env_file, "w") as f:
            f.write("FROM_DS_ENV='quoted value'\n")
        p = self.run_job([DSLAUNCH, "--num_gpus", "3", self.script], DS_ENV_FILE=env_file,
                         **self.venv_env())
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        got = self.py_files(3)
        self.assertEqual([g["argv"][1] for g in got],
                         ["--local_rank=0", "--local_rank=1", "--local_rank=2"])
        self.assertEqual(got[2]["env"]["FROM_DS_ENV"], "quoted value")

    def test_save_pid_holds_our_pid_while_the_job_runs(self):
        job = self.start_job(self.dslaunch("--save_pid", "--no_local_rank", PY,
                                           os.path.join(os.path.dirname(__file__), "rank.py"),
                                           "sleep", nodes=1))
        path = "/tmp/%d.deepspeed" % job.pid
        self.wait_started(1)
        with open(path) as f:
            self.assertEqual(f.read(), str(job.pid))
        job.terminate()
        job.communicate(timeout=30)
        self.assertEqual(job.returncode, 143)  # SIGTERM: a preemption
        self.assertFalse(os.path.exists(path), "the pid file outlived the job")

    def test_each_rank_log_keeps_rank_output_off_the_console(self):
        logs = os.path.join(self.dir, "ranklogs")
        p = self.run_job(self.dslaunch("--enable_each_rank_log", logs, self.script),
                         **self.venv_env())
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertNotIn(b"says hello", p.stdout)
        names = sorted(os.listdir(logs))
        self.assertEqual(len(names), 3, names)  # two ranks and metrics.jsonl
        for rank in range(2):
            name = [n for n in names if n.endswith("_rank%d.log" % rank)]
            self.assertEqual(len(name), 1, names)
            self.assertRegex(name[0], r"^\d{14}_rank%d\.log$" % rank)
            with open(os.path.join(logs, name[0])) as f:
                self.assertEqual(f.read(), "rank %d says hello\n" % rank)

    def test_bind_cores_to_rank_gives_each_rank_its_own_cores(self):
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            self.skipTest("needs 2 CPUs")
        p = self.run_job(self.dslaunch("--bind_cores_to_rank", "--bind_core_list",
                                       "%d,%d" % (cores[0], cores[1]), self.script,
                                       nodes=1, slots=2), **self.venv_env())
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        got = self.py_files(2)
        self.assertEqual(got[0]["affinity"], [cores[0]])
        self.assertEqual(got[1]["affinity"], [cores[1]])
        self.assertEqual(got[0]["env"]["OMP_NUM_THREADS"], "1")
        p = self.run_job(self.dslaunch("--bind_cores_to_rank", "--bind_core_list",
                                       str(cores[0]), self.script, nodes=1, slots=2),
                         **self.venv_env())
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("1 cores (%d) for 2 ranks" % cores[0], p.stderr.decode())

    def test_deepspeed_flags_we_do_not_do_are_refused(self):
        for flags in (["--elastic_training"], ["--autotuning", "run"],
                      ["--max_elastic_nodes", "4"]):
            p = self.run_job([DSLAUNCH, *flags, self.script])
            self.assertEqual(p.returncode, 64, p.stderr.decode())
            self.assertIn(flags[0] + ": ", p.stderr.decode())
        p = self.run_job(self.dslaunch("--launcher_args", "-x", self.script))
        self.assertEqual(p.returncode, 64)
        self.assertIn("--launcher_args is passed to pdsh, srun or mpirun", p.stderr.decode())

    def test_a_master_addr_that_is_not_node_0_gets_a_warning(self):
        p = self.run_job(self.dslaunch("--master_addr", "127.0.0.2", "--no_local_rank",
                                       "true"))
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertIn("warning: --master_addr 127.0.0.2 is not node 0 (127.0.0.1", p.stderr.decode())
        p = self.run_job(self.dslaunch("--master_addr", "127.0.0.1", "--no_local_rank",
                                       "true"))
        self.assertNotIn("warning: --master_addr", p.stderr.decode())


if __name__ == "__main__":
    unittest.main()
