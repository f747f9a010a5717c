"""Integration tests: a 3-node x 2-rank job on 127.0.0.1-3 through
--launcher local. Every test checks that no rank process is left behind."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

from harness import BIN, DSLAUNCH, PY, RANK_PY, LaunchTest

CONTRACT = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE",
            "NODE_RANK", "GROUP_RANK", "CROSS_RANK", "CROSS_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE",
            "DSLAUNCH_JOB_ID", "DSLAUNCH_PROGRESS", "DSLAUNCH_STORE",
            "USER_VAR", "INHERITED_VAR"]


class EnvContract(LaunchTest):
    def test_every_rank_gets_the_contract(self):
        hostile = ["a b", "'q'", '"dq"', "$(touch /tmp/pwned)", "`id`", "*", "line\nbreak", ""]
        p = self.run_job(self.args(extra=["--env", "USER_VAR=x y=z", "--master_port", "29611"])
                         + [PY, RANK_PY, "env", *hostile],
                         ENV_KEYS=json.dumps(CONTRACT), INHERITED_VAR="from-launcher")
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        job_ids = set()
        for rank in range(6):
            with open(os.path.join(self.out, "env-%d.json" % rank)) as f:
                env = json.load(f)
            with open(os.path.join(self.out, "argv-%d.json" % rank)) as f:
                self.assertEqual(json.load(f), hostile)
            node, local = divmod(rank, 2)
            expect = {"RANK": rank, "LOCAL_RANK": local, "WORLD_SIZE": 6,
                      "LOCAL_WORLD_SIZE": 2, "LOCAL_SIZE": 2, "NODE_RANK": node,
                      "GROUP_RANK": node, "CROSS_RANK": node, "CROSS_SIZE": 3,
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29611,
                      "CUDA_VISIBLE_DEVICES": "0,1", "PYTHONUNBUFFERED": 1,
                      "TORCHELASTIC_RESTART_COUNT": 0, "USER_VAR": "x y=z",
                      "INHERITED_VAR": "from-launcher"}
            for k, v in expect.items():
                self.assertEqual(env[k], str(v), "rank %d %s" % (rank, k))
            self.assertTrue(env["DSLAUNCH_PROGRESS"].endswith("/p%d.sock" % rank))
            self.assertTrue(env["DSLAUNCH_STORE"].startswith("unix:/"))
            self.assertTrue(env["TORCHELASTIC_ERROR_FILE"])
            job_ids.add(env["DSLAUNCH_JOB_ID"])
        self.assertEqual(len(job_ids), 1)
        self.assertFalse(os.path.exists("/tmp/pwned"))

    def test_env_files_and_deepspeed_env_reach_every_rank(self):
        env_file = os.path.join(self.dir, "job.env")
        with open(env_file, "w") as f:
            f.write("# job settings\nexport FROM_FILE='a b'\nUSER_VAR=file\n")
        with open(os.path.join(self.dir, ".deepspeed_env"), "w") as f:
            f.write("FROM_DS=\"x\\\"y\"\n")
        keys = ["FROM_FILE", "FROM_DS", "USER_VAR"]
        p = subprocess.run(self.args(nodes=2, slots=1, extra=["--env_file", env_file,
                                                              "--env", "USER_VAR=flag"])
                           + [PY, RANK_PY, "env"], capture_output=True, timeout=60,
                           cwd=self.dir, env=self.env(ENV_KEYS=json.dumps(keys)))
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        for rank in range(2):
            with open(os.path.join(self.out, "env-%d.json" % rank)) as f:
                env = json.load(f)
            env.pop("__address__")
            self.assertEqual(env, {"FROM_FILE": "a b", "FROM_DS": 'x"y', "USER_VAR": "flag"})

    def test_bad_env_file_names_the_line_and_exits_65(self):
        env_file = os.path.join(self.dir, "bad.env")
        with open(env_file, "w") as f:
            f.write("A=1\nnot a var\n")
        p = self.run_job(self.args(extra=["--env_file", env_file]) + ["true"])
        self.assertEqual(p.returncode, 65)
        self.assertIn(env_file + ":2: expected KEY=VALUE", p.stderr.decode())

    def test_local_rank_flag_is_appended_unless_disabled(self):
        argv = [a for a in self.args(nodes=1, slots=2) if a != "--no_local_rank"]
        p = self.run_job(argv + [PY, RANK_PY, "env", "x"], ENV_KEYS="[]")
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        for rank in range(2):
            with open(os.path.join(self.out, "argv-%d.json" % rank)) as f:
                self.assertEqual(json.load(f), ["x", "--local_rank=%d" % rank])

    def test_store_rendezvous_across_all_ranks(self):
        probe = os.path.join(os.path.dirname(DSLAUNCH), "store_probe")
        p = self.run_job(self.args() + [probe])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        out = p.stdout.decode()
        arrived = sorted(int(m) for m in re.findall(r"arrived=(\d+)", out))
        self.assertEqual(arrived, [1, 2, 3, 4, 5, 6])


class Collectives(LaunchTest):
    def test_gloo_comm_rendezvous_through_the_store(self):
        probe = os.path.join(os.path.dirname(DSLAUNCH), "comm_probe")
        for nodes, slots in [(3, 1), (2, 2)]:
            with self.subTest(shape="%dx%d" % (nodes, slots)):
                p = self.run_job(self.args(nodes=nodes, slots=slots) + [probe], timeout=120)
                self.assertEqual(p.returncode, 0, p.stderr.decode())
                world = nodes * slots
                for r in range(world):
                    self.assertIn("comm ok %d/%d" % (r, world), p.stdout.decode())


class FailFast(LaunchTest):
    def fail_job(self, how, victim=3):
        return self.run_job(self.args(extra=["--kill_grace", "5"]) +
                            [PY, RANK_PY, "fail", str(victim), how], timeout=50)

    def test_first_failure_stops_every_rank_fast_and_exits_with_its_code(self):
        p = self.fail_job("exit7")
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 7, err)
        # The other ranks sleep 60 s; the whole job must be over long before.
        self.assertLess(p.elapsed, 10, err)
        self.assertIn("FAILED: rank 3 on 127.0.0.2", err)
        self.assertIn("exited with code 7", err)
        self.assertIn("| rank 3 about to fail with exit7", err)
        self.assertIn("stopped in consequence: 5 ranks", err)
        self.assertIn("SIGTERM", err)

    def test_exit_codes_for_exit_n_and_signals(self):
        cases = {"exit3": 3, "exit42": 42, "SIGSEGV": 139, "SIGKILL": 137,
                 "SIGTERM": 143, "SIGABRT": 134, "SIGINT": 130, "SIGBUS": 135}
        for how, code in cases.items():
            with self.subTest(how=how):
                for name in os.listdir(self.out):
                    os.unlink(os.path.join(self.out, name))
                p = self.fail_job(how, victim=5)
                err = p.stderr.decode()
                self.assertEqual(p.returncode, code, err)
                if how.startswith("SIG"):
                    self.assertIn("was killed by " + how, err)
                self.assert_no_leftovers()

    def test_missing_program_exits_127_with_reason(self):
        p = self.run_job(self.args(nodes=1, slots=1) + ["/nonexistent/prog"])
        self.assertEqual(p.returncode, 127)
        self.assertIn("cannot execute '/nonexistent/prog'", p.stderr.decode())


class Interrupts(LaunchTest):
    def test_ctrl_c_stops_gracefully_with_130(self):
        job = self.start_job(self.args() + [PY, RANK_PY, "sleep"])
        self.wait_started(6)
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=20)
        self.assertEqual(job.returncode, 130, err.decode())
        self.assertIn("interrupted by the user (SIGINT)", err.decode())

    def test_second_ctrl_c_kills_at_once(self):
        # --no_fold: one "ignoring SIGTERM" line per rank to count.
        job = self.start_job(self.args(extra=["--kill_grace", "30", "--no_fold"]) +
                             [PY, RANK_PY, "sleep", "ignore-term"])
        self.wait_started(6)
        job.send_signal(signal.SIGINT)
        # Every rank got SIGTERM and ignored it (the launcher said it is
        # stopping); inside the 30 s grace the job must still run.
        self.read_until(job, "stderr", r"again to kill at once")
        self.read_until(job, "stdout", r"ignoring SIGTERM$", count=6)
        self.assertIsNone(job.poll(), "ranks ignore SIGTERM: the job must still run")
        start = time.monotonic()
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=20)
        err = self.seen(job, "stderr") + err
        self.assertLess(time.monotonic() - start, 10)
        self.assertEqual(job.returncode, 130, err.decode())
        self.assertIn("SIGKILL", err.decode())

    def test_launcher_sigkill_leaves_no_orphans(self):
        job = self.start_job(self.args() + [PY, RANK_PY, "sleep"])
        self.wait_started(6)
        job.kill()
        job.communicate(timeout=10)
        self.assert_no_leftovers(within=5.0)


class AgentLoss(LaunchTest):
    def test_killed_agent_takes_its_workers_and_the_job_fails_69(self):
        job = self.start_job(self.args() + [PY, RANK_PY, "sleep"])
        self.wait_started(6)
        # Rank 2 runs on node 1; its parent is node 1's agent.
        os.kill(self.agent_of_rank(2), signal.SIGKILL)
        out, err = job.communicate(timeout=30)
        self.assertEqual(job.returncode, 69, err.decode())
        self.assertIn("FAILED: node 1 (127.0.0.2) was lost", err.decode())


    def agent_of_rank(self, rank):
        with open(os.path.join(self.out, "start-%d" % rank)) as f:
            rank_pid = int(f.read().split()[1])
        with open("/proc/%d/stat" % rank_pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    def test_silent_agent_is_lost_after_the_heartbeat_timeout(self):
        hb = ["--heartbeat_interval", "0.2", "--heartbeat_timeout", "1", "--kill_grace", "1"]
        job = self.start_job(self.args(extra=hb) + [PY, RANK_PY, "sleep"])
        self.wait_started(6)
        agent = self.agent_of_rank(4)
        os.kill(agent, signal.SIGSTOP)
        try:
            out, err = job.communicate(timeout=30)
        finally:
            try:
                os.kill(agent, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.assertEqual(job.returncode, 69, err.decode())
        self.assertIn("node 2 (127.0.0.3) was lost", err.decode())
        self.assertIn("no heartbeat", err.decode())

    def test_nodes_waiting_for_node_0_stay_connected_past_the_heartbeat_timeout(self):
        # Every node's JobSpec waits for node 0 (its free port is MASTER_PORT):
        # node 0's agent here starts 2.5 s late, longer than the 1 s timeout.
        wrapper = os.path.join(self.dir, "slow-node0-agent")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\ncase " $* " in *" --node_rank 0 "*) sleep 2.5;; esac\n'
                    'exec %s "$@"\n' % os.path.join(BIN, "dsagent"))
        os.chmod(wrapper, 0o755)
        hb = ["--heartbeat_interval", "0.2", "--heartbeat_timeout", "1",
              "--agent_path", wrapper]
        p = self.run_job(self.args(extra=hb) + [PY, RANK_PY, "env"], timeout=60,
                         ENV_KEYS='["MASTER_PORT"]')
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(len(self.started_pids()), 6)

    def test_agents_stop_their_ranks_when_the_launcher_goes_silent(self):
        hb = ["--heartbeat_interval", "0.2", "--heartbeat_timeout", "1"]
        job = self.start_job(self.args(extra=hb) + [PY, RANK_PY, "sleep"])
        self.wait_started(6)
        job.send_signal(signal.SIGSTOP)
        try:
            self.assert_no_leftovers(within=10)
        finally:
            job.kill()
            job.communicate(timeout=10)


class Output(LaunchTest):
    def test_no_line_lost_duplicated_or_torn(self):
        n = 20000
        p = self.run_job(self.args(extra=["--log_dir", os.path.join(self.dir, "logs")]) +
                         [PY, RANK_PY, "spam", str(n)], timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-2000:])
        pattern = re.compile(rb"^\[127\.0\.0\.(\d):(\d)\] rank (\d) line (\d+) (x*)$")
        seen = {r: set() for r in range(6)}
        for stream in (p.stdout, p.stderr):
            for line in stream.splitlines():
                if line.startswith(b"dslaunch:"):
                    continue
                m = pattern.match(line)
                self.assertIsNotNone(m, line[:200])
                host, prefix_rank, rank, i, xs = m.groups()
                self.assertEqual(prefix_rank, rank)
                self.assertEqual(int(host), int(rank) // 2 + 1)
                self.assertEqual(len(xs), int(i) % 50)
                self.assertNotIn(int(i), seen[int(rank)], "duplicate line")
                seen[int(rank)].add(int(i))
        for r in range(6):
            self.assertEqual(len(seen[r]), n, "rank %d" % r)
            with open(os.path.join(self.dir, "logs", "rank-%d.log" % r), "rb") as f:
                self.assertEqual(len(f.read().splitlines()), n)

    def test_last_words_of_a_killed_rank_reach_console_and_log(self):
        logs = os.path.join(self.dir, "logs")
        p = self.run_job(self.args(nodes=1) + ["--log_dir", logs, PY, RANK_PY, "last_words"])
        self.assertEqual(p.returncode, 137)
        out = p.stdout.decode()
        self.assertIn("[127.0.0.1:1] first words\n", out)
        self.assertIn("[127.0.0.1:1] last words without newline\n", out)
        with open(os.path.join(logs, "rank-1.log")) as f:
            self.assertEqual(f.read(), "first words\nlast words without newline")
        self.assertIn("| last words without newline", p.stderr.decode())


class Progress(LaunchTest):
    def test_records_reach_metrics_and_garbage_does_not_stop_the_job(self):
        logs = os.path.join(self.dir, "logs")
        p = self.run_job(self.args() + ["--log_dir", logs, PY, RANK_PY, "progress", "5"])
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        with open(os.path.join(logs, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        self.assertEqual(len(records), 30)
        for rec in records:
            self.assertEqual(rec["node"], "127.0.0.%d" % (rec["rank"] // 2 + 1))
            self.assertGreater(rec["time"], 1.6e9)
            self.assertEqual(rec["loss"], 1.0 / (rec["step"] + 1))
        self.assertEqual(sorted({(r["rank"], r["step"]) for r in records}),
                         [(r, s) for r in range(6) for s in range(5)])
        self.assertIn("rank 0: 3 malformed progress record(s) dropped", err)
        self.assertIn("[127.0.0.1:0 progress] step 4", err)


class HostileClients(LaunchTest):
    def test_garbage_and_oversized_frames_are_rejected_and_the_job_goes_on(self):
        import socket
        import struct
        job = self.start_job(self.args(extra=["--log_level", "info"]) + [PY, RANK_PY, "sleep"])
        text = self.read_until(job, "stderr", r"control server on port \d+")
        port = int(re.search(r"control server on port (\d+)", text).group(1))
        self.wait_started(6)
        payloads = [b"GET / HTTP/1.0\r\n\r\n", struct.pack(">I", 1 << 30) + b"x",
                    struct.pack(">I", 5) + b"\xff\xff\xff\xff\xff",
                    struct.pack(">I", 0)]
        for data in payloads:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(data)
                s.settimeout(5)
                self.assertEqual(s.recv(100), b"", "the launcher must close the connection")
        # Each bad client was dealt with: the launcher closed its connection.
        self.assertIsNone(job.poll(), "bad clients must not end the job")
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=20)
        self.assertEqual(job.returncode, 130)
        err = (self.seen(job, "stderr") + err).decode()
        # Rejections are summarised (one line per 10 s), not one line each.
        counts = re.findall(r"rejected (\d+) unauthenticated", err)
        self.assertGreaterEqual(sum(int(n) for n in counts), 4, err)


class Usage(LaunchTest):
    def test_hostfile_error_names_file_and_line_and_exits_65(self):
        path = os.path.join(self.dir, "bad.txt")
        with open(path, "w") as f:
            f.write("# ok\n127.0.0.1 slots=2\n127.0.0.2 slot=2\n")
        p = self.run_job([DSLAUNCH, "-H", path, "true"])
        self.assertEqual(p.returncode, 65)
        self.assertIn(path + ":3:", p.stderr.decode())

    def test_missing_hostfile_is_an_error_not_a_local_run(self):
        p = self.run_job([DSLAUNCH, "-H", os.path.join(self.dir, "nope"), "true"])
        self.assertEqual(p.returncode, 65)
        self.assertIn("nope", p.stderr.decode())

    def test_bad_include_exits_64(self):
        p = self.run_job([DSLAUNCH, "-H", self.hostfile(), "-i", "127.0.0.2:7", "true"])
        self.assertEqual(p.returncode, 64)
        self.assertIn("--include", p.stderr.decode())

    def test_dry_run_prints_the_rank_table(self):
        p = self.run_job([DSLAUNCH, "-H", self.hostfile(), "-i", "127.0.0.2@127.0.0.3:1",
                          "--dry-run", "true"])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        rows = [l.split() for l in p.stdout.decode().splitlines()[1:-1]]
        self.assertEqual(rows, [["127.0.0.2", "0", "0", "0", "0"],
                                ["127.0.0.2", "0", "1", "1", "1"],
                                ["127.0.0.3", "1", "0", "2", "1"]])

    def test_help_lists_deepspeed_flags(self):
        p = self.run_job([DSLAUNCH, "--help"])
        self.assertEqual(p.returncode, 0)
        for flag in ["--hostfile", "--include", "--exclude", "--num_nodes", "--num_gpus",
                     "--master_addr", "--master_port", "--launcher", "--no_local_rank",
                     "--kill_grace", "--log_dir", "--env", "--dry-run"]:
            self.assertIn(flag, p.stdout.decode())

    def test_missing_agent_fails_69_naming_the_node(self):
        p = self.run_job(self.args(extra=["--agent_path", "/nonexistent/dsagent"]) + ["true"])
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 69, err)
        self.assertIn("was lost: its agent exited with code 127 before connecting", err)

    def test_no_program_is_usage_error(self):
        p = self.run_job([DSLAUNCH, "-H", self.hostfile()])
        self.assertEqual(p.returncode, 64)


if __name__ == "__main__":
    unittest.main()
