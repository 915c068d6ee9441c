"""The Helm chart, offline (no cluster can be reached): `helm lint --strict`, renderings that
`kubernetes-validate --strict` accepts, values the schema refuses by name, the rendered
objects, and the real binaries started with exactly the environment, files and commands the
chart gives their containers.

Needs HEADROOM_HELM (the helm binary: scripts/test extracts it), kubernetes-validate on PATH
or beside this interpreter, HEADROOM_BIN_DIR (the built binaries) and, for the end-to-end
test, HEADROOM_TEST_DATABASE_URL (a PostgreSQL server the test may create a database on).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

HERE = Path(__file__).resolve().parent
CHART = HERE.parent / "headroom"
ROOT = HERE.parents[2]
VALUE_SETS = ["default", "replicas", "bundled-postgres", "plans", "no-hostpid"]


def helm() -> str:
    path = os.environ.get("HEADROOM_HELM") or shutil.which("helm")
    if not path:
        pytest.fail("set HEADROOM_HELM to a helm binary (scripts/test installs one)")
    return path


# The values the chart requires, the admin's decisions: which nodes may join, and how many
# GPUs a GPU node has (the agent requests them all).
REQUIRED = ["--set-json", 'tokens.joinNodes=["gpu-*"]', "--set", "agent.gpusPerNode=8"]


def values_args(name: str) -> list[str]:
    given = [] if name == "default" else ["-f", str(HERE / "values" / f"{name}.yaml")]
    return [*REQUIRED, *given]


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120)


def render(value_set: str = "default", *extra: str) -> list[dict[str, Any]]:
    out = run_helm("template", "r", str(CHART), *values_args(value_set), *extra)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def container(doc: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# --- lint and validation -------------------------------------------------------------------


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_chart_lints_strictly(value_set: str) -> None:
    out = run_helm("lint", "--strict", str(CHART), *values_args(value_set))
    assert out.returncode == 0, out.stdout + out.stderr


def validator() -> str:
    beside = Path(sys.executable).parent / "kubernetes-validate"
    path = str(beside) if beside.exists() else shutil.which("kubernetes-validate")
    if not path:
        pytest.fail("kubernetes-validate is not installed (scripts/test installs it)")
    return path


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendering_is_valid_kubernetes(value_set: str) -> None:
    out = run_helm("template", "r", str(CHART), *values_args(value_set))
    assert out.returncode == 0, out.stderr
    check = subprocess.run(
        [validator(), "--strict", "--quiet", "-"],
        input=out.stdout,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_broken_manifest_is_caught_by_the_validator() -> None:
    """The validation above can fail: a field Kubernetes does not have is refused."""
    docs = render()
    ds = find(docs, "DaemonSet")
    container(ds)["hostPid"] = True
    check = subprocess.run(
        [validator(), "--strict", "--quiet", "-"],
        input=yaml.safe_dump(ds),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode != 0
    assert "hostPid" in check.stdout + check.stderr


REFUSED = [
    ({"coordinator": {"replicas": 0}}, "/coordinator/replicas"),
    ({"coordinator": {"replica": 2}}, "replica"),
    ({"coordinator": {"leaseTtl": "thirty seconds"}}, "/coordinator/leaseTtl"),
    ({"coordinator": {"maxClaims": -1}}, "/coordinator/maxClaims"),
    ({"agent": {"plan": "2,,2"}}, "/agent/plan"),
    ({"agent": {"plans": {"gpu-01": "2,x"}}}, "/agent/plans/gpu-01"),
    # A node name with a space: the message names the key.
    ({"agent": {"plans": {"gpu 01": "2"}}}, "invalid propertyName 'gpu 01'"),
    ({"agent": {"gpuBackend": "cuda"}}, "/agent/gpuBackend"),
    ({"agent": {"hostPID": "yes"}}, "/agent/hostPID"),
    ({"agent": {"runAsDefault": "root"}}, "/agent/runAsDefault"),
    ({"agent": {"passEnv": ["HEADROOM_TOKEN"]}}, "/agent/passEnv/0"),
    ({"agent": {"killGraceSeconds": 0}}, "/agent/killGraceSeconds"),
    ({"database": {"existingSecret": ""}}, "/database/existingSecret"),
    ({"tokens": {"existingSecret": "Not_A_Name"}}, "/tokens/existingSecret"),
    ({"agent": {"updateStrategy": {"type": "Recreate"}}}, "/agent/updateStrategy/type"),
    ({"tokens": {"joinNodes": []}}, "/tokens/joinNodes"),
    ({"tokens": {"joinNodes": ["gpu-[0-9]"]}}, "/tokens/joinNodes/0"),
    ({"tokens": {"joinNodes": ["gpu-*"], "joinExpiresAt": "next week"}}, "/tokens/joinExpiresAt"),
    ({"agent": {"gpusPerNode": 0}}, "/agent/gpusPerNode"),
]


@pytest.mark.parametrize("values,field", REFUSED, ids=[f for _, f in REFUSED])
def test_bad_values_are_refused_naming_the_field(
    values: dict[str, Any], field: str, tmp_path: Path
) -> None:
    f = tmp_path / "bad.yaml"
    # Over the required values, so that only the bad one is refused.
    tokens = {"joinNodes": ["gpu-*"], **values.get("tokens", {})}
    agent = {"gpusPerNode": 8, **values.get("agent", {})}
    f.write_text(yaml.safe_dump({**values, "tokens": tokens, "agent": agent}))
    for command in (["lint", "--strict", str(CHART)], ["template", "r", str(CHART)]):
        out = run_helm(*command, "-f", str(f))
        assert out.returncode != 0, f"{command[0]} took {values}"
        said = out.stdout + out.stderr
        assert "schema" in said and field in said, said


# --- the rendered objects ------------------------------------------------------------------


def test_by_default_agents_run_on_gpu_nodes_in_the_hosts_pid_namespace() -> None:
    docs = render()
    assert kinds(docs) == sorted(
        ["ServiceAccount", "Secret", "ConfigMap", "Service",
         "DaemonSet", "Deployment", "NetworkPolicy", "NetworkPolicy"]
    )
    pod = find(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["hostPID"] is True
    assert "runtimeClassName" not in pod
    # Longer than the kill grace and the verification, so a drained node cleans up.
    assert pod["terminationGracePeriodSeconds"] == 10 + 30 + 30
    c = container(find(docs, "DaemonSet"))
    env = env_of(c)
    assert env["HEADROOM_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # Its node's GPUs, from the device plugin (none handed to another pod).
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert env["HEADROOM_REQUIRE_DOCTOR"] == "true"
    assert env["HEADROOM_ON_EXIT"] == "stop"
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "SYS_ADMIN" not in sc["capabilities"]["add"]
    assert pod["automountServiceAccountToken"] is False


def test_no_secret_reaches_an_environment_variable_and_agents_get_the_join_token_only() -> None:
    for value_set in VALUE_SETS:
        docs = render(value_set)
        for d in docs:
            if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
                for e in container(d).get("env", []):
                    assert "secretKeyRef" not in e.get("valueFrom", {}), (value_set, e)
        tokens = [d for d in docs if d["kind"] == "Secret" and "admin-token" in d.get("data", {})]
        assert len(tokens) == 1
        name = tokens[0]["metadata"]["name"]
        pod = find(docs, "DaemonSet")["spec"]["template"]["spec"]
        secret_vols = [v["secret"] for v in pod["volumes"] if "secret" in v]
        assert secret_vols == [
            {"secretName": name, "items": [{"key": "join-token", "path": "join-token"}],
             "defaultMode": 0o400}
        ]
        # Only the init container holds it: jobs run in the agent's container, which does not.
        agent = container(find(docs, "DaemonSet"))
        assert "join" not in [m["name"] for m in agent["volumeMounts"]], value_set
        assert "HEADROOM_JOIN_TOKEN_FILE" not in env_of(agent)
        [join] = pod["initContainers"]
        assert join["command"] == ["headroom-agent", "--join-only"]
        assert "join" in [m["name"] for m in join["volumeMounts"]]
        assert join["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        coord_vols = find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
        assert any(v.get("secret", {}).get("secretName") == name for v in coord_vols)


def test_the_join_token_makes_only_the_nodes_the_admin_names_until_it_expires() -> None:
    # Without joinNodes the chart is refused: a join token that mints any node is no default.
    out = run_helm("template", "r", str(CHART), "--set", "agent.gpusPerNode=8")
    assert out.returncode != 0
    assert "joinNodes" in out.stdout + out.stderr
    docs = render("default", "--set-json", 'tokens.joinNodes=["gpu-*","dgx-a"]',
                  "--set", "tokens.joinExpiresAt=2027-01-31T00:00:00Z")
    env = env_of(container(find(docs, "Deployment")))
    assert env["HEADROOM_BOOTSTRAP_JOIN_NODES"] == "gpu-*,dgx-a"
    assert env["HEADROOM_BOOTSTRAP_JOIN_EXPIRES_AT"] == "2027-01-31T00:00:00Z"
    assert "HEADROOM_BOOTSTRAP_JOIN_EXPIRES_AT" not in env_of(container(find(render(), "Deployment")))


def test_agents_hold_their_nodes_gpus_and_take_connections_on_their_metrics_port_only() -> None:
    # With NVML the GPU count is required, and the agent requests every GPU of its node.
    out = run_helm("template", "r", str(CHART), "--set-json", 'tokens.joinNodes=["gpu-*"]')
    assert out.returncode != 0 and "gpusPerNode" in out.stdout + out.stderr
    docs = render("default", "--set", "agent.gpusPerNode=4",
                  "--set-json", 'agent.resources={"limits": {"memory": "4Gi"}}')
    agent = container(find(docs, "DaemonSet"))
    assert agent["resources"]["limits"] == {"nvidia.com/gpu": 4, "memory": "4Gi"}
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(agent)
    # Fake GPUs request none.
    fake = container(find(render("plans"), "DaemonSet"))
    assert "nvidia.com/gpu" not in fake.get("resources", {}).get("limits", {})
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert policies["r-headroom-agent"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 9421}]}]
    assert "r-headroom-postgresql" not in policies
    bundled = render("bundled-postgres")
    db = [d["spec"] for d in bundled if d["kind"] == "NetworkPolicy"
          and d["metadata"]["name"] == "r-headroom-postgresql"]
    assert db and db[0]["ingress"][0]["from"][0]["podSelector"]["matchLabels"][
        "app.kubernetes.io/component"] == "coordinator"
    assert not [d for d in render("default", "--set", "networkPolicy.enabled=false")
                if d["kind"] == "NetworkPolicy"]


def test_generated_tokens_are_long_random_and_distinct() -> None:
    a = find(render(), "Secret", "r-headroom-tokens")["data"]
    b = find(render(), "Secret", "r-headroom-tokens")["data"]
    tokens = [base64.b64decode(v).decode() for v in (*a.values(), *b.values())]
    assert all(len(t) >= 32 for t in tokens)
    assert len(set(tokens)) == 4
    docs = render("default", "--set", "tokens.existingSecret=lab-tokens")
    assert not [d for d in docs if d["kind"] == "Secret"]
    vols = find(docs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    assert {"secretName": "lab-tokens", "items": [{"key": "join-token", "path": "join-token"}],
            "defaultMode": 0o400} in [v.get("secret") for v in vols]


def test_several_replicas_get_a_disruption_budget_and_share_only_the_database() -> None:
    docs = render("replicas")
    dep = find(docs, "Deployment")
    assert dep["spec"]["replicas"] == 3
    assert "strategy" not in dep["spec"], "nothing mounted once: rolling updates surge"
    pdb = find(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    # Logs are in the database: no volume to share (ReadWriteMany, which many clusters lack).
    assert "PersistentVolumeClaim" not in kinds(docs)
    ing = find(docs, "Ingress")
    assert ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == (
        find(docs, "Service")["metadata"]["name"]
    )
    assert "PodDisruptionBudget" not in kinds(render())
    # A volume kept from an earlier release (its logs), mounted by one node: the old pod
    # goes first.
    kept = render("default", "--set", "coordinator.persistence.enabled=true")
    assert find(kept, "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    rwop = render("default", "--set", "coordinator.persistence.enabled=true",
                  "--set", "coordinator.persistence.accessModes={ReadWriteOncePod}")
    assert find(rwop, "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    # A budget that would never let a replica go is refused, naming both values.
    out = run_helm("template", "r", str(CHART), *values_args("replicas"),
                   "--set", "coordinator.podDisruptionBudget.minAvailable=3")
    assert out.returncode != 0
    assert "coordinator.podDisruptionBudget.minAvailable (3) must be below coordinator.replicas (3)" in out.stderr


def test_the_bundled_database_is_what_the_coordinator_reads() -> None:
    docs = render("bundled-postgres")
    sts = find(docs, "StatefulSet")
    svc = find(docs, "Service", "r-headroom-postgresql")
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    db = find(docs, "Secret", "r-headroom-database")["data"]
    url = base64.b64decode(db["url"]).decode()
    password = base64.b64decode(db["password"]).decode()
    assert url == f"postgres://headroom:{password}@r-headroom-postgresql:5432/headroom"
    assert len(password) >= 32
    pg_env = env_of(container(sts))
    assert "POSTGRES_PASSWORD" not in pg_env and pg_env["POSTGRES_PASSWORD_FILE"]
    vols = find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"secretName": "r-headroom-database", "items": [{"key": "url", "path": "url"}],
            "defaultMode": 0o440} in [v.get("secret") for v in vols]
    assert {"name": "data", "emptyDir": {}} in vols
    assert "StatefulSet" not in kinds(render())


def test_plans_and_hostpid_values_reach_the_agents() -> None:
    docs = render("plans")
    plans = tomllib.loads(find(docs, "ConfigMap")["data"]["plans.toml"])
    assert plans == {"default": "1,1", "nodes": {"gpu-07": "2,1", "gpu-08": "3,3"}}
    pod = find(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["terminationGracePeriodSeconds"] == 5 + 10 + 30
    assert env_of(container(find(docs, "DaemonSet")))["HEADROOM_PASS_ENV"] == "WANDB_API_KEY,HF_HOME"
    # A plan change restarts no agent (it would stop their jobs): it applies at their next start.
    template = find(docs, "DaemonSet")["spec"]["template"]
    assert template == find(render("plans", "--set-string", "agent.plans.gpu-07=1"), "DaemonSet")["spec"]["template"]
    assert find(docs, "DaemonSet")["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    on_delete = render("plans", "--set", "agent.updateStrategy.type=OnDelete", "--set", "agent.updateStrategy.rollingUpdate=null")
    assert find(on_delete, "DaemonSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert tomllib.loads(find(render(), "ConfigMap")["data"]["plans.toml"]) == {"nodes": {}}
    off = render("no-hostpid")
    pod = find(off, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] is False
    sc = container(find(off, "DaemonSet"))["securityContext"]
    assert sc == {"runAsUser": 0, "privileged": True}
    notes = run_helm("install", "r", str(CHART), "--dry-run=client", *values_args("no-hostpid"))
    assert notes.returncode == 0, notes.stderr
    assert "agent.hostPID is false" in notes.stdout


def test_the_images_binaries_are_the_ones_the_chart_runs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    docs = render("bundled-postgres")
    for kind in ("Deployment", "DaemonSet"):
        command = container(find(docs, kind))["command"]
        assert f"target/release/{command[0]}" in dockerfile, command
        assert (Path(os.environ.get("HEADROOM_BIN_DIR", ROOT / "target/debug")) / command[0]).exists()


# --- the real binaries, as the chart runs them ---------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http(url: str, token: str | None = None, body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, method="POST" if body is not None else "GET")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, data, timeout=10) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text.strip().startswith(("{", "[")) else text)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError) as e:
        return 0, str(e)


def wait_for(what: str, check: Any, timeout: float = 60) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


class Pod:
    """One container of a rendered workload, run here as the kubelet would: its volumes are
    directories under `root` holding what the rendered Secrets and ConfigMaps (or `given`)
    put in them, owned by root and, with an `fsGroup`, given to that group (setgid, secret
    files at their `defaultMode`); the process runs as the pod's `runAsUser`/`runAsGroup`
    with the `fsGroup` as a supplementary group."""

    def __init__(self, doc: dict[str, Any], docs: list[dict[str, Any]], root: Path,
                 given: dict[str, dict[str, str]], field_refs: dict[str, str],
                 init: str | None = None) -> None:
        spec = doc["spec"]["template"]["spec"]
        # The pod's container, or (`init`) the init container of that name.
        self.c = (container(doc) if init is None
                  else next(c for c in spec["initContainers"] if c["name"] == init))
        self.root = root
        pod_sc = spec.get("securityContext", {})
        sc = {**pod_sc, **self.c.get("securityContext", {})}
        self.uid: int = sc.get("runAsUser", 0)
        self.gid: int = sc.get("runAsGroup", self.uid)
        self.fs_group: int | None = pod_sc.get("fsGroup")
        volumes = {v["name"]: v for v in spec["volumes"]}
        self.mounts: dict[str, Path] = {}
        for m in self.c["volumeMounts"]:
            where = root / m["mountPath"].lstrip("/")
            where.mkdir(parents=True, exist_ok=True)
            for parent in [where, *where.parents]:
                if parent == root.parent:
                    break
                parent.chmod(0o755)
            if self.fs_group is not None:
                os.chown(where, 0, self.fs_group)
                where.chmod(0o2775)
            self.mounts[m["mountPath"]] = where
            v = volumes[m["name"]]
            source = v.get("secret") or v.get("configMap")
            if not source:
                continue
            name = source.get("secretName") or source.get("name")
            data = given.get(name)
            if data is None:
                obj = [d for d in docs if d["kind"] in ("Secret", "ConfigMap")
                       and d["metadata"]["name"] == name]
                assert obj, f"volume {m['name']}: {name} is neither rendered nor given"
                raw = obj[0].get("data", {})
                data = ({k: base64.b64decode(x).decode() for k, x in raw.items()}
                        if obj[0]["kind"] == "Secret" else raw)
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for it in items:
                f = where / it["path"]
                f.write_text(data[it["key"]])
                f.chmod(source.get("defaultMode", 0o644))
                if self.fs_group is not None:
                    os.chown(f, 0, self.fs_group)
        self.env = {}
        for e in self.c["env"]:
            if "value" in e:
                self.env[e["name"]] = self.local(e["value"])
            else:
                self.env[e["name"]] = field_refs[e["valueFrom"]["fieldRef"]["fieldPath"]]
        self.ports = {p["name"]: p["containerPort"] for p in self.c.get("ports", [])}
        self.local_ports = {n: free_port() for n in self.ports}
        for k, v in self.env.items():
            for n, p in self.ports.items():
                if v == f"0.0.0.0:{p}":
                    self.env[k] = f"127.0.0.1:{self.local_ports[n]}"
        self.proc: subprocess.Popen[bytes] | None = None

    def local(self, value: str) -> str:
        for path, where in self.mounts.items():
            if value == path or value.startswith(path + "/"):
                return str(where) + value[len(path):]
        return value

    def start(self, bin_dir: Path, log: Path) -> None:
        command = [str(bin_dir / self.c["command"][0]), *self.c["command"][1:],
                   *self.c.get("args", [])]
        env = {"PATH": os.environ["PATH"], "HOME": str(self.root), **self.env}
        ids: dict[str, Any] = {}
        if self.uid != os.geteuid():
            ids = {"user": self.uid, "group": self.gid,
                   "extra_groups": [self.fs_group] if self.fs_group is not None else []}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, **ids)

    def probe(self, kind: str) -> int:
        get = self.c[kind]["httpGet"]
        status, _ = http(f"http://127.0.0.1:{self.local_ports[get['port']]}{get['path']}")
        return status

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def database() -> Iterator[str]:
    url = os.environ.get("HEADROOM_TEST_DATABASE_URL")
    if not url:
        pytest.skip("HEADROOM_TEST_DATABASE_URL is not set (scripts/test sets it)")
    psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    name = f"helm_{secrets.token_hex(6)}"
    subprocess.run([psql, url, "-qc", f"CREATE DATABASE {name}"], check=True, timeout=60)
    base, _, _ = url.rpartition("/")
    yield f"{base}/{name}"
    subprocess.run([psql, url, "-qc", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"],
                   timeout=60)


def test_the_binaries_run_with_what_the_chart_renders(database: str) -> None:
    """Coordinator and agents started with the rendered commands, environment and mounted
    files: probes answer on their routes, each agent joins with the join token for its own
    node's credential and registers with its node's plan, and a job runs."""
    bin_dir = Path(os.environ.get("HEADROOM_BIN_DIR", ROOT / "target/debug")).resolve()
    docs = render("plans")
    user_token = f"hr_{secrets.token_hex(8)}_{secrets.token_hex(24)}"
    hashed = subprocess.run([str(bin_dir / "headroom"), "token", "hash"], input=user_token,
                            capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    # `headroom token hash` prints the entry's id and token_hash lines.
    tokens_toml = f'[[tokens]]\nname = "alice"\nrole = "user"\n{hashed}\n'
    given = {
        "headroom-database": {"url": database},
        "lab-tokens": {"tokens.toml": tokens_toml},
    }
    admin = base64.b64decode(find(docs, "Secret", "r-headroom-tokens")["data"]["admin-token"]).decode()
    pods: list[Pod] = []
    with tempfile.TemporaryDirectory(prefix="helm-e2e") as tmp:
        root = Path(tmp)
        # Jobs run as `nobody` (the tokens file maps alice to no Unix user).
        root.chmod(0o755)
        try:
            coord = Pod(find(docs, "Deployment"), docs, root / "coordinator", given, {})
            coord.start(bin_dir, root / "coordinator.log")
            pods.append(coord)
            wait_for("the coordinator's readiness probe", lambda: coord.probe("readinessProbe") == 200)
            assert coord.probe("livenessProbe") == 200
            assert coord.probe("startupProbe") == 200
            # The Service the agents' URL names leads to the coordinator's port.
            svc = find(docs, "Service", "r-headroom-coordinator")
            url = f"http://127.0.0.1:{coord.local_ports['http']}"
            rendered = env_of(container(find(docs, "DaemonSet")))["HEADROOM_COORDINATOR"]
            assert rendered == f"http://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
            assert svc["spec"]["ports"][0]["targetPort"] == "http"

            for node in ("gpu-07", "gpu-99"):
                # The init container first: the node's credential, then it ends.
                join = Pod(find(docs, "DaemonSet"), docs, root / node, given,
                           {"spec.nodeName": node}, init="join")
                join.env["HEADROOM_COORDINATOR"] = url
                join.start(bin_dir, root / f"{node}-join.log")
                assert join.proc is not None and join.proc.wait(timeout=60) == 0, \
                    (root / f"{node}-join.log").read_text()
                agent = Pod(find(docs, "DaemonSet"), docs, root / node, given,
                            {"spec.nodeName": node})
                agent.env["HEADROOM_COORDINATOR"] = url
                agent.start(bin_dir, root / f"{node}.log")
                pods.append(agent)
            for agent in pods[1:]:
                wait_for("an agent's readiness probe",
                         lambda: agent.probe("readinessProbe") == 200, timeout=90)
                assert agent.probe("livenessProbe") == 200

            status, nodes = http(f"{url}/v1/nodes", admin)
            assert status == 200, nodes
            plans = {n["name"]: n["plan"] for n in nodes}
            assert plans == {"gpu-07": "2,1", "gpu-99": "1,1"}
            # Each node has its own credential, kept in its data directory, and never in an
            # environment or command line.
            for node, agent in zip(("gpu-07", "gpu-99"), pods[1:]):
                cred = Path(agent.env["HEADROOM_DATA_DIR"]) / "node-token"
                assert cred.stat().st_mode & 0o777 == 0o600
                token = cred.read_text().strip()
                assert agent.proc is not None
                for what in ("environ", "cmdline"):
                    seen = Path(f"/proc/{agent.proc.pid}/{what}").read_bytes()
                    assert token.encode() not in seen
                # The agent's container has no join token to read.
                assert "HEADROOM_JOIN_TOKEN_FILE" not in agent.env
                assert "/etc/headroom/join" not in agent.mounts
            status, _ = http(f"{url}/v1/nodes", user_token)
            assert status == 200, "the tokens file's user token is taken"

            spec = {"spec": {"name": "helm-e2e", "command": ["sh", "-c", "echo from {x}"],
                             "grid": {"x": ["a", "b"]}}}
            status, body = http(f"{url}/v1/experiments", user_token, spec)
            assert status == 200, body
            exp = body["experiment"]

            def ended() -> Any:
                _, p = http(f"{url}/v1/progress?experiment={exp}", user_token)
                c = p["counts"]
                return c if c["succeeded"] + c["failed"] + c["cancelled"] == 2 else None

            counts = wait_for("the jobs to end", ended, timeout=90)
            assert counts["succeeded"] == 2, counts
        except BaseException:
            for log in sorted(root.glob("*.log")):
                print(f"==> {log.name}\n{log.read_text()[-4000:]}")
            raise
        finally:
            for p in reversed(pods):
                p.stop()


def test_the_claims_bound_reaches_the_coordinator() -> None:
    def coordinator_env(*extra: str) -> dict[str, str]:
        return env_of(container(find(render("default", *extra), "Deployment")))

    assert coordinator_env()["HEADROOM_MAX_CLAIMS"] == "12"
    assert coordinator_env("--set", "coordinator.maxClaims=0")["HEADROOM_MAX_CLAIMS"] == "0"


def test_the_mlflow_servers_an_admin_lists_reach_the_coordinator_and_none_by_default() -> None:
    def coordinator_env(*extra: str) -> dict[str, str]:
        return env_of(container(find(render("default", *extra), "Deployment")))

    assert "HEADROOM_MLFLOW_SERVERS" not in coordinator_env()
    env = coordinator_env("--set", "coordinator.mlflowServers={http://mlflow.lab:5000,https://m.example.org}")
    assert env["HEADROOM_MLFLOW_SERVERS"] == "http://mlflow.lab:5000,https://m.example.org"
    refused = run_helm("template", "r", str(CHART), "--set", "coordinator.mlflowServers={file:///etc}")
    assert refused.returncode != 0 and "mlflowServers" in refused.stderr, refused.stderr


def test_alerts_reach_the_coordinator_with_the_smtp_password_as_a_file() -> None:
    rendered = render(
        "default",
        "--set", "coordinator.alerts.webhookHosts={hooks.slack.com,10.0.0.5:8080}",
        "--set", "coordinator.alerts.smtp.url=smtp://alerts@relay.lab.org:587?tls=required",
        "--set", "coordinator.alerts.smtp.from=gpu@lab.org",
        "--set", "coordinator.alerts.smtp.passwordSecret=smtp-pass",
    )
    c = container(find(rendered, "Deployment"))
    env = env_of(c)
    assert env["HEADROOM_ALERT_WEBHOOK_HOSTS"] == "hooks.slack.com,10.0.0.5:8080"
    assert env["HEADROOM_SMTP_URL"] == "smtp://alerts@relay.lab.org:587?tls=required"
    assert env["HEADROOM_ALERT_FROM"] == "gpu@lab.org"
    assert env["HEADROOM_SMTP_PASSWORD_FILE"] == "/etc/headroom/smtp/password"
    assert any(m["mountPath"] == "/etc/headroom/smtp" for m in c["volumeMounts"])
    plain = env_of(container(find(render("default"), "Deployment")))
    assert not any(k.startswith(("HEADROOM_ALERT", "HEADROOM_SMTP")) for k in plain), plain
    # A password in the URL is refused by the schema: it belongs in the Secret.
    refused = run_helm(
        "template", "r", str(CHART), *values_args("default"),
        "--set", "coordinator.alerts.smtp.url=smtp://u:pw@relay:587",
    )
    assert refused.returncode != 0 and "/coordinator/alerts/smtp/url" in refused.stderr, refused.stderr
