"""Bad input to dslaunch's hostfile and flags: the real binary exits 65 (bad
hostfile, naming file:line) or 64 (bad usage, naming the flag) at once,
starts nothing and leaves nothing behind; never a crash, a hang or a silent
"all"."""
import json
import os
import socket
import stat
import threading
import unittest

from harness import DSLAUNCH, PY, RANK_PY, LaunchTest

# Each case must fail fast: before the fix, slots=2147483647 ran out of memory
# and node[0-9999999] expanded to 10M hosts.
FAST = 10


class RefusalCase(LaunchTest):
    """Helpers: run dslaunch and check that it refused, started nothing."""

    def setUp(self):
        super().setUp()
        self.outs = [self.out]

    def started_pids(self):
        """Ranks started by any case of this test (for the leftover check)."""
        pids, current = [], self.out
        for out in self.outs:
            self.out = out
            pids += super().started_pids()
        self.out = current
        return pids

    def fresh_out(self):
        """A new OUT_DIR, so each case's ranks are told apart."""
        self.out = os.path.join(self.dir, "out%d" % len(self.outs))
        os.mkdir(self.out)
        self.outs.append(self.out)

    def write_hostfile(self, data):
        path = os.path.join(self.dir, "hosts.txt")
        with open(path, "wb") as f:
            f.write(data)
        return path

    def rank_program(self):
        return [PY, RANK_PY, "env"]

    def assert_refused(self, argv, code, *needles, **env):
        self.fresh_out()
        out = self.out
        p = self.run_job(argv, timeout=FAST * 3, ENV_KEYS="[]", **env)
        err = p.stderr.decode(errors="replace")
        self.assertEqual(p.returncode, code, err)
        self.assertLess(p.elapsed, FAST, "took %.1f s" % p.elapsed)
        for needle in needles:
            self.assertIn(needle, err)
        self.assertNotIn("Traceback", err)
        self.assertEqual([n for n in os.listdir(out) if n.startswith("start-")],
                         [], "a rank started")
        return err

    def assert_bad_hostfile(self, data, *needles):
        path = self.write_hostfile(data)
        argv = [DSLAUNCH, "--hostfile", path, "--launcher", "local",
                *self.rank_program()]
        return self.assert_refused(argv, 65, *needles)

    def assert_bad_flags(self, flags, *needles):
        argv = [DSLAUNCH, "--hostfile", self.hostfile(1, 1), "--launcher",
                "local", *flags, *self.rank_program()]
        return self.assert_refused(argv, 64, *needles)


class InputTest(RefusalCase):
    # Hostfile: exit 65 naming file:line.

    def test_help_says_usage_once_and_names_program(self):
        p = self.run_job([DSLAUNCH, "--help"])
        self.assertEqual(p.returncode, 0)
        text = p.stdout.decode()
        self.assertEqual(text.lower().count("usage:"), 1, text[:400])
        self.assertIn("usage: dslaunch [options] [--] PROGRAM [ARGS...]", text)
        self.assertIn("--launcher", text)

    def test_huge_slots_is_an_error_naming_the_line_not_an_abort(self):
        err = self.assert_bad_hostfile(b"127.0.0.1\n127.0.0.2 slots=2147483647\n",
                                       "hosts.txt:2: slots must be an integer "
                                       "in 1..1024")
        self.assertNotIn("bad_alloc", err)

    def test_huge_range_is_an_error_naming_the_line(self):
        self.assert_bad_hostfile(b"# site\nnode[0-9999999] slots=8\n",
                                 "hosts.txt:2: malformed range",
                                 "expands to more than 65536 hosts")

    def test_too_many_slots_in_total_is_an_error_naming_the_line(self):
        self.assert_bad_hostfile(b"a[0-1023] slots=1024\nb\n",
                                 "hosts.txt:2: more than 1048576 slots")

    def test_overflowing_numbers_and_bad_keys_name_the_line(self):
        cases = [
            (b"127.0.0.1 slots=99999999999999999999999\n",
             "hosts.txt:1: slots must be an integer in 1..1024"),
            (b"127.0.0.1 max_slots=-1\n",
             "hosts.txt:1: max_slots must be an integer in 1..1024"),
            (b"127.0.0.1\n127.0.0.2 port=70000\n",
             "hosts.txt:2: port must be an integer in 1..65535"),
            (b"127.0.0.1 port=-22\n",
             "hosts.txt:1: port must be an integer in 1..65535"),
            (b"127.0.0.1 user=\n", "hosts.txt:1: empty user"),
            (b"127.0.0.1 user=a;id\n", "hosts.txt:1: invalid user 'a;id'"),
            (b"n[5-1]\n", "hosts.txt:1: malformed range 'n[5-1]': lower bound"),
            (b"r[1-2]n[1[2]]\n", "hosts.txt:1: malformed range 'r[1-2]n[1[2]]': '[' inside"),
        ]
        for data, needle in cases:
            with self.subTest(data=data):
                self.assert_bad_hostfile(data, needle)

    def test_nul_and_control_bytes_are_named_escaped(self):
        err = self.assert_bad_hostfile(b"127.0.0.1\n127.0\x00.0.2\n",
                                       "hosts.txt:2: control character '\\x00' "
                                       "in column 6")
        err = self.assert_bad_hostfile(b"127.0.0.1\x1b]0;pwned\x07\n",
                                       "hosts.txt:1: control character '\\x1b'")
        self.assertNotIn("\x1b", err)

    def test_very_long_line_is_an_error_naming_the_line(self):
        self.assert_bad_hostfile(b"127.0.0.1\n127.0.0.2" + b" " * 70000 + b"\n",
                                 "hosts.txt:2: line is longer than 65536 bytes")

    def test_crlf_hostfile_runs(self):
        path = self.write_hostfile(b"127.0.0.1 slots=1\r\n# two\r\n127.0.0.2\r\n")
        argv = [DSLAUNCH, "--hostfile", path, "--launcher", "local",
                "--no_local_rank", *self.rank_program()]
        p = self.run_job(argv, ENV_KEYS='["WORLD_SIZE"]')
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        with open(os.path.join(self.out, "env-1.json")) as f:
            self.assertEqual(json.load(f)["WORLD_SIZE"], "2")

    # Flags: exit 64 naming the flag.

    def test_nan_inf_negative_and_huge_seconds_are_usage_errors(self):
        cases = [
            ("--kill_grace", "nan"), ("--kill_grace", "inf"),
            ("--kill_grace", "-1"), ("--kill_grace", "1e300"),
            ("--heartbeat_interval", "nan"), ("--heartbeat_interval", "0"),
            ("--heartbeat_timeout", "inf"), ("--start_timeout", "-1"),
            ("--start_timeout", "nan"), ("--ssh_timeout", "nan"),
            ("--ssh_timeout", "0"),
        ]
        for flag, value in cases:
            with self.subTest(flag=flag, value=value):
                self.assert_bad_flags([flag, value], "dslaunch: " + flag +
                                      " must be a number of seconds in")

    def test_out_of_range_integers_are_usage_errors(self):
        cases = [
            ("--num_nodes", "0"), ("--num_nodes", "-1"), ("--num_gpus", "0"),
            ("--num_gpus", "-1"), ("--master_port", "70000"),
            ("--ssh_port", "-1"), ("--ssh_fanout", "0"),
        ]
        for flag, value in cases:
            with self.subTest(flag=flag, value=value):
                self.assert_bad_flags([flag, value],
                                      "dslaunch: %s must be in" % flag,
                                      "got " + value)

    def test_empty_values_are_usage_errors_not_all(self):
        for flag in ("-i", "-e", "--include=", "--master_addr", "--export"):
            with self.subTest(flag=flag):
                flags = [flag] if flag.endswith("=") else [flag, ""]
                name = {"-i": "--include", "-e": "--exclude"}.get(
                    flag, flag.rstrip("="))
                self.assert_bad_flags(flags, "dslaunch: %s: empty value" % name)

    def test_unknown_option_before_program_is_named(self):
        self.assert_bad_flags(["--bogus_flag"], "unknown option '--bogus_flag'")
        self.assert_bad_flags(["--bogus=1"], "unknown option '--bogus'")

    def test_double_dash_runs_a_program_that_starts_with_a_dash(self):
        script = os.path.join(self.dir, "--weird-program")
        with open(script, "w") as f:
            f.write('#!/bin/sh\nexec "%s" "%s" env "$@"\n' % (PY, RANK_PY))
        os.chmod(script, stat.S_IRWXU)
        argv = [DSLAUNCH, "--hostfile", self.hostfile(1, 1), "--launcher",
                "local", "--no_local_rank", "--", "--weird-program", "--x"]
        path = self.dir + os.pathsep + os.environ.get("PATH", "")
        p = self.run_job(argv, ENV_KEYS="[]", PATH=path)
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        with open(os.path.join(self.out, "argv-0.json")) as f:
            self.assertEqual(json.load(f), ["--x"])

    def test_arguments_after_program_are_byte_exact_even_when_flag_like(self):
        args = ["train.py", "--deepspeed", "cfg.json", "-m", "--kill_grace",
                "nan", "-i", "", "--", "--bogus_flag", "caf\u00e9 $(id)"]
        argv = [DSLAUNCH, "--hostfile", self.hostfile(1, 1), "--launcher",
                "local", "--no_local_rank", *self.rank_program(), *args]
        p = self.run_job(argv, ENV_KEYS="[]")
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        with open(os.path.join(self.out, "argv-0.json")) as f:
            self.assertEqual(json.load(f), args)


class PlantedFilesTest(RefusalCase):
    """Files another user planted: env files that would set LD_PRELOAD for
    every rank, directories whose owner would read the ranks' output. Each is
    refused at once with a sentence naming it, and no rank starts."""

    NOBODY = 65534

    def job(self, *flags):
        return [DSLAUNCH, "--hostfile", self.hostfile(1, 1), "--launcher",
                "local", *flags, *self.rank_program()]

    def need_root(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to give a file to another user")

    def theirs(self, name, mode=0o644, directory=False):
        path = os.path.join(self.dir, name)
        if directory:
            os.mkdir(path)
        else:
            with open(path, "w") as f:
                f.write("LD_PRELOAD=/tmp/theirs.so\n")
        os.chmod(path, mode)
        os.chown(path, self.NOBODY, self.NOBODY)
        return path

    def test_a_deepspeed_env_that_is_a_fifo_is_refused_without_hanging(self):
        home = os.path.join(self.dir, "home")
        os.mkdir(home)
        os.mkfifo(os.path.join(home, ".deepspeed_env"))
        self.assert_refused(self.job(), 65, "env file %s/.deepspeed_env: not a "
                            "regular file" % home, HOME=home)

    def test_ds_env_file_dev_zero_is_refused_not_a_crash(self):
        self.assert_refused(self.job(), 65, "env file /dev/zero: not a regular file",
                            DS_ENV_FILE="/dev/zero")

    def test_a_world_writable_env_file_is_refused(self):
        path = os.path.join(self.dir, "job.env")
        with open(path, "w") as f:
            f.write("LD_PRELOAD=/tmp/anyones.so\n")
        os.chmod(path, 0o666)
        self.assert_refused(self.job("--env_file", path), 65,
                            "env file %s: writable by every user" % path)

    def test_a_deepspeed_env_of_another_user_is_refused(self):
        self.need_root()
        home = self.theirs("home", 0o755, directory=True)
        os.chown(home, 0, 0)  # the directory is ours, the file is not
        path = os.path.join(home, ".deepspeed_env")
        with open(path, "w") as f:
            f.write("LD_PRELOAD=/tmp/theirs.so\n")
        os.chown(path, self.NOBODY, self.NOBODY)
        self.assert_refused(self.job(), 65, "env file %s: belongs to another "
                            "user (uid 65534)" % path, HOME=home)

    def test_a_log_dir_of_another_user_is_refused(self):
        self.need_root()
        logs = self.theirs("logs", 0o777, directory=True)
        err = self.assert_refused(self.job("--log_dir", logs), 74,
                                  "--log_dir %s: %s belongs to another user" % (logs, logs))
        self.assertEqual(os.listdir(logs), [], err)

    def test_a_rank_log_of_another_user_is_neither_truncated_nor_written(self):
        self.need_root()
        logs = os.path.join(self.dir, "logs")
        os.mkdir(logs, 0o777)
        os.chmod(logs, 0o1777)  # shared, for a site's reasons
        planted = os.path.join(logs, "rank-0.log")
        with open(planted, "w") as f:
            f.write("theirs\n")
        os.chmod(planted, 0o666)
        os.chown(planted, self.NOBODY, self.NOBODY)
        self.assert_refused(self.job("--log_dir", logs), 74,
                            "cannot write %s: the file belongs to another user" % planted)
        with open(planted) as f:
            self.assertEqual(f.read(), "theirs\n")

    def test_a_log_link_another_user_planted_in_a_shared_log_dir_is_not_followed(self):
        self.need_root()
        logs = os.path.join(self.dir, "logs")
        os.mkdir(logs)
        os.chown(logs, 0, self.NOBODY)  # a group they share
        os.chmod(logs, 0o770)
        planted = os.path.join(logs, "rank-0.log")
        os.symlink("/dev/null", planted)
        os.lchown(planted, self.NOBODY, self.NOBODY)
        self.assert_refused(self.job("--log_dir", logs), 74,
                            "a symbolic link of another user (uid 65534), not followed")

    def test_a_log_dir_every_user_may_write_is_refused(self):
        logs = os.path.join(self.dir, "logs")
        os.mkdir(logs)
        os.chmod(logs, 0o777)
        self.assert_refused(self.job("--log_dir", logs), 74,
                            "%s is writable by every user" % logs)

    def test_a_deepspeed_env_link_another_user_planted_is_not_followed(self):
        self.need_root()
        shared = os.path.join(self.dir, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        path = os.path.join(shared, ".deepspeed_env")
        os.symlink("/etc/shadow", path)
        os.lchown(path, self.NOBODY, self.NOBODY)
        err = self.assert_refused(self.job(), 65, "env file %s: a symbolic link of "
                                  "another user (uid 65534); not followed" % path,
                                  HOME=shared)
        self.assertNotIn("root:", err)

    def test_a_tensorboard_dir_of_another_user_is_refused(self):
        self.need_root()
        tb = self.theirs("tb", 0o777, directory=True)
        self.assert_refused(self.job("--tensorboard", tb), 74,
                            "--tensorboard %s: %s belongs to another user" % (tb, tb))
        self.assertEqual(os.listdir(tb), [])


class SshTimeoutTest(RefusalCase):
    """The ssh preflight against loopback ports that stall at one step: the
    message names that step (and does not blame sshd for a dropped connect)."""

    def listener(self, backlog):
        s = socket.socket()
        self.addCleanup(s.close)
        s.bind(("127.0.0.1", 0))
        s.listen(backlog)
        return s

    def preflight(self, port, timeout, *needles):
        path = self.write_hostfile(b"127.0.0.1 port=%d\n" % port)
        argv = [DSLAUNCH, "--hostfile", path, "--launcher", "ssh",
                "--ssh_timeout", timeout, *self.rank_program()]
        err = self.assert_refused(argv, 69, "node 0 (127.0.0.1): connect failed: ",
                                  "started nothing", *needles)
        self.assertNotIn("Timeout connecting", err)
        return err

    def test_peer_that_never_speaks_is_named_a_handshake_timeout(self):
        s = self.listener(16)
        self.preflight(s.getsockname()[1], "0.5",
                       "SSH handshake with 127.0.0.1 timed out after 0.5 s")

    def test_peer_that_stalls_after_its_banner_is_a_handshake_timeout(self):
        s = self.listener(16)
        conns = []

        def serve():  # accept, send a banner, then say nothing more
            c, _ = s.accept()
            conns.append(c)
            c.sendall(b"SSH-2.0-Stall_1.0\r\n")
        t = threading.Thread(target=serve)
        t.start()
        self.addCleanup(lambda: [c.close() for c in conns])
        self.preflight(s.getsockname()[1], "0.5",
                       "SSH handshake with 127.0.0.1 timed out after 0.5 s")
        t.join(5)
        self.assertEqual(len(conns), 1, "dslaunch never connected")

    def test_port_that_drops_the_connect_is_named_a_tcp_timeout(self):
        s = self.listener(0)
        port = s.getsockname()[1]
        for _ in range(4):  # fill the accept queue: later SYNs are dropped
            c = socket.socket()
            self.addCleanup(c.close)
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
        err = self.preflight(port, "1",
                             "TCP connect to 127.0.0.1 timed out after 1 s")
        self.assertNotIn("sshd", err)


if __name__ == "__main__":
    unittest.main()
