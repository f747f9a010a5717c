"""--launcher join on this machine: dsagent processes started by the test (as
worker pods would start them) join a `dslaunch --launcher join` job. Node
ranks from JOB_COMPLETION_INDEX, the hostname and the first free; agents
before the launcher; a failing rank; a node that never joins; a duplicate
and a wrong-secret agent; the launcher SIGKILLed; the secret in no argv.
The pod suite (tests/pods/) runs the same in network namespaces as non-root
UIDs."""
import os
import re
import signal
import socket
import subprocess
import time
import unittest

from harness import BIN, DSLAUNCH, PY, RANK_PY, LaunchTest

DSAGENT = os.path.join(BIN, "dsagent")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Join(LaunchTest):
    def setUp(self):
        super().setUp()
        self.port = free_port()
        self.secret = os.path.join(self.dir, "secret")
        with open(self.secret, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        os.chmod(self.secret, 0o600)
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            if a.poll() is None:
                a.kill()
                a.wait()
        super().tearDown()

    def launcher(self, nodes, *extra, program=("env",)):
        argv = [DSLAUNCH, "--launcher", "join", "--num_nodes", str(nodes),
                "--secret_file", self.secret, "--control_port", str(self.port),
                "--control_addr", "127.0.0.1", "--no_local_rank", *extra,
                PY, RANK_PY, *program]
        return self.start_job(argv)

    def agent(self, index=None, *extra, secret=None, env=None):
        argv = [DSAGENT, "--join", "127.0.0.1:%d" % self.port,
                "--secret_file", secret or self.secret, *extra]
        e = self.env(ENV_KEYS='["RANK", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE"]')
        e.pop("JOB_COMPLETION_INDEX", None)
        if index is not None:
            e["JOB_COMPLETION_INDEX"] = str(index)
        e.update(env or {})
        a = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)
        self.agents.append(a)
        return a

    def finish(self, proc, timeout=30):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            self.fail("%s did not end within %g s; it wrote:\n%s" % (
                proc.args[:3], timeout,
                (self.seen(proc, "stderr") + err).decode(errors="replace")[-3000:]))
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    def env_of(self, rank):
        import json
        with open(os.path.join(self.out, "env-%d.json" % rank)) as f:
            return json.load(f)

    def test_agents_before_the_launcher_in_any_order_take_their_index(self):
        ready = [os.path.join(self.dir, "ready-%d" % i) for i in range(3)]
        agents = {i: self.agent(i, "--ready_file", ready[i]) for i in (2, 0, 1)}
        time.sleep(0.3)  # they dial a launcher that is not there yet
        logs = os.path.join(self.dir, "logs")
        job = self.launcher(3, "--num_gpus", "2", "--log_dir", logs, program=("env",))
        code, out, err = self.finish(job)
        self.assertEqual(code, 0, err)
        self.assertIn("all 3 agents joined: 6 ranks", err)
        # The logs were opened before the plan was final and again after.
        self.assertEqual(sorted(os.listdir(logs)),
                         sorted(["metrics.jsonl"] + ["rank-%d.log" % r for r in range(6)]))
        for i, a in agents.items():
            acode, _, aerr = self.finish(a)
            self.assertEqual(acode, 0, aerr)
            self.assertFalse(os.path.exists(ready[i]), "ready file left behind")
        for rank in range(6):
            env = self.env_of(rank)
            self.assertEqual(env["RANK"], str(rank))
            self.assertEqual(env["NODE_RANK"], str(rank // 2))
            self.assertEqual(env["WORLD_SIZE"], "6")

    def test_the_ready_file_says_joined_while_others_are_missing(self):
        ready = os.path.join(self.dir, "ready-0")
        job = self.launcher(2)
        first = self.agent(0, "--ready_file", ready)
        deadline = time.monotonic() + 10
        while not os.path.exists(ready):
            self.assertLess(time.monotonic(), deadline, "no ready file")
            time.sleep(0.02)
        self.assertIsNone(job.poll())  # still waiting for node 1
        self.agent(1)
        code, _, err = self.finish(job)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.finish(first)[0], 0)
        self.assertFalse(os.path.exists(ready))

    def test_a_pod_that_joins_and_dies_before_the_others_come_is_replaced(self):
        # Node 0's pod joins, then dies (SIGKILL) while node 1 has not come:
        # nothing ran, so its replacement joins as node 0 and the job runs.
        ready = os.path.join(self.dir, "ready-0")
        job = self.launcher(2)
        first = self.agent(0, "--ready_file", ready)
        deadline = time.monotonic() + 10
        while not os.path.exists(ready):
            self.assertLess(time.monotonic(), deadline, "no ready file")
            time.sleep(0.02)
        first.kill()
        first.wait()
        self.read_until(job, "stderr", r"node 0 \(.*\) left before the job started")
        self.assertIsNone(job.poll(), "the launcher gave up on node 0")
        replacement = self.agent(0)
        self.agent(1)
        code, _, err = self.finish(job)
        self.assertEqual(code, 0, self.seen(job, "stderr").decode() + err)
        self.assertEqual(self.finish(replacement)[0], 0)
        self.assertEqual(self.env_of(0)["NODE_RANK"], "0")
        self.assertEqual(self.env_of(1)["WORLD_SIZE"], "2")

    def test_a_joined_agent_whose_launcher_dies_before_the_start_exits_69_at_once(self):
        ready = os.path.join(self.dir, "ready-0")
        job = self.launcher(2)
        agent = self.agent(0, "--ready_file", ready, "--join_timeout", "60")
        deadline = time.monotonic() + 10
        while not os.path.exists(ready):
            self.assertLess(time.monotonic(), deadline, "no ready file")
            time.sleep(0.02)
        job.kill()
        job.wait()
        start = time.monotonic()
        code, _, err = self.finish(agent, timeout=20)
        self.assertEqual(code, 69, err)
        self.assertLess(time.monotonic() - start, 5, "it dialled on for its join timeout")
        self.assertFalse(os.path.exists(ready))

    def test_an_existing_ready_file_is_never_taken_over(self):
        precious = os.path.join(self.dir, "precious")
        with open(precious, "w") as f:
            f.write("precious data\n")
        a = subprocess.run([DSAGENT, "--join", "127.0.0.1:%d" % self.port,
                            "--secret_file", self.secret, "--ready_file", precious],
                           capture_output=True, env=self.env(), timeout=10)
        self.assertEqual(a.returncode, 64)
        self.assertIn(b"exists", a.stderr)
        with open(precious) as f:
            self.assertEqual(f.read(), "precious data\n")

    def test_node_ranks_from_the_hostname_and_the_first_free(self):
        # A StatefulSet-like name cannot be faked for a process here; the
        # claim comes through --node_rank and "any" (the unit tests cover
        # the hostname rule; tests/pods/ the real hostnames).
        job = self.launcher(3)
        self.agent(None, "--node_rank", "2")
        time.sleep(0.2)
        self.agent(None, "--node_rank", "0")
        time.sleep(0.2)
        env = {"JOB_COMPLETION_INDEX": ""}
        self.agent(None, env=env)
        code, _, err = self.finish(job)
        self.assertEqual(code, 0, err)
        for a in self.agents:
            self.assertEqual(self.finish(a)[0], 0)

    def test_a_failing_rank_ends_every_node_and_every_agent_says_so(self):
        job = self.launcher(3, "--num_gpus", "2", program=("fail", "5", "exit3"))
        for i in range(3):
            self.agent(i)
        code, _, err = self.finish(job)
        self.assertEqual(code, 3, err)
        self.assertIn("rank 5", err)
        for a in self.agents:
            acode, _, aerr = self.finish(a)
            self.assertEqual(acode, 3, aerr)

    def test_a_node_that_never_joins_is_named_and_the_others_fail(self):
        job = self.launcher(3, "--join_timeout", "2")
        self.agent(0)
        self.agent(2)
        self.read_until(job, "stderr", r"1 of 3 joined|2 of 3 joined|waiting for agents")
        code, _, err = self.finish(job)
        err = self.seen(job, "stderr").decode() + err
        self.assertEqual(code, 69, err)
        self.assertIn("no agent joined as node rank 1 within 2 s", err)
        for a in self.agents:
            acode, _, aerr = self.finish(a)
            self.assertNotEqual(acode, 0, aerr)

    def test_a_duplicate_and_a_wrong_secret_are_refused_without_harm(self):
        other = os.path.join(self.dir, "other-secret")
        with open(other, "w") as f:
            f.write("b" * 64)
        job = self.launcher(2, program=("env",))
        first = self.agent(0)
        self.read_until(job, "stderr", r"node 0 .*joined|waiting for agents")
        time.sleep(0.5)
        dup = self.agent(0)
        dcode, _, derr = self.finish(dup)
        self.assertNotEqual(dcode, 0)
        self.assertRegex(derr, r"node rank 0 is taken by the agent on \S+ \(127\.0\.0\.1\)")
        wrong = self.agent(1, "--join_timeout", "3", secret=other)
        wcode, _, werr = self.finish(wrong)
        self.assertNotEqual(wcode, 0)
        self.agent(1)
        code, _, err = self.finish(job)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.finish(first)[0], 0)

    def test_agents_end_their_ranks_when_the_launcher_is_killed(self):
        job = self.launcher(2, "--heartbeat_timeout", "2", program=("sleep", "60"))
        for i in range(2):
            self.agent(i)
        self.wait_started(2)
        # The secret is in no process's argv.
        with open(self.secret) as f:
            secret = f.read().strip()
        for pid in [job.pid] + [a.pid for a in self.agents] + self.started_pids():
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                self.assertNotIn(secret.encode(), f.read())
        job.kill()
        job.wait()
        start = time.monotonic()
        for a in self.agents:
            acode, _, aerr = self.finish(a, timeout=10)
            self.assertEqual(acode, 69, aerr)
        self.assertLess(time.monotonic() - start, 6)

    def test_without_a_secret_file_the_launcher_refuses(self):
        p = self.run_job([DSLAUNCH, "--launcher", "join", "--num_nodes", "2", "true"])
        self.assertEqual(p.returncode, 64)
        self.assertIn(b"--secret_file", p.stderr)
        e = self.env(KUBERNETES_SERVICE_HOST="10.0.0.1")
        a = subprocess.run([DSAGENT], capture_output=True, env=e)
        self.assertEqual(a.returncode, 64)
        self.assertIn(b"--join", a.stderr)
        # A careless agent command line: refused at once, never dialling.
        for bad, said in ((["--node_rank", "-3"], b"--node_rank must be"),
                          (["--join_timeout", "nan"], b"--join_timeout must be"),
                          (["--join_timeout", "-1"], b"--join_timeout must be")):
            a = subprocess.run([DSAGENT, "--join", "127.0.0.1:%d" % self.port,
                                "--secret_file", self.secret, *bad],
                               capture_output=True, env=self.env(), timeout=10)
            self.assertEqual(a.returncode, 64, bad)
            self.assertIn(said, a.stderr)
        a = subprocess.run([DSAGENT, "--join", "127.0.0.1:%d" % self.port],
                           capture_output=True, env=self.env(), timeout=10)
        self.assertEqual(a.returncode, 64)
        self.assertIn(b"--secret_file", a.stderr)


if __name__ == "__main__":
    unittest.main()
