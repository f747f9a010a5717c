"""A rank that hunts for the job's secrets where any process of its user can
look: every readable /proc/*/environ. Rank 0 records what it read and found
in OUT_DIR/environ-0.json, then tries each value there that could be a
secret against the launcher, as an agent would: dsagent --connect with the
launcher's address and the job id from its own agent's command line, the
value as the secret on stdin. An agent whose secret is not the one the
launcher holds for that node exits saying the launcher failed to prove it.
The other ranks exit 0 at once."""
import json
import os
import re
import subprocess

OUT = os.environ["OUT_DIR"]
JOB = os.environ["DSLAUNCH_JOB_ID"]
HEX_RUN = re.compile(r"[0-9a-f]{64,}")


def pids():
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def environs():
    """(pid, comm, [NAME=VALUE, ...]) of every process whose environ we read."""
    for pid in pids():
        raw = read("/proc/%d/environ" % pid)
        if raw is None:
            continue
        comm = (read("/proc/%d/comm" % pid) or b"?").decode(errors="replace").strip()
        yield pid, comm, [e.decode(errors="replace") for e in raw.split(b"\0") if e]


def our_agent():
    """(dsagent path, --connect value) of an agent of this job."""
    for pid in pids():
        argv = [a.decode(errors="replace") for a in (read("/proc/%d/cmdline" % pid) or b"").split(b"\0")]
        if (os.path.basename(argv[0]) == "dsagent" and "--connect" in argv
                and "--job_id" in argv and JOB in argv):
            return argv[0], argv[argv.index("--connect") + 1]
    raise SystemExit("no agent of job %s found" % JOB)


def probe(agent, connect, value):
    # stdin stays open while it tries: its end would be the launcher's loss.
    p = subprocess.Popen([agent, "--connect", connect, "--node_rank", "0", "--job_id", JOB,
                          "--connect_timeout", "5"],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    p.stdin.write((value + "\n").encode())
    p.stdin.flush()
    err = p.stderr.read().decode(errors="replace")
    p.stdin.close()
    p.wait(timeout=30)
    if "launcher failed to prove the job secret" in err:
        return "refused"
    return "NOT REFUSED (exit %d): %s" % (p.returncode, err[-400:])


def main():
    if os.environ["RANK"] != "0":
        return
    agent, connect = our_agent()
    read_from, named, runs = [], [], {}
    for pid, comm, entries in environs():
        read_from.append({"pid": pid, "comm": comm})
        for entry in entries:
            name, _, value = entry.partition("=")
            where = "%s (pid %d): %s" % (comm, pid, name)
            if name.startswith("DSLAUNCH_"):
                named.append({"where": where, "name": name, "comm": comm, "value": value})
            for run in HEX_RUN.findall(value):
                runs.setdefault(run, where)
    candidates = {n["value"] for n in named} | {r for r in runs if len(r) == 64}
    candidates = sorted(c for c in candidates if c and "\n" not in c and len(c) <= 4096)
    probes = {c: probe(agent, connect, c) for c in candidates[:300]}
    with open(os.path.join(OUT, "environ-0.json"), "w") as f:
        json.dump({"read": read_from, "named": named,
                   "hex_runs": [{"value": v, "where": w} for v, w in runs.items()],
                   "probes": probes, "candidates": len(candidates)}, f)


main()
