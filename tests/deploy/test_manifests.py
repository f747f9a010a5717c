"""The Kubernetes and OpenShift deployment, checked offline (docs/kubernetes.md).

Every YAML document under deploy/k8s and deploy/openshift parses; the join
mode's contract is asserted field by field (Indexed Job, headless Service,
the Secret as a file, GPUs, /dev/shm, readiness = joined, the launcher's
flags, restricted-v2's securityContext); deploy/Containerfile runs as a
non-root user and installs dslaunch's Debian package, whose Depends cover
the libraries the binaries load; and every
document validates against the Kubernetes API's JSON schema with
kubernetes-validate, from the venv that `deploy/setup.sh --test` makes, with
the network blocked.
"""
import functools
import json
import os
import re
import subprocess
import unittest
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
FLAVOURS = ("k8s", "openshift")
K8S_VENV = Path(os.environ.get("DSL_K8S_VENV", "/opt/dslaunch-test/k8s-venv"))
BIN = Path(os.environ.get("DSL_BIN", REPO / "build" / "bin"))
IMAGE = "dslaunch:0.1.0"
SECRET = "dslaunch-job"
GPU = "nvidia.com/gpu"
# The container securityContext OpenShift's restricted-v2 SCC admits, exactly.
RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# deploy/k8s adds only these: the image's user, and GID 0 for the Secret.
K8S_ONLY = {"runAsUser": 1000, "runAsGroup": 0}


def load_documents(flavour):
    """[(path relative to the repository, index, document)] of one flavour."""
    docs = []
    for path in sorted((DEPLOY / flavour).rglob("*.y*ml")):
        with open(path) as f:
            for i, doc in enumerate(yaml.safe_load_all(f)):
                if doc is not None:
                    docs.append((str(path.relative_to(REPO)), i, doc))
    return docs


def walk(node, path=""):
    """Yields (path, key or index, value) for every entry in a document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield path, k, v
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield path, i, v
            yield from walk(v, f"{path}[{i}]")


def flag_pairs(args):
    """Splits '--flag value' (or '--flag=value') from PROGRAM ARGS, which
    start at the first argument that is not a flag."""
    flags, i = {}, 0
    while i < len(args) and args[i].startswith("--"):
        name, eq, value = args[i].partition("=")
        if not eq:
            value, i = args[i + 1], i + 1
        assert name not in flags, f"{name} given twice"
        flags[name] = value
        i += 1
    return flags, args[i:]


def pod_spec(doc):
    return doc["spec"]["template"]["spec"]


def only_container(doc):
    containers = pod_spec(doc)["containers"]
    assert len(containers) == 1, f"{doc['metadata']['name']}: one container"
    return containers[0]


def mount_volume(doc, mount_path):
    """The volume mounted at `mount_path` in the only container, or None."""
    for m in only_container(doc).get("volumeMounts", []):
        if m["mountPath"] == mount_path:
            return next(v for v in pod_spec(doc)["volumes"] if v["name"] == m["name"])
    return None


def labels_of(doc):
    """The labels of a workload's pods."""
    return doc["spec"]["template"]["metadata"]["labels"]


def env_of(doc):
    return {e["name"]: e.get("value") for e in only_container(doc).get("env", [])}


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


class Flavour:
    """One flavour's documents by role."""

    def __init__(self, name):
        self.name = name
        self.docs = load_documents(name)
        by_kind = {}
        for _, _, doc in self.docs:
            by_kind.setdefault(doc["kind"], []).append(doc)
        self.jobs = {d["metadata"]["name"]: d for d in by_kind.get("Job", [])}
        self.services = {d["metadata"]["name"]: d for d in by_kind.get("Service", [])}
        self.statefulsets = by_kind.get("StatefulSet", [])
        self.secrets = by_kind.get("Secret", [])
        self.launcher = self.jobs["dslaunch-launcher"]
        self.indexed = self.jobs["dslaunch-worker"]
        (self.statefulset,) = self.statefulsets
        self.workers = (self.indexed, self.statefulset)
        self.headless = self.services["dslaunch-workers"]
        self.control = self.services["dslaunch-launcher"]
        self.flags, self.program = flag_pairs(only_container(self.launcher)["args"])


def per_flavour(check):
    """Runs check(self, flavour) for deploy/k8s and deploy/openshift."""
    @functools.wraps(check)
    def test(self):
        for fl in self.flavours.values():
            with self.subTest(flavour=fl.name):
                check(self, fl)
    return test


class Manifests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.flavours = {f: Flavour(f) for f in FLAVOURS}

    @per_flavour
    def test_every_document_parses_with_kind_and_name(self, fl):
        self.assertGreaterEqual(len(fl.docs), 5)
        for path, i, doc in fl.docs:
            self.assertIsInstance(doc, dict, f"{path}#{i}")
            self.assertTrue(doc.get("apiVersion") and doc.get("kind"), f"{path}#{i}")
            self.assertTrue(doc.get("metadata", {}).get("name"), f"{path}#{i}")

    @per_flavour
    def test_workers_are_an_indexed_job_whose_failed_agents_rejoin(self, fl):
        spec = fl.indexed["spec"]
        self.assertEqual(spec["completionMode"], "Indexed")
        self.assertEqual(spec["completions"], spec["parallelism"])
        self.assertGreater(spec["completions"], 1)
        # A failed agent restarts in its pod and joins the next generation,
        # as often as the launcher restarts the job, and once more.
        self.assertEqual(pod_spec(fl.indexed)["restartPolicy"], "OnFailure")
        restarts = int(fl.flags["--max_restarts"])
        self.assertGreater(restarts, 0)
        self.assertEqual(spec["backoffLimit"], restarts + 1)
        # The launcher itself is never retried: a second one would have no
        # agents (they exit with the first).
        self.assertEqual(fl.launcher["spec"]["backoffLimit"], 0)
        self.assertEqual(pod_spec(fl.launcher)["restartPolicy"], "Never")

    @per_flavour
    def test_statefulset_alternative_starts_every_pod_at_once(self, fl):
        spec = fl.statefulset["spec"]
        self.assertEqual(spec["replicas"], fl.indexed["spec"]["completions"])
        self.assertEqual(spec["podManagementPolicy"], "Parallel")
        self.assertTrue(selects(spec["selector"]["matchLabels"], labels_of(fl.statefulset)))
        # Not applied together with the Indexed Job by `apply -f dir/`.
        path = next(p for p, _, d in fl.docs if d is fl.statefulset)
        self.assertNotEqual(Path(path).parent, Path("deploy", fl.name))

    @per_flavour
    def test_headless_service_selects_the_worker_pods_only(self, fl):
        svc = fl.headless["spec"]
        self.assertEqual(svc["clusterIP"], "None")
        self.assertTrue(svc.get("publishNotReadyAddresses"))
        for w in fl.workers:
            self.assertTrue(selects(svc["selector"], labels_of(w)))
        self.assertFalse(selects(svc["selector"], labels_of(fl.launcher)))
        name = fl.headless["metadata"]["name"]
        self.assertEqual(pod_spec(fl.indexed)["subdomain"], name)
        self.assertEqual(fl.statefulset["spec"]["serviceName"], name)

    @per_flavour
    def test_agents_dial_the_launcher_service(self, fl):
        svc = fl.control["spec"]
        self.assertNotEqual(svc.get("clusterIP"), "None")
        self.assertTrue(selects(svc["selector"], labels_of(fl.launcher)))
        for w in fl.workers:
            self.assertFalse(selects(svc["selector"], labels_of(w)))
        (port,) = svc["ports"]
        self.assertEqual(port["port"], 29400)
        self.assertEqual(int(fl.flags.get("--control_port", "29400")), port["targetPort"])
        self.assertIn(port["targetPort"],
                      [p["containerPort"] for p in only_container(fl.launcher)["ports"]])
        for w in fl.workers:
            agent, _ = flag_pairs(only_container(w)["args"])
            self.assertEqual(agent["--join"],
                             f"{fl.control['metadata']['name']}:{port['port']}")

    @per_flavour
    def test_launcher_runs_join_mode_for_every_worker(self, fl):
        self.assertEqual(only_container(fl.launcher)["command"], ["dslaunch"])
        self.assertEqual(fl.flags["--launcher"], "join")
        self.assertEqual(int(fl.flags["--num_nodes"]), fl.indexed["spec"]["completions"])
        self.assertGreater(int(fl.flags["--join_timeout"]), 0)
        self.assertTrue(fl.program, "the launcher needs a PROGRAM")
        for w in fl.workers:
            self.assertEqual(only_container(w)["command"], ["dsagent"])

    @per_flavour
    def test_secret_is_a_mounted_file_passed_by_secret_file(self, fl):
        guide = (REPO / "docs" / "kubernetes.md").read_text()
        made = re.search(r"create secret generic (\S+) \\?\s*--from-literal=(\w+)=", guide)
        self.assertIsNotNone(made, "docs/kubernetes.md shows how to make the Secret")
        self.assertEqual(made.group(1), SECRET)
        self.assertEqual(fl.secrets, [], "the Secret is made by a command, never committed")
        for doc in (fl.launcher,) + fl.workers:
            c = only_container(doc)
            flags, _ = flag_pairs(c["args"])
            path = Path(flags["--secret_file"])
            vol = mount_volume(doc, str(path.parent))
            self.assertIsNotNone(vol, f"{path.parent} is not a mount")
            mount = next(m for m in c["volumeMounts"] if m["name"] == vol["name"])
            self.assertTrue(mount.get("readOnly"))
            # Secret files are owned by root: group-readable for GID 0
            # and OpenShift's fsGroup; 0400 would be root's only.
            self.assertEqual(vol["secret"]["defaultMode"], 0o440)
            self.assertEqual(vol["secret"]["secretName"], SECRET)
            self.assertEqual(vol["secret"]["items"],
                             [{"key": made.group(2), "path": path.name}])
        for path, i, doc in fl.docs:
            for where, key, value in walk(doc):
                self.assertNotIn(key, ("secretKeyRef", "secretRef"),
                                 f"{path}#{i}{where}: a secret in the environment")
                if isinstance(value, str):
                    self.assertIsNone(re.search(r"[0-9a-fA-F]{32,}", value),
                                      f"{path}#{i}{where}.{key}: a secret value?")

    @per_flavour
    def test_workers_request_gpus_and_the_launcher_uses_them(self, fl):
        for w in fl.workers:
            res = only_container(w)["resources"]
            gpus = res["limits"][GPU]
            self.assertGreater(gpus, 0)
            self.assertEqual(res["requests"].get(GPU, gpus), gpus)
            self.assertEqual(int(fl.flags["--num_gpus"]), gpus)
        self.assertNotIn(GPU, json.dumps(only_container(fl.launcher)["resources"]))

    @per_flavour
    def test_workers_have_memory_backed_dev_shm(self, fl):
        for w in fl.workers:
            vol = mount_volume(w, "/dev/shm")
            self.assertIsNotNone(vol, "no /dev/shm mount")
            self.assertEqual(vol["emptyDir"]["medium"], "Memory")

    @per_flavour
    def test_readiness_probe_tests_the_agents_ready_file(self, fl):
        for w in fl.workers:
            c = only_container(w)
            flags, _ = flag_pairs(c["args"])
            ready = flags["--ready_file"]
            self.assertTrue(ready.startswith("/tmp/"), ready)
            self.assertEqual(c["readinessProbe"]["exec"]["command"], ["test", "-f", ready])

    @per_flavour
    def test_liveness_probe_checks_the_file_the_agent_touches(self, fl):
        # A frozen agent stops touching it; the kubelet restarts it well
        # within the launcher's --rejoin_timeout, and it joins the next
        # generation.
        for w in fl.workers:
            c = only_container(w)
            flags, _ = flag_pairs(c["args"])
            alive = flags["--alive_file"]
            self.assertTrue(alive.startswith("/tmp/"), alive)
            self.assertNotEqual(alive, flags["--ready_file"])
            probe = c["livenessProbe"]
            self.assertEqual(probe["exec"]["command"], ["dsagent", "--alive_check", alive])
            # Within 30 s of the last touch the check passes: never restart
            # a live agent for one slow probe, nor wait past the rejoin timeout.
            restart_after = 30 + probe["periodSeconds"] * probe["failureThreshold"]
            self.assertLess(restart_after, float(fl.flags.get("--rejoin_timeout", 300)))
            self.assertGreaterEqual(probe["failureThreshold"], 2)

    @per_flavour
    def test_everything_written_goes_to_tmp_on_a_read_only_root(self, fl):
        for doc in (fl.launcher,) + fl.workers:
            name = doc["metadata"]["name"]
            self.assertIn("emptyDir", mount_volume(doc, "/tmp"), name)
            self.assertEqual(env_of(doc).get("TMPDIR"), "/tmp", name)
            self.assertEqual(env_of(doc).get("HOME"), "/tmp", name)
            self.assertTrue(only_container(doc)["securityContext"]["readOnlyRootFilesystem"])
        # The launcher keeps the ranks' logs (agents have none of their own).
        flags, _ = flag_pairs(only_container(fl.launcher)["args"])
        self.assertTrue(flags["--log_dir"].startswith("/tmp/"))

    @per_flavour
    def test_containers_meet_restricted_v2_and_openshift_fixes_no_ids(self, fl):
        for path, i, doc in fl.docs:
            for where, key, value in walk(doc):
                self.assertNotIn(key, ("privileged", "hostNetwork", "hostPID", "hostIPC"),
                                 f"{path}#{i}{where}")
                if fl.name == "openshift":  # the SCC assigns them
                    self.assertNotIn(key, ("runAsUser", "runAsGroup", "fsGroup"),
                                     f"{path}#{i}{where}")
        for doc in (fl.launcher,) + fl.workers:
            ctx = only_container(doc)["securityContext"]
            want = dict(RESTRICTED, **(K8S_ONLY if fl.name == "k8s" else {}))
            self.assertEqual(ctx, want, doc["metadata"]["name"])
            self.assertIs(pod_spec(doc)["automountServiceAccountToken"], False)

    def test_openshift_differs_from_k8s_only_in_the_fixed_ids(self):
        k8s, ocp = ({(Path(p).relative_to(Path("deploy", f)), i): d
                     for p, i, d in self.flavours[f].docs} for f in FLAVOURS)
        self.assertEqual(sorted(k8s), sorted(ocp))
        for key, doc in k8s.items():
            doc = json.loads(json.dumps(doc))
            for c in pod_spec(doc)["containers"] if "template" in doc.get("spec", {}) else []:
                for k in K8S_ONLY:
                    c["securityContext"].pop(k, None)
            self.assertEqual(doc, ocp[key], str(key[0]))

    @per_flavour
    def test_every_container_runs_the_containerfiles_image(self, fl):
        for path, i, doc in fl.docs:
            for where, key, value in walk(doc):
                if key == "image":
                    self.assertEqual(value, IMAGE, f"{path}#{i}{where}")
        build = re.search(r"build -f deploy/Containerfile -t (\S+) \.",
                          (DEPLOY / "Containerfile").read_text())
        self.assertEqual(build.group(1), IMAGE)


def containerfile_stages():
    """[(FROM line, [(INSTRUCTION, rest)])] with continuations joined."""
    text = re.sub(r"^\s*#.*\n", "", (DEPLOY / "Containerfile").read_text(), flags=re.M)
    stages = []
    for line in text.replace("\\\n", " ").splitlines():
        if not line.strip():
            continue
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "FROM":
            stages.append((rest.strip(), []))
        elif stages:  # ARGs before the first FROM are the build's, no stage's
            stages[-1][1].append((word.upper(), " ".join(rest.split())))
    return stages


class Containerfile(unittest.TestCase):
    def test_compiles_on_debian_12_and_runs_on_slim(self):
        stages = containerfile_stages()
        froms = [f for f, _ in stages]
        self.assertEqual(froms, ["${BASE} AS compiled", "scratch AS prebuilt",
                                 "${DEBS} AS debs", "${SLIM}"])
        text = (DEPLOY / "Containerfile").read_text()
        for arg in ("DEBS=compiled", "BASE=debian:12", "SLIM=debian:12-slim"):
            self.assertRegex(text, r"(?m)^ARG %s$" % re.escape(arg))

    def test_runs_as_a_numeric_non_root_user_in_group_0(self):
        _, runtime = containerfile_stages()[-1]
        users = [rest for word, rest in runtime if word == "USER"]
        self.assertTrue(users, "no USER in the runtime stage")
        m = re.fullmatch(r"(\d+):(\d+)", users[-1])
        self.assertIsNotNone(m, f"USER {users[-1]}: numeric UID:GID (runAsNonRoot checks it)")
        self.assertNotEqual(int(m.group(1)), 0)
        self.assertEqual(int(m.group(2)), 0)

    def test_installs_the_package_and_no_sshd_or_build_tools(self):
        """The image installs dslaunch's .deb (apt adds what its Depends name,
        which dpkg-shlibdeps computed from the programs) and nothing to build
        or log in with; the compiled stage makes that .deb with CPack."""
        stages = dict(containerfile_stages())
        compiled = " ".join(r for w, r in stages["${BASE} AS compiled"] if w == "RUN")
        self.assertIn("cpack -G DEB -B /debs", compiled)
        self.assertIn("-DDSL_BUILD_TESTS=OFF", compiled)
        _, runtime = containerfile_stages()[-1]
        self.assertIn(("COPY", "--from=debs /debs/ /tmp/debs/"), runtime)
        install = next(r for w, r in runtime if w == "RUN" and "apt-get install" in r)
        wanted = [w for w in install.split("apt-get install", 1)[1].split("&&")[0].split()
                  if not w.startswith("-")]
        self.assertEqual(wanted, ["/tmp/debs/dslaunch_*.deb", "python3"])
        self.assertNotRegex(" ".join(r for _, r in runtime),
                            r"openssh|sshd|pdsh|build-essential|cmake")

    def test_the_packages_depends_cover_every_library_the_binaries_load(self):
        """ldd of build/bin/ against the .deb's Depends (deploy/packages.sh
        made it from this build) and their dependencies, plus
        debian:12-slim's own (required priority, apt)."""
        cache = BIN.parent / "CMakeCache.txt"
        bins = [BIN / b for b in ("dslaunch", "dsagent", "dsworker")]
        deb = BIN.parent / "packages" / "deb" / "dslaunch_0.1.0_amd64.deb"
        if not all(b.exists() for b in bins) or not cache.exists() or not deb.exists():
            self.skipTest(f"no build and package in {BIN.parent}")
        config = cache.read_text()
        if re.search(r"^DSL_SANITIZE:STRING=.+$|^DSL_STATIC_LIBS:BOOL=OFF$", config, re.M):
            self.skipTest(f"{BIN.parent} is not the image's configuration")
        libs = set()
        for b in bins:
            out = subprocess.run(["ldd", str(b)], capture_output=True, text=True)
            if "not a dynamic executable" in out.stdout + out.stderr:
                continue  # static: loads nothing
            self.assertEqual(out.returncode, 0, f"ldd {b}: {out.stderr}")
            for m in re.finditer(r"=> (/\S+)", out.stdout):
                if not m.group(1).startswith("/usr/local/cuda"):  # image: DSL_CUDA=OFF
                    libs.add(m.group(1))
        owners = owner_packages(sorted(libs))
        depends = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True,
                                 text=True, check=True).stdout
        wanted = [d.split()[0] for d in depends.split(",") if d.strip()]
        status = installed_packages()
        required = [p for p, (prio, _) in status.items() if prio == "required"]
        base = closure(required + ["apt"], status)
        have = closure([w for w in wanted if w in status], status) | base
        for lib, pkg in owners.items():
            self.assertIsNotNone(pkg, f"{lib}: no Debian package owns it")
            self.assertIn(pkg, have, f"{lib} ({pkg}) is not among the package's Depends")


def owner_packages(libs):
    """{library: the Debian package that owns it, or None}, in one dpkg call
    (each costs a fifth of a second): /lib is /usr/lib, and a library may be
    a symlink set up by update-alternatives."""
    candidates = {}
    for lib in libs:
        real = os.path.realpath(lib)
        candidates[lib] = list(dict.fromkeys(
            [lib, real] + [re.sub(r"^/lib/", "/usr/lib/", p) for p in (lib, real)]))
    out = subprocess.run(["dpkg-query", "-S"] + sorted({p for c in candidates.values() for p in c}),
                         capture_output=True, text=True).stdout
    owner = {}
    for line in out.splitlines():
        pkgs, _, path = line.rpartition(": ")
        owner[path] = pkgs.split(",")[0].split(":")[0].strip()
    return {lib: next((owner[p] for p in c if p in owner), None) for lib, c in candidates.items()}


def installed_packages():
    """{package: (priority, [dependency names])} from dpkg's status."""
    out = subprocess.run(["dpkg-query", "-W", "-f",
                          "${Package}\t${Priority}\t${Pre-Depends}, ${Depends}\n"],
                         capture_output=True, text=True, check=True).stdout
    status = {}
    for line in out.splitlines():
        name, prio, deps = line.split("\t")
        names = [re.sub(r"[ (:].*", "", alt.strip())
                 for dep in deps.split(",") for alt in dep.split("|") if alt.strip()]
        status[name] = (prio, names)
    return status


def closure(packages, status):
    seen, todo = set(), list(packages)
    while todo:
        p = todo.pop()
        if p in seen or p not in status:
            continue
        seen.add(p)
        todo.extend(status[p][1])
    return seen


# Runs in the venv: validates the documents given on stdin against the
# oldest and the newest Kubernetes version the package ships, in strict mode
# (no unknown field), with every socket refused.
VALIDATE = r"""
import json, socket, sys
def offline(*a, **k):
    raise OSError("network use during validation")
socket.socket.connect = socket.socket.connect_ex = offline
socket.create_connection = socket.getaddrinfo = offline
import kubernetes_validate as kv
from kubernetes_validate.utils import all_versions
versions = [all_versions()[0], all_versions()[-1]]
report = {"versions": versions, "checked": 0, "errors": []}
for item in json.load(sys.stdin):
    for v in versions:
        try:
            kv.validate(item["doc"], v, strict=True)
            report["checked"] += 1
        except kv.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            report["errors"].append("%s against %s: %s: %s" % (item["where"], v, where, e.message))
        except Exception as e:  # no schema for the kind, a version not shipped
            message = getattr(e, "message", e)
            report["errors"].append("%s against %s: %s" % (item["where"], v, message))
json.dump(report, sys.stdout)
"""


class Schema(unittest.TestCase):
    def test_every_document_validates_against_the_kubernetes_api(self):
        python = K8S_VENV / "bin" / "python"
        if not python.exists():
            self.skipTest(f"no kubernetes-validate venv at {K8S_VENV}: run deploy/setup.sh --test")
        items = [{"where": f"{p}#{i}", "doc": d}
                 for f in FLAVOURS for p, i, d in load_documents(f)]
        # Broken copies must be refused, or the validator checks nothing: an
        # unknown field (strict mode) and a number where a string belongs.
        job = next(i["doc"] for i in items if i["doc"]["kind"] == "Job")
        typo, number = json.loads(json.dumps(job)), json.loads(json.dumps(job))
        ctx = only_container(typo)["securityContext"]
        ctx["readOnlyRootFileSystem"] = ctx.pop("readOnlyRootFilesystem")
        only_container(number)["args"][1] = 29400
        canaries = [{"where": "canary-typo", "doc": typo},
                    {"where": "canary-number", "doc": number}]
        out = subprocess.run([str(python), "-I", "-c", VALIDATE],
                             input=json.dumps(items + canaries),
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        report = json.loads(out.stdout)
        errors = [e for e in report["errors"] if not e.startswith("canary-")]
        self.assertEqual(errors, [], "\n".join(errors))
        self.assertEqual(report["checked"], len(items) * len(report["versions"]))
        for canary in canaries:
            refused = [e for e in report["errors"] if e.startswith(canary["where"] + " ")]
            self.assertEqual(len(refused), len(report["versions"]), f"{canary['where']} passed")


if __name__ == "__main__":
    unittest.main()
