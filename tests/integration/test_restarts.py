"""--max_restarts on one machine (--launcher local): a failed generation is
followed by another on the same agents, with a fresh rendezvous and the
restart count in every rank's environment; dsworker resumes from its newest
complete checkpoint and ends with the loss of a run that never failed, bit
for bit. What must not restart does not, and the budget holds."""
import json
import os
import random
import re
import signal
import subprocess
import time

from harness import DSLAUNCH, LaunchTest
from test_prometheus import free_port
import test_worker

# One line per generation and rank: what the contract gave it.
SCRIPT = r"""
echo "gen $RANK $DSLAUNCH_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS $MASTER_PORT"
if [ "$RANK" = 1 ] && [ "$DSLAUNCH_RESTART_COUNT" -lt "$FAIL_GENERATIONS" ]; then exit 3; fi
exec sleep "${HOLD:-0.2}"
"""


class Generations(LaunchTest):
    def script(self):
        path = os.path.join(self.dir, "rank.sh")
        with open(path, "w") as f:
            f.write(SCRIPT)
        return ["/bin/sh", path]

    @staticmethod
    def generations(out):
        """[(rank, restart_count, torchelastic_count, max, master_port)]."""
        return [tuple(int(x) for x in m) for m in
                re.findall(r"gen (\d+) (\d+) (\d+) (\d+) (\d+)", out)]

    def test_each_generation_gets_the_restart_count_and_a_fresh_master_port(self):
        p = self.run_job(self.args(nodes=2, slots=2, extra=[
            "--max_restarts", "3", "--restart_backoff", "0"]) + self.script(),
            FAIL_GENERATIONS="2")
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err[-3000:])
        gens = self.generations(p.stdout.decode())
        self.assertEqual(sorted({g[1] for g in gens}), [0, 1, 2])
        for rank, count, elastic, most, _ in gens:
            self.assertEqual(count, elastic)
            self.assertEqual(most, 3)
        ports = {count: {g[4] for g in gens if g[1] == count} for count in (0, 1, 2)}
        for count, seen in ports.items():
            self.assertEqual(len(seen), 1, ports)  # one rendezvous per generation
        self.assertEqual(len({min(s) for s in ports.values()}), 3, ports)  # fresh each time
        self.assertIn("restart 1 of 3", err)
        self.assertIn("restart 2 of 3", err)
        self.assertNotIn("restart 3 of 3", err)
        self.assertIn("generation 0 on 2 nodes", err)
        self.assertIn("generation 1 on 2 nodes", err)
        self.assertIn("exited 0", err)
        self.assertIn("after 2 restarts", err)
        self.assert_no_leftovers()

    def test_the_budget_holds_and_the_last_generations_status_is_the_exit(self):
        p = self.run_job(self.args(nodes=2, slots=2, extra=[
            "--max_restarts", "2", "--restart_backoff", "0"]) + self.script(),
            FAIL_GENERATIONS="100")
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 3, err[-3000:])
        gens = self.generations(p.stdout.decode())
        self.assertEqual(sorted({g[1] for g in gens}), [0, 1, 2])  # 1 + 2 restarts
        self.assertIn("FAILED: rank 1", err)
        self.assert_no_leftovers()

    def test_a_program_that_cannot_start_is_not_restarted(self):
        p = self.run_job(self.args(nodes=1, slots=2, extra=[
            "--max_restarts", "5", "--restart_backoff", "0"]) +
            [os.path.join(self.dir, "no-such-program")])
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 127, err[-3000:])
        self.assertNotIn("restart 1", err)
        self.assertIn("no-such-program", err)

    def test_ctrl_c_while_a_restart_waits_ends_the_job_with_130(self):
        job = self.start_job(self.args(nodes=2, slots=1, extra=[
            "--max_restarts", "3", "--restart_backoff", "30"]) + self.script(),
            FAIL_GENERATIONS="1")
        self.addCleanup(lambda: job.poll() is None and job.kill())
        self.addCleanup(job.stdout.close)
        self.addCleanup(job.stderr.close)
        self.read_until(job, "stderr", r"then restart 1 of 3")
        time.sleep(0.3)  # the stop is done: the backoff runs
        job.send_signal(signal.SIGINT)
        start = time.monotonic()
        job.wait(timeout=20)
        self.assertEqual(job.returncode, 130)
        self.assertLess(time.monotonic() - start, 5)
        out = (self.seen(job, "stderr") + job.stderr.read()).decode()
        self.assertIn("stopped: interrupted by the user (SIGINT)", out)
        self.assertNotIn("restart 1 of 3 (", out)  # no second generation began
        self.assert_no_leftovers()

    def test_prometheus_and_metrics_jsonl_count_the_restarts(self):
        logs = os.path.join(self.dir, "logs")
        port = free_port()
        job = self.start_job(self.args(nodes=1, slots=2, extra=[
            "--max_restarts", "1", "--restart_backoff", "0", "--log_dir", logs,
            "--metrics_port", str(port), "--metrics_addr", "127.0.0.1"]) + self.script(),
            FAIL_GENERATIONS="1", HOLD="30")
        self.addCleanup(lambda: job.poll() is None and job.kill())
        self.addCleanup(job.stdout.close)
        self.addCleanup(job.stderr.close)
        url = "http://127.0.0.1:%d/metrics" % port
        self.read_until(job, "stderr", r"restart 1 of 1 \(")
        import urllib.request
        deadline = time.monotonic() + 10
        while True:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            if re.search(r"^dslaunch_restarts_total 1$", body, re.M):
                break
            self.assertLess(time.monotonic(), deadline, body[-2000:])
            time.sleep(0.2)
        job.send_signal(signal.SIGINT)
        job.wait(timeout=20)
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            events = [json.loads(l) for l in f if '"event"' in l]
        self.assertEqual(len(events), 1, events)
        self.assertEqual(events[0]["event"], "restart")
        self.assertEqual(events[0]["restart_count"], 1)
        self.assertEqual(events[0]["cause"], "rank failed")
        self.assertEqual(events[0]["world_size"], 2)
        self.assertIn("rank 1 on", events[0]["reason"])


class TrainingSurvives(test_worker.WorkerTest):
    STEPS = 300
    worker_pids = test_worker.PeerDeath.worker_pids

    def metrics(self, logs):
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            return [json.loads(l) for l in f]

    def seeded(self, name):
        seed = int(os.environ.get("DSLAUNCH_TEST_SEED", time.time_ns() % 100000))
        print("%s: seed %d" % (name, seed))
        return seed, random.Random(seed)

    def uninterrupted(self):
        """rank 0's loss at each step of a run that never failed."""
        return {r["step"]: r["loss"] for r in
                self.train(3, 4, 2, steps=self.STEPS) if r["rank"] == 0}

    def finish_faulty(self, job, seed):
        """Waits for the job; its stderr. It must have ended 0."""
        job.wait(timeout=120)
        job.err.seek(0)
        err = job.err.read().decode()
        self.assertEqual(job.returncode, 0, "seed %d: %s" % (seed, err[-3000:]))
        return err

    def assert_resumed_exactly(self, job, whole, seed):
        """One restart; the generation after it resumed from a complete
        checkpoint (every 10 steps; none yet: step 1), ran every step from
        there to the last, each with the uninterrupted run's loss, bit for
        bit; and no rank is left."""
        records = self.metrics(job.logs)
        restarts = [r for r in records if r.get("event") == "restart"]
        self.assertEqual(len(restarts), 1, restarts)
        after = records[records.index(restarts[0]) + 1:]
        resumed = {r["step"]: r["loss"] for r in after if r.get("rank") == 0}
        first = min(resumed)
        self.assertEqual((first - 1) % 10, 0, sorted(resumed))
        self.assertEqual(sorted(resumed), list(range(first, self.STEPS + 1)))
        for step, loss in resumed.items():
            self.assertEqual(loss, whole[step], "seed %d step %d" % (seed, step))  # every bit
        self.assertEqual(self.worker_pids(), {})

    def test_a_rank_killed_at_a_random_moment_costs_no_training(self):
        seed, rng = self.seeded("test_a_rank_killed_at_a_random_moment_costs_no_training")
        whole = self.uninterrupted()
        job = self.start_faulty(self.STEPS)
        # metrics.jsonl is written about once a second (some 50 steps here):
        # the kill lands at some step past this one.
        self.wait_for_step(job, rng.randint(5, self.STEPS // 2))
        victim = rng.randint(0, 2)
        os.kill(self.worker_pids()[victim], signal.SIGKILL)
        err = self.finish_faulty(job, seed)
        self.assertIn("killed by SIGKILL; stopping every rank, then restart 1 of 2", err)
        self.assert_resumed_exactly(job, whole, seed)

    def agent_pid(self, job, node):
        """The pid of `job`'s dsagent for `node` (a child of the launcher)."""
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/stat" % pid) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if (ppid == job.pid and os.path.basename(argv[0]) == b"dsagent" and
                    b"--node_rank" in argv and
                    argv[argv.index(b"--node_rank") + 1] == str(node).encode()):
                return int(pid)
        return None

    def start_faulty(self, steps, extra=(), micro=4, accumulation=1):
        """dsworker on 3 local nodes, checkpoints every 10 steps in
        job.ck; its metrics in job.logs, its stdout and stderr in the files
        job.out and job.err."""
        job_ck = os.path.join(self.dir, "ck")
        logs = os.path.join(self.dir, "logs-faulty")
        stdout = open(os.path.join(self.dir, "stdout"), "w+b")
        stderr = open(os.path.join(self.dir, "stderr"), "w+b")
        self.addCleanup(stdout.close)
        self.addCleanup(stderr.close)
        job = subprocess.Popen(self.args(nodes=3, slots=1) + [
            "--max_restarts", "2", "--restart_backoff", "0", "--log_dir", logs, *extra,
            test_worker.DSWORKER, "train", "--config",
            self.config(micro, 2, steps=steps, accumulation=accumulation,
                        checkpoint={"dir": job_ck, "every": 10})],
            stdout=stdout, stderr=stderr, env=self.env(OMP_NUM_THREADS="1"))
        self.addCleanup(lambda: job.poll() is None and job.kill())
        job.logs, job.out, job.err, job.ck = logs, stdout, stderr, job_ck
        return job

    def kill_node1_twice(self, job):
        """Kills node 1's agent, waits for the next generation to train with
        its new agent, and kills that one too."""
        os.kill(self.agent_pid(job, 1), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            restarted = [r for r in self.metrics(job.logs) if r.get("event") == "restart"]
            pid = self.agent_pid(job, 1)
            if restarted and pid:
                break
            self.assertIsNone(job.poll())
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    def wait_for_step(self, job, step):
        metrics = os.path.join(job.logs, "metrics.jsonl")
        deadline = time.monotonic() + 60
        while self.steps_seen(metrics) < step:
            self.assertIsNone(job.poll(), "the job ended before step %d" % step)
            self.assertLess(time.monotonic(), deadline, "training did not get there")
            time.sleep(0.005)

    def test_an_agent_killed_at_a_random_moment_is_started_again(self):
        seed, rng = self.seeded("test_an_agent_killed_at_a_random_moment_is_started_again")
        whole = self.uninterrupted()
        job = self.start_faulty(self.STEPS)
        self.wait_for_step(job, rng.randint(5, self.STEPS // 2))
        node = rng.randint(0, 2)
        os.kill(self.agent_pid(job, node), signal.SIGKILL)
        err = self.finish_faulty(job, seed)
        self.assertIn("node %d (127.0.0.%d) was lost" % (node, node + 1), err)
        self.assertIn("starting the agent of node %d (127.0.0.%d) again" % (node, node + 1),
                      err)
        self.assertIn("node %d (127.0.0.%d) is back" % (node, node + 1), err)
        self.assert_resumed_exactly(job, whole, seed)

    def test_a_node_lost_twice_within_the_cooldown_ends_the_job_with_69(self):
        job = self.start_faulty(100000)
        self.wait_for_step(job, 3)
        self.kill_node1_twice(job)
        job.wait(timeout=60)
        job.err.seek(0)
        err = job.err.read().decode()
        self.assertEqual(job.returncode, 69, err[-3000:])
        self.assertIn("not enough nodes: excluded for --node_cooldown 600 s (lost twice "
                      "within it): 127.0.0.2", err)
        self.assertEqual(self.worker_pids(), {})

    def generations_of(self, records):
        """[(world_size, {step: rank 0's loss})] per generation, in order."""
        gens = [[3, {}]]
        for r in records:
            if r.get("event") == "restart":
                gens.append([r["world_size"], {}])
            elif r.get("rank") == 0 and "loss" in r:
                gens[-1][1][r["step"]] = r["loss"]
        return gens

    def resumed_at(self, ck, world, first, last):
        """rank 0's losses of a run at `world` nodes that resumes from the
        checkpoint of step first - 1 and trains to `last`."""
        start = os.path.join(ck, "step_%08d" % (first - 1))
        self.assertTrue(os.path.exists(os.path.join(start, "COMPLETE")), start)
        records = self.train(world, 2, 2, steps=last, accumulation=2, checkpoint={
            "dir": os.path.join(self.dir, "ck-again-%d" % first), "every": 10 ** 6,
            "resume": start})
        return {r["step"]: r["loss"] for r in records
                if r.get("rank") == 0 and "loss" in r}

    def test_the_job_shrinks_to_two_nodes_and_grows_back_keeping_the_global_batch(self):
        """--num_nodes 2:3: node 1 lost twice within --node_cooldown is left
        out, the job goes on with 2 nodes (the global batch kept through the
        accumulation steps) and grows back to 3 when the cooldown ends. Each
        generation's losses equal those of a run started at its world size
        from the checkpoint it resumed from, bit for bit."""
        steps = 1500
        job = self.start_faulty(steps, micro=2, accumulation=2, extra=[
            "--num_nodes", "2:3", "--join_settle", "3", "--rejoin_timeout", "2",
            "--node_cooldown", "6"])
        self.wait_for_step(job, 5)
        self.kill_node1_twice(job)
        job.wait(timeout=180)
        job.err.seek(0)
        err = job.err.read().decode()
        self.assertEqual(job.returncode, 0, err[-3000:])
        self.assertIn("node 1 (127.0.0.2) is back", err)
        self.assertIn("2 nodes (127.0.0.1, 127.0.0.3), 2 ranks (was 3)", err)
        self.assertIn("node 1 (127.0.0.2) stands by: the job grows from 2 to 3 nodes",
                      err)
        self.assertIn("which grows the job (no restart of --max_restarts spent)", err)
        gens = self.generations_of(self.metrics(job.logs))
        self.assertEqual([g[0] for g in gens], [3, 3, 2, 3], err[-3000:])
        job.out.seek(0)
        out = job.out.read().decode()
        self.assertIn("keeping the checkpoint's global batch 12 at world size 2: "
                      "gradient_accumulation_steps 3 (was 2)", out)
        # The generations at 2 and (again) at 3 nodes, each against a run
        # started at its size from its own first checkpoint.
        for world, losses in gens[2:]:
            first, last = min(losses), max(losses)
            self.assertEqual(sorted(losses), list(range(first, last + 1)))
            again = self.resumed_at(job.ck, world, first, last)
            for step in range(first, last + 1):
                self.assertEqual(losses[step], again[step],
                                 "world %d step %d" % (world, step))  # every bit
        self.assertEqual(max(gens[-1][1]), steps)
        self.assertEqual(self.worker_pids(), {})

    @staticmethod
    def steps_seen(metrics):
        try:
            with open(metrics) as f:
                lines = f.read().split("\n")[:-1]
        except FileNotFoundError:
            return 0
        steps = [json.loads(l).get("step", 0) for l in lines if l]
        return max(steps, default=0)
