"""Watching a running job (issue 12): the console's modes, the live table on a
real terminal (tmux), folded lines, hangs, Python error files and the failure
bundle. Local launcher, 127.0.0.1-3 as nodes."""
import json
import os
import re
import shutil
import subprocess
import time
import unittest

from harness import DSLAUNCH, PY, SYSTEM_PY, LaunchTest

PROGRESS_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progress_rank.py")


def need_tool(test, tool):
    if shutil.which(tool) is None:
        if os.environ.get("CI"):
            test.fail(tool + " is missing")
        test.skipTest(tool + " is not installed")


class ConsoleModes(LaunchTest):
    def test_lines_mode_shows_each_record_once_and_folds_identical_lines(self):
        p = self.run_job(self.args(nodes=3, slots=2) + [PY, PROGRESS_PY, "train", "3", "0.05"])
        out, err = p.stdout.decode(), p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertNotIn("\x1b", out + err, "no escape codes when not on a terminal")
        # Rank 0's records, each once, on stderr.
        for step in (1, 2, 3):
            self.assertEqual(err.count("[127.0.0.1:0 progress] step %d " % step), 1, err)
        self.assertNotIn(":1 progress]", err)
        # 6 ranks x 3 identical lines: folded, every rank in some group of each round.
        lines = [l for l in out.splitlines() if l.endswith("same text on every rank")]
        self.assertLess(len(lines), 18, out)
        self.assertTrue(any(l.startswith("[127.0.0.1:0-1,127.0.0.2:2-3,127.0.0.3:4-5] ")
                            for l in lines) or len(lines) < 12, out)
        counted = 0
        for l in lines:
            prefix = l.split("] ")[0] + "]"
            for part in prefix.strip("[]").split(","):
                ranks = part.split(":")[-1]
                lo, _, hi = ranks.partition("-")
                counted += int(hi or lo) - int(lo) + 1
        self.assertEqual(counted, 18, out)

    def test_no_fold_shows_every_rank_line(self):
        p = self.run_job(self.args(nodes=3, slots=2, extra=["--no_fold"]) +
                         [PY, PROGRESS_PY, "train", "2", "0.05"])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        lines = [l for l in p.stdout.decode().splitlines() if l.endswith("same text on every rank")]
        self.assertEqual(len(lines), 12, p.stdout.decode())

    def test_rank0_mode_shows_only_rank_0(self):
        p = self.run_job(self.args(nodes=2, slots=2, extra=["--console", "rank0"]) +
                         [PY, PROGRESS_PY, "train", "2", "0.05"])
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(out.count("[127.0.0.1:0] same text on every rank"), 2, out)
        self.assertNotIn(":1]", out)
        self.assertNotIn("127.0.0.2", out)

    def test_none_mode_shows_no_rank_output_but_the_report(self):
        log_dir = os.path.join(self.dir, "logs")
        p = self.run_job(self.args(nodes=2, slots=1, extra=["--console", "none", "--log_dir", log_dir]) +
                         [PY, PROGRESS_PY, "train", "2", "0.05"])
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(p.stdout.decode(), "")
        self.assertNotIn("progress]", p.stderr.decode())
        self.assertIn("exited 0", p.stderr.decode())
        with open(os.path.join(log_dir, "rank-1.log")) as f:
            self.assertEqual(f.read().count("same text on every rank"), 2)

    def test_a_nan_loss_keeps_its_record(self):
        # json.dumps writes NaN and Infinity, which JSON does not have.
        script = ("import json, math, os, socket; s = socket.socket(socket.AF_UNIX); "
                  "s.connect(os.environ['DSLAUNCH_PROGRESS']); "
                  "s.sendall((json.dumps({'step': 3, 'loss': math.nan, 'grad_norm': math.inf})"
                  " + '\\n').encode())")
        log_dir = os.path.join(self.dir, "logs")
        p = self.run_job(self.args(nodes=1, slots=1, extra=["--log_dir", log_dir]) +
                         [PY, "-c", script])
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("[127.0.0.1:0 progress] step 3  loss NaN  grad_norm Infinity", err)
        self.assertNotIn("malformed", err)
        with open(os.path.join(log_dir, "metrics.jsonl")) as f:
            record = json.loads(f.readline())
        self.assertEqual((record["step"], record["loss"], record["grad_norm"]), (3, "NaN", "Infinity"))

    def test_table_asked_without_a_terminal_falls_back_to_lines(self):
        p = self.run_job(self.args(nodes=1, slots=1, extra=["--console", "table"]) +
                         [PY, PROGRESS_PY, "train", "1", "0.01"])
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("--console table needs stderr to be a terminal; showing lines instead", err)
        self.assertIn("[127.0.0.1:0 progress] step 1 ", err)


class LiveTable(LaunchTest):
    """The table through a real pseudo-terminal: tmux runs dslaunch."""

    def setUp(self):
        super().setUp()
        need_tool(self, "tmux")
        self.session = "dsl-observe-%d" % os.getpid()
        self.sock = os.path.join(self.dir, "tmux.sock")

    def tearDown(self):
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True)
        super().tearDown()

    def capture(self, history=False):
        """The screen, or with `history` everything written (scrolled off too)."""
        extra = ["-S", "-"] if history else []
        return subprocess.run(["tmux", "-S", self.sock, "capture-pane", "-p", *extra,
                               "-t", self.session], capture_output=True, text=True).stdout

    def wait_screen(self, predicate, timeout=20):
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.capture()
            if predicate(screen):
                return screen
            time.sleep(0.1)
        self.fail("the screen never showed it; last:\n" + screen)

    def start_in_tmux(self, argv, width=100):
        done = os.path.join(self.dir, "exit-status")
        command = " ".join("'%s'" % a for a in argv) + "; echo $? > " + done + "; sleep 60"
        env = dict(self.env(), LANG="C.UTF-8", TERM="xterm-256color")
        subprocess.run(["tmux", "-S", self.sock, "new-session", "-d", "-s", self.session,
                        "-x", str(width), "-y", "40", command], check=True, env=env)
        return done

    def test_table_is_redrawn_in_place_below_the_output(self):
        done = self.start_in_tmux(self.args(nodes=3, slots=2) +
                                  [PY, PROGRESS_PY, "train", "40", "0.1", "5", "3"])
        # Every node's row has a step (rows fill as each node's first record
        # comes: under load one may lag the ETA by a redraw or two).
        screen = self.wait_screen(
            lambda s: "ETA" in s and
            len(re.findall(r"^ 127\.0\.0\.[123] .* \d+/40 ", s, re.M)) == 3)
        lines = screen.rstrip("\n").splitlines()
        header = [i for i, l in enumerate(lines) if l.split()[:3] == ["node", "ranks", "step"]]
        self.assertEqual(len(header), 1, screen)  # drawn in place, never twice
        rows = lines[header[0] + 1:header[0] + 4]
        self.assertEqual([r.split()[0] for r in rows], ["127.0.0.1", "127.0.0.2", "127.0.0.3"], screen)
        self.assertEqual([r.split()[1] for r in rows], ["0-1", "2-3", "4-5"], screen)
        self.assertRegex(rows[0], r" \d+/40 ", screen)
        self.assertIn("%", lines[header[0] + 4])
        # Output scrolls above the table.
        self.assertIn("same text on every rank", "\n".join(lines[:header[0]]))
        for l in lines:
            self.assertLess(len(l), 100, l)
        # Rank 5 is three times slower: a straggler, named once and marked.
        self.wait_screen(lambda s: "slow" in s)
        history = self.capture(history=True)
        self.assertEqual(history.count("STRAGGLER: rank 5"), 1, history)
        self.assertNotIn("STRAGGLER: rank 0", history)
        # At the end the final table stays, then the report.
        deadline = time.monotonic() + 40
        while not os.path.exists(done):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.1)
        with open(done) as f:
            self.assertEqual(f.read().strip(), "0")
        screen = self.capture(history=True)
        headers = re.findall(r"^ node +ranks +step", screen, re.M)
        self.assertEqual(len(headers), 1, screen)  # erased each time, drawn once at the end
        self.assertRegex(screen, r"40/40 .*done")
        self.assertIn("100%", screen)
        self.assertLess(re.search(r"^ node +ranks", screen, re.M).start(),
                        screen.index("exited 0"), screen)

    def test_stdout_through_a_pipe_gets_lines_not_the_table(self):
        # `dslaunch ... | cat`: cat writes to the screen between redraws.
        done = os.path.join(self.dir, "exit-status")
        argv = self.args(nodes=1, slots=2, extra=["--console", "table"]) + [
            PY, PROGRESS_PY, "train", "5", "0.05"]
        command = " ".join("'%s'" % a for a in argv) + " | cat; echo $? > " + done + "; sleep 60"
        env = dict(self.env(), LANG="C.UTF-8", TERM="xterm-256color")
        subprocess.run(["tmux", "-S", self.sock, "new-session", "-d", "-s", self.session,
                        "-x", "100", "-y", "40", command], check=True, env=env)
        deadline = time.monotonic() + 30
        while not os.path.exists(done):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.1)
        screen = self.capture(history=True)
        self.assertIn("needs stdout on the same terminal, in a file or /dev/null", screen)
        self.assertNotRegex(screen, r"^ node +ranks", screen)
        self.assertIn("[127.0.0.1:0 progress] step 5 ", screen)

    def test_all_shows_a_row_per_rank(self):
        self.start_in_tmux(self.args(nodes=2, slots=2, extra=["--console", "all"]) +
                           [PY, PROGRESS_PY, "train", "30", "0.1"])
        screen = self.wait_screen(lambda s: "ETA" in s)
        lines = screen.splitlines()
        header = [i for i, l in enumerate(lines) if l.split()[:2] == ["node", "rank"]][0]
        ranks = [l.split()[1] for l in lines[header + 1:header + 5]]
        self.assertEqual(ranks, ["0", "1", "2", "3"], screen)


class Hangs(LaunchTest):
    def test_silent_rank_is_named_with_its_stacks_and_the_job_goes_on(self):
        log_dir = os.path.join(self.dir, "logs")
        p = self.run_job(self.args(nodes=2, slots=2, extra=["--hang_timeout", "1.5", "--log_dir", log_dir]) +
                         [PY, PROGRESS_PY, "hang", "2", "30", "0.1", "6"], timeout=90)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(err.count("HANG: rank 2 on 127.0.0.2"), 1, err)
        self.assertRegex(err, r"sent no progress record for [\d.]+ s while running \(last at step 3\)")
        self.assertIn("rank 2 on 127.0.0.2 reports progress again", err)
        self.assertIn("hang seen: rank 2", err)
        self.assertNotIn("HANG: rank 0", err)
        # Its stacks: a Python rank sleeping (eu-stack or gdb show the C frames).
        self.assertRegex(err, r"stacks of rank 2 \((eu-stack|gdb|py-spy)\)")
        with open(os.path.join(log_dir, "stacks-rank-2.txt")) as f:
            stacks = f.read()
        self.assertRegex(stacks, r"(?i)(select|sleep|poll|py)")

    def test_on_hang_abort_ends_the_job_with_124_and_a_bundle(self):
        log_dir = os.path.join(self.dir, "logs")
        p = self.run_job(self.args(nodes=2, slots=1, extra=[
            "--hang_timeout", "1", "--on_hang", "abort", "--log_dir", log_dir]) +
            [PY, PROGRESS_PY, "hang", "1", "100", "0.1", "60"], timeout=90)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 124, err)
        self.assertIn("FAILED: HANG: rank 1 on 127.0.0.2", err)
        self.assertIn("stopped by --on_hang abort", err)
        self.assertLess(p.elapsed, 40, err)
        bundle = os.path.join(log_dir, "failure")
        self.assertTrue(os.path.exists(os.path.join(bundle, "stacks-rank-1.txt")), os.listdir(bundle))
        with open(os.path.join(bundle, "report.txt")) as f:
            self.assertIn("FAILED: HANG: rank 1", f.read())


class Failures(LaunchTest):
    def test_torch_error_file_exception_is_in_the_report(self):
        r = subprocess.run([SYSTEM_PY, "-c", "import torch.distributed.elastic.multiprocessing.errors"],
                           capture_output=True)
        if r.returncode != 0:
            if os.environ.get("CI"):
                self.fail("Debian's python3-torch is missing")
            self.skipTest("Debian's python3-torch is not installed")
        p = self.run_job(self.args(nodes=1, slots=2) + [SYSTEM_PY, PROGRESS_PY, "torch_error"], timeout=120)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("its error file (TORCHELASTIC_ERROR_FILE) says:", err)
        self.assertRegex(err, r"exception: RuntimeError: boom from rank \d")
        self.assertIn("raise RuntimeError", err)

    def test_failure_bundle_holds_report_last_lines_plan_and_redacted_env(self):
        log_dir = os.path.join(self.dir, "logs")
        p = self.run_job(self.args(nodes=2, slots=1, extra=["--log_dir", log_dir, "--env", "HF_TOKEN=hf_visible"]) +
                         [PY, os.path.join(os.path.dirname(PROGRESS_PY), "rank.py"), "fail", "1", "exit3"],
                         MY_SERVICE_PASSWORD="hunter2")
        self.assertEqual(p.returncode, 3, p.stderr.decode())
        bundle = os.path.join(log_dir, "failure")
        self.assertIn("for a bug report: " + bundle, p.stderr.decode())
        files = sorted(os.listdir(bundle))
        for name in ("report.txt", "plan.txt", "env.txt", "last-lines.txt"):
            self.assertIn(name, files)
        with open(os.path.join(bundle, "report.txt")) as f:
            self.assertIn("FAILED: rank 1 on 127.0.0.2", f.read())
        with open(os.path.join(bundle, "last-lines.txt")) as f:
            self.assertIn("rank 1 about to fail with exit3", f.read())
        with open(os.path.join(bundle, "plan.txt")) as f:
            self.assertIn("127.0.0.2", f.read())
        with open(os.path.join(bundle, "env.txt")) as f:
            env = f.read()
        self.assertIn("HF_TOKEN=<redacted>", env)
        self.assertIn("MY_SERVICE_PASSWORD=<redacted>", env)
        self.assertNotIn("hunter2", env)
        self.assertNotIn("hf_visible", env)
        self.assertIn("PATH=", env)


if __name__ == "__main__":
    unittest.main()
