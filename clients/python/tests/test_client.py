"""The client against a real coordinator and agent (fake GPUs): submit, wait, jobs,
attempts, logs, cancel, retry, retry_failed, export, nodes, plans, telemetry, experiments by
name, the token as the CLI finds it, the mapping of API errors, and the frames' columns."""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pandas as pd
import pytest

from headroom_client import (
    AsyncClient,
    BadRequestError,
    Client,
    ConflictError,
    ConnectionFailed,
    HeadroomError,
    InvalidError,
    JobsFailedError,
    NotFoundError,
    TokenFileError,
    load_spec,
)

from .conftest import TOKEN, free_port, start_coordinator


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
    assert sorted(j["params.lr"] for j in jobs) == [1e-4, 0.01]
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


def test_a_spec_of_nested_aliases_is_refused_before_it_expands(tmp_path: Path) -> None:
    # 562 bytes that expand to 10**9 values (the "billion laughs"): refused at once, naming
    # the file, rather than a MemoryError; a spec that reuses a block with an alias is fine.
    lines = ["name: laughs", "command: [x]", 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        refs = ",".join(f"*a{i - 1}" for _ in range(10))
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append("grid: {x: *a8}")
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    with pytest.raises(ValueError, match="aliases"):
        load_spec(path)
    assert time.monotonic() - started < 10
    reuse = tmp_path / "reuse.yaml"
    reuse.write_text("name: r\ncommand: [x]\nenv: &e {A: '1'}\ncolocate_env: *e\n")
    assert load_spec(reuse)["colocate_env"] == {"A": "1"}


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


def test_a_log_over_a_megabyte_is_read_whole(client: Client) -> None:
    # The server answers a megabyte at a time: a log of 2.5 MB comes back whole.
    exp = client.submit(
        spec(
            "py-long-log",
            ["sh", "-c", "head -c 2500000 /dev/zero | tr '\\0' y; echo; echo tail-line"],
            resources={"gpus": 0},
        )
    )
    exp.wait(timeout=120)
    job = client.jobs(exp.id, frame=False)[0]["id"]
    text = "".join(client.logs(job))
    assert text.count("y") == 2_500_000
    assert text.endswith("tail-line\n")


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


def running_job(client: Client, exp: str) -> str:
    """The id of the experiment's one job, once it runs."""
    job = client.jobs(exp, frame=False)[0]["id"]
    deadline = time.monotonic() + 30
    while client.job(job).state != "running":
        assert time.monotonic() < deadline, "the job never ran"
        time.sleep(0.1)
    return str(job)


def test_a_running_job_is_requeued_after_its_checkpoint_signal_spending_no_attempt(
    client: Client,
) -> None:
    # Saves its step on SIGUSR1 and exits; a later attempt reads it back.
    script = (
        'step=$(cat "$HEADROOM_JOB_DIR/step" 2>/dev/null || echo 0); '
        'echo "from $step, restart $HEADROOM_RESTART_COUNT $HEADROOM_STOP_REASON"; '
        "trap 'echo 5 > \"$HEADROOM_JOB_DIR/step\"; exit 0' USR1; "
        '[ "$step" = 0 ] && while true; do sleep 0.05; done; exit 0'
    )
    exp = client.submit(
        spec(
            "py-requeue",
            ["sh", "-c", script],
            resources={"gpus": 0},
            retry={"max_attempts": 1},
            checkpoint={"signal": "USR1", "lead": "20s"},
        )
    )
    job = running_job(client, exp.id)
    assert client.cancel_job(job, requeue=True).requeued == 1
    done = exp.wait(timeout=60)
    assert done.counts.succeeded == 1
    attempts = client.attempts(exp.id, frame=False)
    assert [a["failure_class"] for a in attempts] == ["requeued", None]
    # A stopped run's figures compare with no finished one's: not clean.
    clean = client.attempts(exp.id, clean_only=True, frame=False)
    assert [a["failure_class"] for a in clean] == [None]
    assert "from 5, restart 1 requeued" in "".join(client.logs(job))
    # A job that runs nothing has nothing to requeue.
    assert client.cancel_job(job, requeue=True).requeued == 0


def test_a_cancel_during_a_requeue_s_checkpoint_lead_stops_the_job_at_once(
    client: Client,
) -> None:
    # Ignores its checkpoint signal: without the cancel it would run out its 60 s lead.
    exp = client.submit(
        spec(
            "py-requeue-cancel",
            ["sh", "-c", "trap '' USR1; while true; do sleep 0.05; done"],
            resources={"gpus": 0},
            checkpoint={"signal": "USR1", "lead": "60s"},
        )
    )
    job = running_job(client, exp.id)
    assert client.cancel_job(job, requeue=True).requeued == 1
    time.sleep(1.0)
    started = time.monotonic()
    assert client.cancel_job(job).cancelled == 1
    # The job is cancelled at once; its attempt ends once its processes are stopped.
    while client.job(job).attempts_detail[0].phase != "ended":
        assert time.monotonic() - started < 20, "the cancel waited for the checkpoint lead"
        time.sleep(0.1)
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
    means = df.groupby("params.batch_size")[["duration_s", "peak_mem_mib"]].mean()
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


# ---- the token, as the CLI finds it ----


def _sent_authorization(make) -> "str | None":
    """The Authorization header a client built by ``make(transport)`` sends."""
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"status": "ok", "schema_version": 1})

    with make(httpx.MockTransport(answer)) as c:
        c.health()
    return seen[0]


@pytest.fixture()
def no_token_env(tmp_path, monkeypatch):
    """No token variable, and a HOME without a local `up`'s token."""
    for var in ("HEADROOM_TOKEN", "HEADROOM_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_a_refused_token_left_by_a_local_up_is_named_by_its_file(tmp_path, no_token_env) -> None:
    """A coordinator that refuses the token a local ``headroom up`` left for its address (an
    ``up`` there stopped without removing it): the error names the file; a token given
    outright is not blamed on it."""
    from headroom_client import UnauthorizedError, local_token_path

    url, coord = start_coordinator(tmp_path / "c", "--admin-token", "py-admin-token-0123456789abcdefgh")
    try:
        path = local_token_path(url)
        assert path is not None
        os.makedirs(os.path.dirname(path), mode=0o700)
        with open(path, "w") as f:
            f.write("hr_stale0_0123456789abcdef\n")
        with Client(url) as c, pytest.raises(UnauthorizedError) as left:
            c.experiments()
        assert path in str(left.value) and "left by a `headroom up`" in str(left.value)
        with Client(url, "hr_given0_0123456789abcdef") as c, pytest.raises(
            UnauthorizedError
        ) as given:
            c.experiments()
        assert path not in str(given.value)
    finally:
        coord.stop()


def test_a_token_file_argument_is_read_first_line_and_wins_over_the_variables(
    tmp_path, no_token_env
) -> None:
    path = tmp_path / "token"
    path.write_text("  file-secret  \nsecond line\n")
    no_token_env.setenv("HEADROOM_TOKEN", "env-secret")
    url = "http://127.0.0.1:7999"
    assert (
        _sent_authorization(lambda t: Client(url, token_file=path, transport=t))
        == "Bearer file-secret"
    )
    # A token given outright comes before everything; both at once is a mistake.
    assert _sent_authorization(lambda t: Client(url, "given", transport=t)) == "Bearer given"
    with pytest.raises(ValueError, match="token or token_file"):
        Client(url, "given", token_file=path)
    # Without arguments: HEADROOM_TOKEN before HEADROOM_TOKEN_FILE, as the CLI.
    other = tmp_path / "other"
    other.write_text("other-secret\n")
    no_token_env.setenv("HEADROOM_TOKEN_FILE", str(other))
    assert _sent_authorization(lambda t: Client(url, transport=t)) == "Bearer env-secret"
    no_token_env.delenv("HEADROOM_TOKEN")
    assert _sent_authorization(lambda t: Client(url, transport=t)) == "Bearer other-secret"


async def test_the_async_client_takes_a_token_file_too(tmp_path, no_token_env) -> None:
    path = tmp_path / "token"
    path.write_text("async-secret\n")
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"status": "ok", "schema_version": 1})

    async with AsyncClient(
        "http://127.0.0.1:7999", token_file=str(path), transport=httpx.MockTransport(answer)
    ) as c:
        await c.health()
    assert seen == ["Bearer async-secret"]


def test_a_token_file_that_cannot_be_read_is_an_error_naming_it(tmp_path, no_token_env) -> None:
    missing = tmp_path / "no-such-token"
    with pytest.raises(TokenFileError) as e:
        Client("http://127.0.0.1:7999", token_file=missing)
    assert e.value.path == str(missing)
    assert str(missing) in str(e.value) and "token_file" in str(e.value)
    assert "cannot be read" in str(e.value)
    assert isinstance(e.value, HeadroomError)

    # The variable's file: the message names the variable and the file.
    no_token_env.setenv("HEADROOM_TOKEN_FILE", str(missing))
    with pytest.raises(TokenFileError) as e:
        Client("http://127.0.0.1:7999")
    assert "HEADROOM_TOKEN_FILE" in str(e.value) and str(missing) in str(e.value)

    # A directory, and a file whose first line is blank.
    with pytest.raises(TokenFileError, match="cannot be read"):
        Client("http://127.0.0.1:7999", token_file=tmp_path)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(TokenFileError, match="is empty") as e:
        Client("http://127.0.0.1:7999", token_file=empty)
    assert str(empty) in str(e.value)


# ---- experiments by name ----


def test_experiments_are_named_by_name_wherever_an_id_is_taken(client: Client) -> None:
    """wait, progress, jobs, job_list, attempts, experiment and cancel take a name: the
    newest experiment of that name, as the CLI resolves it (the API takes ids only)."""
    name = f"py-named-{uuid.uuid4().hex[:8]}"
    older = client.submit(spec(name, ["true"], resources={"gpus": 0}))
    older.wait(timeout=60)
    newer = client.submit(spec(name, ["echo", "{x}"], grid={"x": [1, 2]}, resources={"gpus": 0}))

    done = client.wait(name, timeout=60)
    assert done.counts.total == 2 and done.counts.succeeded == 2, done.counts
    assert client.progress(name).counts.total == 2
    jobs = client.jobs(name, frame=False)
    assert len(jobs) == 2 and {j["experiment"] for j in jobs} == {newer.id}
    assert {j.experiment for j in client.job_list(name, state="succeeded")} == {newer.id}
    assert set(client.attempts(name)["job_id"]) == {j["id"] for j in jobs}
    assert client.experiment(name).id == newer.id
    assert client.experiment(name).summary().name == name

    # cancel: the newest of the name, now a running one.
    running = client.submit(spec(name, ["sleep", "60"], resources={"gpus": 0}))
    assert client.cancel(name).cancelled == 1
    assert client.wait(name, timeout=60).counts.cancelled == 1
    assert client.experiment(name).id == running.id
    assert client.cancel_experiment(name).cancelled == 0

    with pytest.raises(NotFoundError) as e:
        client.jobs(f"no-such-{name}")
    assert e.value.field == "experiment" and f"no-such-{name}" in str(e.value)


async def test_the_async_client_takes_names_too(cluster: str, client: Client) -> None:
    name = f"py-async-named-{uuid.uuid4().hex[:8]}"
    exp = client.submit(spec(name, ["true"], resources={"gpus": 0}))
    async with AsyncClient(cluster, TOKEN) as c:
        assert (await c.wait(name, timeout=60)).counts.succeeded == 1
        named = c.experiment(name)
        assert (await named.wait(timeout=60)).counts.succeeded == 1
        assert named.id == exp.id
        assert [j["experiment"] for j in await c.jobs(name, frame=False)] == [exp.id]
        assert len(await named.attempts(frame=False)) == 1
        with pytest.raises(NotFoundError):
            await c.experiment(f"no-such-{name}").jobs()


# ---- dates ----


def test_dates_are_datetimes_in_records_and_datetime64_in_frames(client: Client) -> None:
    exp = client.submit(spec("py-dates", ["true"], resources={"gpus": 0}))
    exp.wait(timeout=60)
    job = exp.jobs(frame=False)[0]
    assert isinstance(job["created_at"], datetime) and job["created_at"].tzinfo is not None
    row = exp.attempts(frame=False)[0]
    assert isinstance(row["started_at"], datetime) and isinstance(row["ended_at"], datetime)
    assert row["started_at"] <= row["ended_at"]
    jobs = exp.jobs()
    assert str(jobs["created_at"].dt.tz) == "UTC"
    attempts = exp.attempts()
    for col in ("started_at", "ended_at"):
        assert pd.api.types.is_datetime64_any_dtype(attempts[col]), attempts.dtypes
    assert (attempts["ended_at"] >= attempts["started_at"]).all()


# ---- telemetry ----


def test_gpu_telemetry_as_a_series_and_a_frame(client: Client) -> None:
    # The agent samples its fake GPUs every second and ships them with its heartbeats.
    deadline = time.monotonic() + 40
    while not (series := client.gpu_telemetry("py-node", 1, since=timedelta(minutes=30))).samples:
        assert time.monotonic() < deadline, "no telemetry of py-node GPU 1"
        client.progress(after=client.progress().version, timeout_ms=1000)
    assert series.node == "py-node" and series.gpu == 1
    first = series.samples[0]
    assert first.gpu == 1 and first.total_mib == 24 * 1024
    assert isinstance(first.at, datetime) and first.at.tzinfo is not None
    ats = [s.at for s in series.samples]
    assert ats == sorted(ats)

    df = client.gpu_telemetry_frame("py-node", 1, since=first.at, until=ats[-1])
    assert len(df) == len(series.samples)
    assert list(df.columns[:3]) == ["node", "gpu", "at"]
    assert str(df["at"].dt.tz) == "UTC"
    assert df["at"].iloc[0] == pd.Timestamp(first.at)
    assert (df["total_mib"] == 24 * 1024).all() and df["power_w"].dtype == "float64"
    assert client.gpu_telemetry("py-node", 1, limit=1).samples[0].at == max(
        s.at for s in client.gpu_telemetry("py-node", 1).samples
    )

    # A window before any sample: no rows, the same columns and types.
    empty = client.gpu_telemetry_frame(
        "py-node", 1, since=datetime(2000, 1, 1, tzinfo=timezone.utc), until="2000-01-02T00:00:00Z"
    )
    assert empty.empty and list(empty.columns) == list(df.columns)
    assert str(empty["at"].dtype) == str(df["at"].dtype)
    with pytest.raises(InvalidError) as e:
        client.gpu_telemetry("py-node", 1, since=timedelta(minutes=1), until=timedelta(minutes=2))
    assert e.value.field == "since"


def test_attempt_telemetry_covers_its_run(client: Client) -> None:
    exp = client.submit(
        spec(
            "py-telemetry",
            ["headroom-fake-job", "--mem", "1GiB", "--seconds", "2"],
            resources={"gpus": 1, "memory": "2GiB"},
        )
    )
    assert exp.wait(timeout=120).counts.succeeded == 1
    attempt = exp.attempts(frame=False)[0]["attempt_id"]
    # Samples reach the coordinator with the agent's next heartbeats.
    deadline = time.monotonic() + 40
    while not any((t := client.attempt_telemetry(attempt)).gpus[0].samples):
        assert time.monotonic() < deadline, f"no telemetry of attempt {attempt}"
        client.progress(after=client.progress().version, timeout_ms=1000)
    view = client.attempt(attempt)
    assert t.attempt == attempt and t.node == "py-node"
    assert [g.gpu for g in t.gpus] == view.gpus
    assert t.from_ is not None and t.to is not None and t.from_ <= t.to
    samples = t.gpus[0].samples
    assert all(t.from_ <= s.at <= t.to for s in samples)
    # The fake job held 1 GiB of the fake GPU while it ran.
    assert max(s.used_mib or 0 for s in samples) >= 1024

    df = client.attempt_telemetry_frame(attempt)
    assert list(df.columns[:4]) == ["attempt", "node", "gpu", "at"]
    assert set(df["attempt"]) == {attempt} and len(df) == len(samples)
    assert pd.api.types.is_datetime64_any_dtype(df["at"])
    assert df["used_mib"].max() >= 1024
    assert client.attempt_telemetry(attempt, limit=1).gpus[0].samples == samples[-1:]


async def test_the_async_client_reads_telemetry(cluster: str) -> None:
    async with AsyncClient(cluster, TOKEN) as c:
        series = await c.gpu_telemetry("py-node", 0, since=timedelta(hours=1))
        assert series.node == "py-node" and series.gpu == 0
        df = await c.gpu_telemetry_frame("py-node", 0, since=timedelta(hours=1))
        assert len(df) >= len(series.samples) and "at" in df.columns
        with pytest.raises(NotFoundError):
            await c.attempt_telemetry(str(uuid.uuid4()))


# ---- wait(raise_on_failure=True) ----


def test_wait_raises_on_failure_with_the_failed_jobs_and_their_classes(client: Client) -> None:
    name = f"py-fails-{uuid.uuid4().hex[:8]}"
    command = ["sh", "-c", "exit {code}"]
    exp = client.submit(spec(name, command, grid={"code": [0, 3, 4]}, resources={"gpus": 0}))
    with pytest.raises(JobsFailedError) as e:
        exp.wait(timeout=60, raise_on_failure=True)
    failed = {j["id"] for j in exp.jobs(state="failed", frame=False)}
    assert len(failed) == 2
    assert e.value.failures == {job: "nonzero" for job in failed}
    assert sorted(e.value.job_ids) == sorted(failed)
    assert e.value.experiment == exp.id
    assert e.value.progress.counts.failed == 2 and e.value.progress.counts.succeeded == 1
    assert isinstance(e.value, HeadroomError) and e.value.code == "jobs_failed"
    assert "2 of 3 jobs" in str(e.value) and "nonzero: 2" in str(e.value)

    # By name too; without the option, wait returns the counts.
    with pytest.raises(JobsFailedError):
        client.wait(name, timeout=60, raise_on_failure=True)
    assert client.wait(name, timeout=60).counts.failed == 2

    ok = client.submit(spec(f"{name}-ok", ["true"], resources={"gpus": 0}))
    assert ok.wait(timeout=60, raise_on_failure=True).counts.succeeded == 1


async def test_the_async_wait_raises_on_failure(cluster: str) -> None:
    async with AsyncClient(cluster, TOKEN) as c:
        exp = await c.submit(spec("py-async-fails", ["false"], resources={"gpus": 0}))
        with pytest.raises(JobsFailedError) as e:
            await exp.wait(timeout=60, raise_on_failure=True)
        jobs = await exp.jobs(frame=False)
        assert e.value.failures == {jobs[0]["id"]: "nonzero"}


def _tls_front(backend: str, dir: Path) -> "tuple[str, Path]":
    """A TLS front for the coordinator at ``backend``, as a lab's proxy puts one: a
    certificate for 127.0.0.1 signed by a CA of the test's own; its URL and the CA's PEM."""
    import asyncio
    import ssl
    import subprocess
    import threading

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=dir, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "1", "-subj", "/CN=headroom test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
            "-subj", "/CN=127.0.0.1")
    (dir / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "srv.pem", "-days", "1", "-extfile", "ext")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(dir / "srv.pem", dir / "srv.key")
    host, port = backend.removeprefix("http://").split(":")
    started: "list[int]" = []
    ready = threading.Event()

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def serve() -> None:
        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            sr, sw = await asyncio.open_connection(host, int(port))
            await asyncio.gather(pipe(cr, sw), pipe(sr, cw))

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
        started.append(server.sockets[0].getsockname()[1])
        ready.set()
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    assert ready.wait(30)
    return f"https://127.0.0.1:{started[0]}", dir / "ca.pem"


def test_an_https_coordinator_is_reached_with_its_ca(cluster: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HEADROOM_CA_FILE", raising=False)
    url, ca = _tls_front(cluster, tmp_path)
    with Client(url, TOKEN, ca_file=ca) as c:
        assert any(n.alive for n in c.nodes())
    monkeypatch.setenv("HEADROOM_CA_FILE", str(ca))
    with Client(url, TOKEN) as c:
        assert c.progress().version >= 0
    monkeypatch.delenv("HEADROOM_CA_FILE")
    with Client(url, TOKEN) as c:
        with pytest.raises(ConnectionFailed, match="ca_file"):
            c.nodes()
    with pytest.raises(ValueError, match="ca_file"):
        Client(url, TOKEN, ca_file=tmp_path / "ext")


# ---- stable columns, the export, retry_failed ----

ATTEMPT_KEYS = ["experiment", "job_id", "job_index", "config", "run", "attempt", "attempt_id"]


def _without_params(columns) -> list:
    return [c for c in columns if not c.startswith("params.")]


def test_frames_have_the_same_columns_and_dtypes_whatever_the_data(client: Client) -> None:
    """Every parameter is `params.NAME` in jobs() and attempts() alike, after the columns
    that name the job or attempt; the other columns and their dtypes do not change with the
    parameters, the values or the number of rows (none included)."""
    cpu, gpu = {"gpus": 0}, {"gpus": 1, "memory": "1GiB"}
    a = client.submit(spec("py-cols-a", ["true"], grid={"lr": [0.5, 1], "flag": [True]}, resources=cpu))
    # Parameters named like the attempt's own columns.
    b = client.submit(spec("py-cols-b", ["true"], grid={"node": ["x"], "success": [7]}, resources=gpu))
    a.wait(timeout=120)
    b.wait(timeout=120)

    fa, fb = a.attempts(), b.attempts()
    assert list(fa.columns[:7]) == ATTEMPT_KEYS
    assert list(fa.columns[7:9]) == ["params.flag", "params.lr"] and fa.columns[9] == "success"
    assert list(fb.columns[7:9]) == ["params.node", "params.success"] and fb.columns[9] == "success"
    assert _without_params(fa.columns) == _without_params(fb.columns)
    assert fa.drop(columns=["params.flag", "params.lr"]).dtypes.equals(
        fb.drop(columns=["params.node", "params.success"]).dtypes
    )
    assert str(fa["job_index"].dtype) == "Int64" and str(fa["success"].dtype) == "boolean"
    assert str(fa["started_at"].dtype) == "datetime64[us, UTC]"
    assert fa["energy_j"].dtype == "float64" and fa["duration_s"].dtype == "float64"
    assert fa["gpus"].tolist() == [[], []] and fb["gpus"].tolist() in ([[0]], [[1]])
    assert sorted(fa["params.lr"]) == [0.5, 1.0] and fa["params.flag"].tolist() == [True, True]
    assert fb["params.success"].tolist() == [7] and fb["success"].tolist() == [True]

    # Records: the same keys, in the same order, as the frame's columns.
    rows = a.attempts(frame=False)
    assert all(list(r) == list(fa.columns) for r in rows)
    assert isinstance(rows[0]["started_at"], datetime) and rows[0]["gpus"] == []

    # No rows: every fixed column, typed all the same.
    empty = client.attempts(str(uuid.uuid4()))
    assert empty.empty and list(empty.columns) == _without_params(fa.columns)
    assert empty.dtypes.equals(fa.drop(columns=["params.flag", "params.lr"]).dtypes)

    ja, jb = a.jobs(), b.jobs()
    keys = ["id", "experiment", "experiment_name", "index", "config", "run"]
    assert list(ja.columns[:6]) == keys and list(ja.columns[6:8]) == ["params.flag", "params.lr"]
    assert list(jb.columns[6:8]) == ["params.node", "params.success"]
    assert _without_params(ja.columns) == _without_params(jb.columns)
    assert str(ja["created_at"].dtype) == "datetime64[us, UTC]"
    assert ja["index"].dtype == "int64" and str(ja["estimate_mib"].dtype) == "Int64"
    none = client.jobs(a.id, state="failed")
    assert none.empty and list(none.columns) == _without_params(ja.columns)
    jrows = a.jobs(frame=False)
    assert all(list(r) == list(ja.columns) for r in jrows) and "params" not in jrows[0]


def test_export_as_csv_and_as_json_and_to_a_file(client: Client, tmp_path: Path) -> None:
    name = f"py-export-{uuid.uuid4().hex[:8]}"
    exp = client.submit(spec(name, ["true"], grid={"lr": [0.1, 0.2]}, resources={"gpus": 0}))
    exp.wait(timeout=120)

    text = client.export(name)
    lines = text.splitlines()
    assert lines[0].startswith("experiment,job_id,job_index") and len(lines) == 3
    assert exp.export(path=tmp_path / "a.csv") == text
    assert (tmp_path / "a.csv").read_text() == text

    rows = client.export(name, format="json", path=tmp_path / "a.json")
    assert len(rows) == 2 and sorted(r["params"]["lr"] for r in rows) == [0.1, 0.2]
    assert all(isinstance(r["started_at"], str) and r["experiment"] == name for r in rows)
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["rows"] == rows and doc["columns"][0]["name"] == "experiment"
    assert {c["name"]: c["type"] for c in doc["columns"]}["energy_j"] == "number"
    assert exp.export(format="json", clean_only=True) == rows  # alone, CPU-only: clean
    with pytest.raises(ValueError, match="format"):
        client.export(name, format="xml")  # type: ignore[call-overload]


def _paging(limit: int, seen: list) -> httpx.HTTPTransport:
    """The real coordinator, its JSON export asked for pages of ``limit`` rows."""

    class Paging(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/v1/export" and request.url.params.get("format") == "json":
                request.url = request.url.copy_merge_params({"limit": str(limit)})
                seen.append(request.url.params.get("after"))
            return super().handle_request(request)

    return Paging()


def test_attempts_follow_the_json_exports_pages(cluster: str, client: Client) -> None:
    grid = {"x": [1, 2, 3, 4, 5]}
    exp = client.submit(spec("py-pages", ["true"], grid=grid, resources={"gpus": 0}))
    exp.wait(timeout=120)
    whole = exp.attempts(frame=False)
    seen: list = []
    with Client(cluster, TOKEN, transport=_paging(2, seen)) as paged:
        rows = paged.attempts(exp.id, frame=False)
        assert paged.export(exp.id, format="json") == client.export(exp.id, format="json")
    assert seen[:3] == [None, "2", "4"]
    assert rows == whole and sorted(r["params.x"] for r in rows) == [1, 2, 3, 4, 5]


def test_retry_failed_retries_every_failed_job(client: Client) -> None:
    name = f"py-retry-failed-{uuid.uuid4().hex[:8]}"
    command = ["sh", "-c", "exit {code}"]
    exp = client.submit(spec(name, command, grid={"code": [0, 3, 4]}, resources={"gpus": 0}))
    assert exp.wait(timeout=60).counts.failed == 2
    failed = sorted(j["id"] for j in exp.jobs(state="failed", frame=False))

    again = client.retry_failed(name)  # by name
    assert again.experiment == exp.id and sorted(again.retried) == failed
    done = exp.wait(timeout=60)
    assert done.counts.failed == 2 and done.counts.succeeded == 1
    tries = {j["id"]: j["attempts"] for j in exp.jobs(frame=False)}
    assert [tries[j] for j in failed] == [2, 2]

    assert sorted(exp.retry_failed().retried) == failed  # from the Experiment
    exp.wait(timeout=60)
    ok = client.submit(spec(f"{name}-ok", ["true"], resources={"gpus": 0}))
    ok.wait(timeout=60)
    assert client.retry_failed(ok.id).retried == []
    with pytest.raises(NotFoundError):
        client.retry_failed(f"no-such-{name}")


async def test_the_async_client_exports_and_retries_failed(cluster: str) -> None:
    async with AsyncClient(cluster, TOKEN) as c:
        name = f"py-async-retry-{uuid.uuid4().hex[:8]}"
        exp = await c.submit(spec(name, ["sh", "-c", "exit 3"], resources={"gpus": 0}))
        assert (await exp.wait(timeout=60)).counts.failed == 1
        jobs = await exp.jobs(frame=False)
        named = c.experiment(name)
        assert (await named.retry_failed()).retried == [jobs[0]["id"]]
        assert named.id == exp.id
        assert (await c.wait(name, timeout=60)).counts.failed == 1
        assert (await c.retry_failed(name)).retried == [jobs[0]["id"]]
        await exp.wait(timeout=60)
        rows = await c.export(name, format="json")
        assert [r["attempt"] for r in sorted(rows, key=lambda r: r["attempt"])] == [1, 2, 3]
        text = await exp.export(clean_only=False)
        assert len(text.splitlines()) == 4
        frame = await exp.attempts()
        assert list(frame.columns[:7]) == ATTEMPT_KEYS and str(frame["attempt"].dtype) == "Int64"
