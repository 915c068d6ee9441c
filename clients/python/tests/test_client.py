"""The client against a real coordinator and agent (fake GPUs): submit, wait, jobs,
attempts, logs, cancel, retry, nodes, plans and the mapping of API errors."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pandas as pd
import pytest

from headroom_client import (
    AsyncClient,
    BadRequestError,
    Client,
    ConflictError,
    ConnectionFailed,
    InvalidError,
    NotFoundError,
    load_spec,
)

from .conftest import TOKEN, free_port


def spec(name: str, command: list, **extra) -> dict:
    return {"name": name, "command": command, **extra}


def test_a_parameter_named_like_a_fixed_column_keeps_its_own_column(client: Client) -> None:
    # A grid axis named `node`: the export's `node` is where the attempt ran, the axis is
    # `params.node`, as jobs() spreads it.
    exp = client.submit(spec("axis-node", ["true"], grid={"node": ["alpha", "beta"]}))
    exp.wait(timeout=120)
    rows = exp.attempts(frame=False)
    assert sorted(r["params.node"] for r in rows) == ["alpha", "beta"], rows
    assert all(r["node"] not in ("alpha", "beta") and r["node"] for r in rows), rows
    frame = exp.attempts()
    assert sorted(frame["params.node"]) == ["alpha", "beta"]
    jobs = exp.jobs()
    assert sorted(jobs["params.node"]) == ["alpha", "beta"]
    assert list(frame.columns).count("node") == 1


def test_submit_a_yaml_file_wait_and_read_jobs_and_attempts(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "name: py-sweep\n"
        'command: ["sh", "-c", "echo lr={lr} bs={bs}"]\n'
        "grid:\n"
        "  lr: [1e-4, 0.01]\n"
        "  bs: [8]\n"
        "resources: {gpus: 1, memory: 1GiB}\n"
    )
    exp = client.submit(path)
    assert exp.id is not None
    assert exp.submitted is not None and exp.submitted.jobs == 2

    done = exp.wait(progress=True, timeout=120)
    assert done.counts.succeeded == 2, done.counts

    jobs = exp.jobs(frame=False)
    assert sorted(j["params"]["lr"] for j in jobs) == [1e-4, 0.01]
    assert all(j["state"] == "succeeded" for j in jobs)

    frame = exp.jobs()  # pandas is installed: a DataFrame, parameters spread into columns
    assert isinstance(frame, pd.DataFrame)
    assert set(frame["params.lr"]) == {1e-4, 0.01}

    rows = exp.attempts(frame=False)
    assert len(rows) == 2
    assert all(r["success"] is True for r in rows), rows
    attempts = exp.attempts()
    assert isinstance(attempts, pd.DataFrame) and len(attempts) == 2
    # Alone on fake GPUs: measured, neither contaminated nor throttled, so both are clean.
    assert all(r["energy_source"] == "counter" and r["throttled_power"] is False for r in rows), rows
    assert len(exp.attempts(clean_only=True, frame=False)) == 2

    detail = client.job(jobs[0]["id"])
    assert detail.attempts_detail[-1].success is True
    log = "".join(client.logs(detail.id))
    assert f"lr={detail.params['lr']}" in log


def test_yaml_reads_numbers_and_words_as_the_cli_does(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: n\ncommand: [x]\ngrid: {lr: [1e-4], flag: [yes, on], n: [3]}\n")
    doc = load_spec(path)
    assert doc["grid"] == {"lr": [1e-4], "flag": ["yes", "on"], "n": [3]}


def test_logs_follow_streams_until_the_attempt_ends(client: Client) -> None:
    exp = client.submit(
        spec(
            "py-follow",
            ["sh", "-c", "echo first; sleep 1; echo second; sleep 1; echo third"],
            resources={"gpus": 0},
        )
    )
    job = client.jobs(exp.id, frame=False)[0]["id"]
    chunks = list(client.logs(job, follow=True))
    text = "".join(chunks)
    assert text.splitlines() == ["first", "second", "third"], chunks
    # It followed: the lines arrived over more than one read.
    assert len(chunks) >= 2, chunks
    assert client.job(job).state == "succeeded"


def test_cancel_and_retry(client: Client) -> None:
    exp = client.submit(spec("py-cancel", ["sleep", "60"], resources={"gpus": 0}))
    job = client.jobs(exp.id, frame=False)[0]["id"]
    # Retrying an unfinished job is refused by state.
    with pytest.raises(ConflictError) as e:
        client.retry(job)
    assert e.value.status == 409 and e.value.code == "conflict"

    assert client.cancel(exp.id).cancelled == 1
    done = exp.wait(timeout=60)
    assert done.counts.cancelled == 1

    assert client.retry(job).state == "retrying"
    assert client.cancel(job).cancelled == 1  # a job id works too
    assert client.job(job).state == "cancelled"


def test_nodes_and_plans(client: Client) -> None:
    nodes = client.nodes()
    node = next(n for n in nodes if n.name == "py-node")
    assert len(node.gpus) == 2 and node.gpus[0].total_mib == 24 * 1024
    view = client.set_plan("py-node", "2,1")
    assert view.plan == "2,1"
    assert [g.slots for g in view.gpus] == [2, 1]
    with pytest.raises(InvalidError) as e:
        client.set_plan("py-node", "2,x")
    assert e.value.field == "plan"
    with pytest.raises(NotFoundError):
        client.set_plan("no-such-node", "1")


def test_api_errors_raise_typed_exceptions_with_code_and_field(client: Client) -> None:
    with pytest.raises(InvalidError) as e:
        client.submit(spec("py-bad", ["x"], resources={"gpus": 1, "memory": "lots"}))
    assert e.value.status == 422
    assert e.value.code == "invalid"
    assert e.value.field == "resources.memory"

    with pytest.raises(BadRequestError) as e:
        client.job("not-an-id")
    assert e.value.code == "bad_request"

    with pytest.raises(NotFoundError) as e:
        client.job(str(uuid.uuid4()))
    assert e.value.code == "not_found" and e.value.status == 404

    with pytest.raises(InvalidError) as e:
        client.jobs(state="sleeping", frame=False)
    assert e.value.field == "state"


def test_an_unreachable_coordinator_names_its_address() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, TOKEN, timeout=2) as c:
        with pytest.raises(ConnectionFailed) as e:
            c.health()
    assert url in str(e.value)


def test_dry_run_previews_without_storing(client: Client) -> None:
    before = len(client.experiments())
    exp = client.submit(spec("py-dry", ["echo", "{x}"], grid={"x": [1, 2, 3]}), dry_run=True)
    assert exp.id is None
    assert exp.submitted is not None and exp.submitted.jobs == 3
    assert [p.argv for p in exp.submitted.preview or []] == [["echo", "1"], ["echo", "2"], ["echo", "3"]]
    assert len(client.experiments()) == before


async def test_async_client_submits_waits_and_follows(cluster: str) -> None:
    async with AsyncClient(cluster, TOKEN) as c:
        exp = await c.submit(
            spec("py-async", ["sh", "-c", "echo hello from async"], resources={"gpus": 0})
        )
        done = await exp.wait(timeout=60)
        assert done.counts.succeeded == 1
        jobs = await exp.jobs(frame=False)
        text = "".join([t async for t in c.logs(jobs[0]["id"], follow=True)])
        assert text == "hello from async\n"
        with pytest.raises(NotFoundError):
            await c.job(str(uuid.uuid4()))
        assert json.loads(json.dumps(await exp.attempts(frame=False), default=str))[0]["success"] is True


def test_the_readme_notebook_example_runs(client: Client) -> None:
    """The README's example on the shipped quickstart spec (12 short jobs of fake GPU memory)."""
    from .conftest import REPO

    exp = client.submit(REPO / "examples" / "quickstart.yaml")
    assert exp.submitted is not None and exp.submitted.jobs == 12
    done = exp.wait(progress=True, timeout=300)
    assert done.counts.succeeded == 12, done.counts
    df = exp.attempts()
    means = df.groupby("batch_size")[["duration_s", "peak_mem_mib"]].mean()
    assert sorted(means.index) == [32, 64]
    # The fake job held 1 GiB of fake GPU memory, and the agent measured it.
    assert (df["peak_mem_mib"] >= 1024).all(), df["peak_mem_mib"].tolist()


def test_a_local_up_token_is_found_by_the_server_address(tmp_path, monkeypatch):
    """Without a token or HEADROOM_TOKEN, the client uses the one a local ``headroom up`` of
    this account left for that address, and none for another address."""
    from headroom_client.client import _headers, local_token_path

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HEADROOM_TOKEN", raising=False)
    monkeypatch.delenv("HEADROOM_TOKEN_FILE", raising=False)
    path = local_token_path("http://localhost:7999")
    assert path == str(tmp_path / ".headroom" / "local" / "127.0.0.1_7999")
    os.makedirs(os.path.dirname(path), mode=0o700)
    with open(path, "w") as f:
        f.write("local-admin-secret\n")
    assert _headers(None, "http://127.0.0.1:7999")["authorization"] == "Bearer local-admin-secret"
    assert "authorization" not in _headers(None, "http://127.0.0.1:8000")
    assert _headers("given", "http://127.0.0.1:7999")["authorization"] == "Bearer given"


def test_the_client_reads_the_clis_variables(cluster: str, tmp_path, monkeypatch) -> None:
    """HEADROOM_SERVER and HEADROOM_TOKEN_FILE, as the CLI reads them, reach the coordinator
    with no argument given."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.delenv("HEADROOM_TOKEN", raising=False)
    monkeypatch.delenv("HEADROOM_URL", raising=False)
    monkeypatch.setenv("HEADROOM_SERVER", cluster)
    monkeypatch.setenv("HEADROOM_TOKEN_FILE", str(token_file))
    with Client() as c:
        assert str(c._http.base_url).rstrip("/") == cluster.rstrip("/")
        assert isinstance(c.experiments(), list)
