"""Starts a real ``headroom-coordinator`` (embedded store) and ``headroom-agent`` (fake GPUs)
on free ports, as the Rust integration tests do. The binaries come from
``$HEADROOM_BIN_DIR`` or the workspace's ``target/debug`` (``cargo build --workspace --bins``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

import httpx
import pytest

from headroom_client import Client

REPO = Path(__file__).resolve().parents[3]
BIN_DIR = Path(os.environ.get("HEADROOM_BIN_DIR", REPO / "target" / "debug"))
#: Sent by every test client and by the fuzzer; the coordinator needs none on loopback today.
TOKEN = os.environ.get("HEADROOM_TEST_TOKEN", "headroom-test-token")


def binary(name: str) -> str:
    path = BIN_DIR / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `cargo build --workspace --bins` first")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, args: List[str], log: Path, env: Optional[dict] = None) -> None:
        self.log = log
        self._file = open(log, "ab")
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._file.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_healthy(url: str, proc: Proc, timeout: float = 30.0) -> None:
    """Until the coordinator answers (it binds within milliseconds; start-up, not work)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            pytest.fail(f"the coordinator exited:\n{proc.output()}")
        try:
            if httpx.get(f"{url}/v1/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    pytest.fail(f"the coordinator did not answer within {timeout}s:\n{proc.output()}")


def start_coordinator(dir: Path, *extra: str) -> "tuple[str, Proc]":
    dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = Proc(
        [
            binary("headroom-coordinator"),
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(dir / "coord"),
            *extra,
        ],
        dir / "coord.log",
    )
    wait_healthy(url, proc)
    return url, proc


def agent_token(url: str, admin_token: str, node: str) -> str:
    """A token of role `agent` for `node`, made with the admin token."""
    made = httpx.post(
        f"{url}/v1/tokens",
        json={"name": node, "role": "agent"},
        headers={"authorization": f"Bearer {admin_token}"},
    )
    assert made.status_code == 200, made.text
    token: str = made.json()["token"]
    return token


@contextlib.contextmanager
def running_cluster(
    node: str,
    fake_gpus: str,
    plan: Optional[str] = None,
    *coordinator_flags: str,
    admin_token: Optional[str] = None,
) -> Iterator[str]:
    """A coordinator (with `coordinator_flags`) and one agent with `fake_gpus` (and `plan`);
    yields the coordinator's URL. Its folder is one other users may pass through: an agent
    running as root (CI) runs jobs as ``nobody``, and they reach the fake GPUs' folder in the
    agent's data directory. With `admin_token` the coordinator needs tokens (users, shares,
    caps): it starts with that bootstrap admin token, and the agent with a token of its own."""
    dir = Path(tempfile.mkdtemp(prefix=f"headroom-{node}-"))
    os.chmod(dir, 0o711)
    if admin_token is not None:
        coordinator_flags = (*coordinator_flags, "--admin-token", admin_token)
    url, coord = start_coordinator(dir, *coordinator_flags)
    # Jobs find `headroom-fake-job` and friends beside the binaries.
    env = {"PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        if admin_token is not None:
            env["HEADROOM_AGENT_TOKEN"] = agent_token(url, admin_token, node)
    except BaseException:
        coord.stop()
        shutil.rmtree(dir, ignore_errors=True)
        raise
    agent = Proc(
        [
            binary("headroom-agent"),
            "--coordinator",
            url,
            "--node",
            node,
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            fake_gpus,
            "--data-dir",
            str(dir / "agent"),
        ],
        dir / "agent.log",
        env=env,
    )
    try:
        # The agent registers at once; wait for it through the API the client uses.
        with Client(url, admin_token or TOKEN) as c:
            deadline = time.monotonic() + 30
            while not any(n.alive for n in c.nodes()):
                if agent.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the agent did not register:\n{agent.output()}")
                c.progress(after=c.progress().version, timeout_ms=200)
            if plan is not None:
                c.set_plan(node, plan)
        yield url
    finally:
        agent.stop()
        coord.stop()
        if os.environ.get("HEADROOM_KEEP_LOGS"):
            shutil.copytree(dir, Path(os.environ["HEADROOM_KEEP_LOGS"]) / node, dirs_exist_ok=True)
        shutil.rmtree(dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A coordinator and one agent with two fake 24 GiB GPUs; yields the coordinator's URL."""
    with running_cluster("py-node", "2x24GiB") as url:
        yield url


@pytest.fixture()
def client(cluster: str) -> Iterator[Client]:
    with Client(cluster, TOKEN) as c:
        yield c
