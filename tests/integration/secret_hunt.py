"""The test's side of environ_rank.py: learning the secrets the agents made
(which otherwise only the launcher reads) and checking that no process a
rank can read holds one, nor anything else the launcher accepts."""
import json
import os
import re
import shlex

from harness import BIN

SECRET_LINE = re.compile(r"DSLAUNCH-SECRET (\d+) ([0-9a-f]{64})\s*$")


def agent_wrapper(test):
    """An --agent_path running the real dsagent (exec: same pid and parent,
    as mpirun's processes need) with its stdout copied into a file by tee;
    returns (path, file)."""
    log = os.path.join(test.dir, "agent-stdout")
    path = os.path.join(test.dir, "dsagent-tee")
    with open(path, "w") as f:
        f.write("#!/bin/bash\nexec > >(exec tee -a %s)\nexec %s \"$@\"\n"
                % (shlex.quote(log), shlex.quote(os.path.join(BIN, "dsagent"))))
    os.chmod(path, 0o755)
    return path, log


def node_secrets(log):
    """{node rank: secret} from the agents' secret lines."""
    found = {}
    if os.path.exists(log):
        with open(log) as f:
            for line in f:
                m = SECRET_LINE.search(line)
                if m:
                    found[int(m.group(1))] = m.group(2)
    return found


def check(test, out, log, nodes, tools, kept=(), given=()):
    """What environ_rank.py found: it read the environment of one of
    `tools` (srun, mpirun: they live as long as the job), no secret an agent
    made is in any environment, every value that could be a secret is
    refused by the launcher, and the DSLAUNCH_* names in `tools`' environment
    are `kept` (useless after the start) and those the test `given` dslaunch,
    nothing else."""
    with open(os.path.join(out, "environ-0.json")) as f:
        found = json.load(f)
    comms = {p["comm"] for p in found["read"]}
    test.assertTrue(comms & set(tools), "the rank read none of %s: %s" % (tools, sorted(comms)))
    for value, outcome in found["probes"].items():
        test.assertEqual(outcome, "refused", "a value a rank can read: %r" % value[:80])
    test.assertLessEqual(found["candidates"], 300, "every candidate was tried")
    in_tools = {n["name"] for n in found["named"] if n["comm"] in tools}
    test.assertEqual(in_tools - set(given), set(kept),
                     "DSLAUNCH_* in %s's environment" % (tools,))
    for n in found["named"]:
        if n["name"] in kept:
            test.assertIn(n["value"], found["probes"])
    secrets = node_secrets(log)
    test.assertEqual(sorted(secrets), list(range(nodes)), "each agent printed its secret")
    for node, secret in secrets.items():
        for run in found["hex_runs"]:
            test.assertNotIn(secret, run["value"], "node %d's secret in %s" % (node, run["where"]))
        for named in found["named"]:
            test.assertNotIn(secret, named["value"], "node %d's secret in %s" % (node, named["where"]))
