"""Studies (a spec with ``experiments:``, variants over shared defaults): what the client
sends for them (each variant's rows read, its own source where it differs from the top
level's, every bundle uploaded first), what comes back (the study's experiments, one handle
that waits for them all), ``retry(cascade=True)``; without a coordinator, through httpx's mock
transport. One end-to-end test runs a study on a real coordinator and agent."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import httpx
import pytest

from headroom_client import AsyncClient, Client, JobsFailedError, SourceError
from headroom_client._source import prepare_submission
from headroom_client._spec import load_spec, merged
from headroom_client.models import ExperimentSummary, JobDetail, SubmitResponse

from .conftest import TOKEN


@pytest.fixture(autouse=True)
def no_activated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No venv inherited, and the current directory (a spec dict's workdir) outside any
    repository: the git state of this checkout is not what these tests look at."""
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    """``exp/`` for the spec files, ``code_a/`` and ``code_b/`` for the code, beside it."""
    for d in ("exp", "code_a", "code_b"):
        (tmp_path / d).mkdir()
    (tmp_path / "code_a" / "train.py").write_text("print('a')\n")
    (tmp_path / "code_b" / "eval.py").write_text("print('b')\n")
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- merging, as the coordinator merges ----


def test_variants_merge_over_the_defaults_mapping_by_mapping() -> None:
    # The coordinator's own case (shared/src/study.rs), read back through the client's copy.
    defaults = {
        "command": ["python", "main.py", "--lr", "{lr}"],
        "grid": {"seed": [1, 2]},
        "resources": {"gpus": 1, "memory": "2GiB"},
        "env": {"A": "1", "B": "2"},
        "workdir": "../code_a",
        "runs_per_config": 2,
    }
    big = merged(
        defaults,
        {
            "resources": {"memory": "8GiB"},
            "env": {"B": None, "C": "3"},
            "grid": {"bs": [32, 64]},
            "workdir": None,
            "runs_per_config": 1,
        },
    )
    assert big["resources"] == {"gpus": 1, "memory": "8GiB"}, "the default's gpus kept"
    assert big["env"] == {"A": "1", "C": "3"}, "an entry set to null removes the default's"
    assert big["grid"] == {"seed": [1, 2], "bs": [32, 64]}
    assert "workdir" not in big, "a key set to null removes the default"
    assert big["runs_per_config"] == 1 and big["command"] == defaults["command"]
    assert defaults["env"] == {"A": "1", "B": "2"}, "the defaults are not changed"


# ---- what a study's submission sends ----


def test_each_variant_with_another_workdir_runs_from_its_own(lab: Path) -> None:
    spec = write(
        lab / "exp" / "study.yaml",
        "name: lab\n"
        "command: [python, train.py]\n"
        "resources: {gpus: 0}\n"
        "workdir: ../code_a\n"
        "experiments:\n"
        "  - {name: train}\n"
        "  - {name: same, workdir: ../code_a}\n"
        "  - {name: eval, workdir: ../code_b, command: [python, eval.py]}\n"
        "  - {name: here, workdir: null}\n",
    )
    prepared = prepare_submission(str(spec))
    body = prepared.body
    assert body["workdir"] == str(lab / "code_a")
    # `train` inherits the top level's, `same` names the same directory: both left out.
    assert set(body["variants"]) == {"eval", "here"}
    assert body["variants"]["eval"] == {"workdir": str(lab / "code_b")}
    # `workdir: null` drops the default: the current directory, as at the top.
    assert body["variants"]["here"]["workdir"] == os.getcwd()
    # The spec sent says what was resolved, as the top level's does.
    variants = body["spec"]["experiments"]
    assert variants[2]["workdir"] == str(lab / "code_b")
    assert variants[1]["workdir"] == str(lab / "code_a")
    assert variants[0] == {"name": "train"} and variants[3]["workdir"] is None
    assert prepared.bundles == ()
    assert prepared.entered == (str(lab / "code_a"), str(lab / "code_b"), os.getcwd())


def test_the_caller_s_study_is_not_changed(lab: Path) -> None:
    import copy

    study = {
        "name": "lab",
        "command": ["x"],
        "experiments": [{"name": "a"}, {"name": "b", "workdir": "code_b"}],
    }
    kept = copy.deepcopy(study)
    body = prepare_submission(study).body  # a dict's relative paths: the current directory's
    assert body["variants"] == {"b": {"workdir": str(lab / "code_b")}}
    assert body["spec"]["experiments"][1]["workdir"] == str(lab / "code_b")
    assert study == kept


def test_a_plain_spec_sends_no_variants(lab: Path) -> None:
    spec = write(lab / "exp" / "one.yaml", "name: one\ncommand: [true]\nworkdir: ../code_a\n")
    body = prepare_submission(str(spec)).body
    assert "variants" not in body and body["workdir"] == str(lab / "code_a")
    assert set(body) == {"spec", "dry_run", "workdir"}


def test_a_variant_s_environment_is_its_own_relative_to_the_spec_file(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = write(
        lab / "exp" / "study.yaml",
        "name: lab\ncommand: [x]\nworkdir: ../code_a\nenvironment: {venv: .venv}\n"
        "experiments:\n"
        "  - {name: a}\n"
        "  - {name: b, environment: {venv: ../code_b/.venv}}\n"
        "  - {name: c, environment: none}\n",
    )
    body = prepare_submission(str(spec)).body
    assert body["environment"] == {"venv": str(lab / "exp" / ".venv")}
    assert body["variants"]["b"] == {
        "workdir": str(lab / "code_a"),
        "environment": {"venv": str(lab / "code_b" / ".venv")},
    }
    assert body["variants"]["c"] == {"workdir": str(lab / "code_a")}  # no environment
    assert body["spec"]["experiments"][1]["environment"] == {"venv": str(lab / "code_b" / ".venv")}
    # A keyword stands for the top level's key: a variant that sets its own keeps it.
    monkeypatch.chdir(lab)
    body = prepare_submission(str(spec), environment={"venv": "env1"}).body
    assert body["environment"] == {"venv": str(lab / "env1")}
    assert set(body["variants"]) == {"b", "c"}


def test_a_variant_s_wrong_source_is_refused_at_its_field(lab: Path) -> None:
    spec = write(
        lab / "exp" / "study.yaml",
        "name: lab\ncommand: [x]\nexperiments:\n  - {name: a}\n  - {name: b, workdir: ../nope}\n",
    )
    with pytest.raises(SourceError) as e:
        prepare_submission(str(spec))
    assert e.value.field == "experiments[1].workdir"
    assert str(lab / "nope") in e.value.message


def test_one_bundle_per_directory_each_uploaded_before_the_submission(lab: Path) -> None:
    spec = write(
        lab / "exp" / "study.yaml",
        "name: lab\ncommand: [x]\nworkdir: ../code_a\ncode: snapshot\n"
        "experiments:\n"
        "  - {name: train}\n"
        "  - {name: eval, workdir: ../code_b}\n"
        "  - {name: eval2, workdir: ../code_b}\n"
        "  - {name: live, code: checkout}\n",
    )
    sent: Sent = []
    with Client("http://hr.test", token="t", transport=mock(sent)) as hr:
        hr.submit(spec)
    puts = [s for s in sent if s[0] == "PUT"]
    assert [s[0] for s in sent] == ["PUT", "PUT", "POST"], "every bundle before the submission"
    hashes = [hashlib.sha256(s[3]).hexdigest() for s in puts]
    assert [s[1] for s in puts] == [f"/v1/bundles/{h}" for h in hashes]
    body = json.loads(sent[-1][3])
    assert body["snapshot"] == {"hash": hashes[0], "subdir": ""}
    # Two variants of one directory share its bundle; `live` runs from the tree itself.
    assert body["variants"] == {
        "eval": {"workdir": str(lab / "code_b"), "snapshot": {"hash": hashes[1], "subdir": ""}},
        "eval2": {"workdir": str(lab / "code_b"), "snapshot": {"hash": hashes[1], "subdir": ""}},
        "live": {"workdir": str(lab / "code_a")},
    }
    # A dry run makes none, for the variants either.
    dry = prepare_submission(str(spec), dry_run=True)
    assert dry.bundles == () and set(dry.body["variants"]) == {"eval", "eval2"}


async def test_the_async_face_uploads_the_variants_bundles_too(lab: Path) -> None:
    spec = write(
        lab / "exp" / "study.yaml",
        "name: lab\ncommand: [x]\nworkdir: ../code_a\n"
        "experiments:\n  - {name: a}\n  - {name: b, workdir: ../code_b, code: snapshot}\n",
    )
    sent: Sent = []
    async with AsyncClient("http://hr.test", token="t", transport=mock(sent)) as hr:
        await hr.submit(spec)
    assert [s[0] for s in sent] == ["PUT", "POST"]
    body = json.loads(sent[-1][3])
    assert "snapshot" not in body and body["variants"]["b"]["snapshot"]["subdir"] == ""


# ---- rows files in variants ----


def test_a_variant_s_rows_file_is_read_beside_the_spec(lab: Path) -> None:
    write(lab / "exp" / "pairs.csv", "model,lr\nresnet,0.1\nvgg,1e-3\n")
    spec = write(
        lab / "exp" / "study.yaml",
        "name: lab\ncommand: [run, '{model}']\n"
        "experiments:\n  - {name: a, grid: {model: [x]}}\n  - {name: b, rows: pairs.csv}\n",
    )
    doc = load_spec(spec)
    assert doc["experiments"][1]["rows"] == [
        {"model": "resnet", "lr": 0.1},
        {"model": "vgg", "lr": 0.001},
    ]
    assert "rows" not in doc["experiments"][0]
    assert prepare_submission(str(spec)).body["spec"]["experiments"][1]["rows"][0]["lr"] == 0.1


def test_a_missing_or_bad_variant_rows_file_is_refused_naming_its_field(lab: Path) -> None:
    spec = write(
        lab / "exp" / "study.yaml",
        "name: lab\ncommand: [run]\nexperiments:\n  - {name: a, rows: missing.csv}\n",
    )
    with pytest.raises(ValueError, match=r"^experiments\[0\]\.rows: reading .*missing\.csv"):
        load_spec(spec)
    write(lab / "exp" / "gap.csv", "model,lr\nresnet,\n")
    write(
        spec,
        "name: lab\ncommand: [run]\nexperiments:\n  - {name: a}\n  - {name: b, rows: gap.csv}\n",
    )
    with pytest.raises(ValueError, match=r"^experiments\[1\]\.rows: .*line 2: `lr` is empty"):
        load_spec(spec)


# ---- what comes back ----

STUDY_ANSWER: Dict[str, Any] = {
    "experiment": None,
    "name": "lab",
    "seed": 7,
    "jobs": 3,
    "dry_run": False,
    "study": "11111111-1111-4111-8111-111111111111",
    "variants": [
        {"variant": "train", "name": "lab.train",
         "experiment": "22222222-2222-4222-8222-222222222222",
         "jobs": 2, "seed": 7, "gpus": 1, "memory": "8GiB", "memory_key": ["model"]},
        {"variant": "eval", "name": "lab.eval",
         "experiment": "33333333-3333-4333-8333-333333333333",
         "jobs": 1, "seed": 7, "gpus": 0, "after": ["train"]},
    ],
}
TRAIN, EVAL = (v["experiment"] for v in STUDY_ANSWER["variants"])

Sent = List[Tuple[str, str, Dict[str, str], bytes]]


def mock(
    sent: Sent, route: Optional[Callable[[httpx.Request], Optional[httpx.Response]]] = None
) -> httpx.MockTransport:
    """Records each request; bundles are stored, a submission answers ``STUDY_ANSWER``, and
    ``route`` answers the rest."""

    def answer(request: httpx.Request) -> httpx.Response:
        body = request.read()
        sent.append((request.method, request.url.raw_path.decode(), dict(request.headers), body))
        if request.url.path.startswith("/v1/bundles/"):
            digest = request.url.path.rsplit("/", 1)[1]
            return httpx.Response(200, json={"hash": digest, "bytes": len(body), "stored": True})
        if request.url.path == "/v1/experiments" and request.method == "POST":
            return httpx.Response(200, json=STUDY_ANSWER)
        got = route(request) if route is not None else None
        if got is None:
            got = httpx.Response(404, json={"error": {"code": "not_found", "message": "?"}})
        return got

    return httpx.MockTransport(answer)


def counts(**n: int) -> Dict[str, int]:
    zero = dict.fromkeys(
        ("queued", "leased", "running", "retrying", "succeeded", "failed", "cancelled", "pruned"), 0
    )
    return {**zero, **n}


def ended_route(failed_in_eval: int = 0) -> Callable[[httpx.Request], Optional[httpx.Response]]:
    """Every variant ended: ``train``'s two jobs succeeded, ``eval``'s one as told."""

    def route(request: httpx.Request) -> Optional[httpx.Response]:
        if request.url.path == "/v1/progress":
            exp = request.url.params["experiment"]
            if exp == TRAIN:
                return httpx.Response(200, json={"version": 5, "counts": counts(succeeded=2)})
            c = counts(failed=1) if failed_in_eval else counts(succeeded=1)
            return httpx.Response(200, json={"version": 9, "counts": c})
        if request.url.path == "/v1/jobs" and request.url.params.get("state") == "failed":
            assert request.url.params["experiment"] == EVAL
            return httpx.Response(200, json=[job_summary("44444444-4444-4444-8444-444444444444")])
        return None

    return route


def job_summary(id: str) -> Dict[str, Any]:
    return {
        "id": id, "experiment": EVAL, "experiment_name": "lab.eval", "index": 0, "config": 0,
        "run": 0, "state": "failed", "priority": 0, "params": {}, "attempts": 1,
        "max_attempts": 1, "gpus": 0, "gpu_indices": [], "last_failure": "nonzero",
        "created_at": "2024-01-01T00:00:00Z",
    }


def test_a_study_s_answer_and_summary_are_read() -> None:
    resp = SubmitResponse.model_validate(STUDY_ANSWER)
    assert resp.experiment is None and resp.study == STUDY_ANSWER["study"]
    train, ev = resp.variants
    assert (train.variant, train.name, train.memory, train.memory_key) == (
        "train", "lab.train", "8GiB", ["model"]
    )
    assert ev.after == ["train"] and ev.memory is None and ev.memory_key == []
    summary = ExperimentSummary.model_validate(
        {"id": TRAIN, "name": "lab.train", "seed": 7, "created_at": "2024-01-01T00:00:00Z",
         "counts": counts(), "study": {"id": resp.study, "name": "lab"}}
    )
    assert summary.study is not None and summary.study.name == "lab"
    assert ExperimentSummary.model_validate({**summary.model_dump(), "study": None}).study is None


def test_a_submitted_study_is_one_handle_that_waits_for_every_variant(lab: Path) -> None:
    sent: Sent = []
    with Client("http://hr.test", token="t", transport=mock(sent, ended_route())) as hr:
        exp = hr.submit({"name": "lab", "command": ["x"], "experiments": [{"name": "train"}]})
        assert exp.id is None and exp.study == STUDY_ANSWER["study"]
        assert list(exp.variants) == ["train", "eval"]
        assert exp.variants["eval"].id == EVAL and exp.variants["train"].study is None
        done = exp.wait(timeout=10, raise_on_failure=True)
        assert done.counts.succeeded == 3 and done.counts.total == 3 and done.version == 9
        assert exp.progress().counts.succeeded == 3
        # Each variant's own calls go through its handle.
        with pytest.raises(ValueError, match=r"lab\.train, lab\.eval.*variants\[NAME\]"):
            exp.jobs()
        assert exp.variants["train"].progress().counts.succeeded == 2
    asked = [path for method, path, _, _ in sent if path.startswith("/v1/progress")]
    assert asked[:2] == [f"/v1/progress?experiment={TRAIN}", f"/v1/progress?experiment={EVAL}"]
    assert "study=" in repr(exp)


async def test_a_study_s_failures_raise_once_naming_the_study() -> None:
    sent: Sent = []
    async with AsyncClient("http://hr.test", token="t", transport=mock(sent, ended_route(1))) as hr:
        exp = await hr.submit({"name": "lab", "command": ["x"], "experiments": [{"name": "a"}]})
        assert list(exp.variants) == ["train", "eval"]
        with pytest.raises(JobsFailedError) as e:
            await exp.wait(timeout=10, raise_on_failure=True)
    assert e.value.study == STUDY_ANSWER["study"] and e.value.experiment is None
    assert e.value.failures == {"44444444-4444-4444-8444-444444444444": "nonzero"}
    assert e.value.progress.counts.failed == 1 and e.value.progress.counts.succeeded == 2
    assert f"study {STUDY_ANSWER['study']}" in str(e.value)


def test_retry_cascade_asks_for_it_and_lists_what_runs_again() -> None:
    job, waiting = "55555555-5555-4555-8555-555555555555", "66666666-6666-4666-8666-666666666666"

    def route(request: httpx.Request) -> Optional[httpx.Response]:
        if request.url.path == f"/v1/jobs/{job}/retry" and request.method == "POST":
            if request.url.params.get("cascade") == "true":
                return httpx.Response(200, json={"state": "retrying", "retried": [job, waiting]})
            assert not request.url.params, "a plain retry sends no query"
            return httpx.Response(200, json={"state": "retrying"})
        return None

    sent: Sent = []
    with Client("http://hr.test", token="t", transport=mock(sent, route)) as hr:
        assert hr.retry(job).retried == []
        again = hr.retry(job, cascade=True)
    assert again.state == "retrying" and again.retried == [job, waiting]
    paths = [p for _, p, _, _ in sent]
    assert paths == [f"/v1/jobs/{job}/retry", f"/v1/jobs/{job}/retry?cascade=true"]


async def test_the_async_retry_takes_cascade_too() -> None:
    job = "55555555-5555-4555-8555-555555555555"

    def route(request: httpx.Request) -> Optional[httpx.Response]:
        cascade = request.url.params.get("cascade") == "true"
        return httpx.Response(200, json={"state": "retrying", "retried": [job] if cascade else []})

    async with AsyncClient("http://hr.test", token="t", transport=mock([], route)) as hr:
        assert (await hr.retry(job, cascade=True)).retried == [job]


# ---- end to end ----


def test_end_to_end_a_study_s_eval_jobs_start_after_their_train_jobs(client: Client) -> None:
    """``train`` over two models, ``eval`` of each after its own ``train`` job (``match``):
    stored as two experiments of one study; every job succeeds, and each eval job starts
    once its train job has ended."""
    name = f"py-study-{uuid.uuid4().hex[:8]}"
    # Jobs run in the submitting directory as the agent's user (`nobody` under a root agent):
    # not pytest's own temporary folders, which are root's alone.
    workdir = tempfile.mkdtemp(prefix="headroom-study-")
    os.chmod(workdir, 0o755)
    study = {
        "name": name,
        "resources": {"gpus": 0},
        "grid": {"model": ["a", "b"]},
        "experiments": [
            {"name": "train", "command": ["sh", "-c", "sleep 1; echo trained {model}"]},
            {
                "name": "eval",
                "command": ["sh", "-c", "echo evaluated {model}"],
                "after": [{"experiment": "train", "match": ["model"]}],
            },
        ],
    }
    try:
        check_study(client, name, study, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def check_study(client: Client, name: str, study: Dict[str, Any], workdir: str) -> None:
    exp = client.submit(study, workdir=workdir)
    assert exp.id is None and exp.study is not None and exp.submitted is not None
    assert exp.submitted.jobs == 4
    assert [(v.variant, v.name, v.jobs, v.after) for v in exp.submitted.variants] == [
        ("train", f"{name}.train", 2, []),
        ("eval", f"{name}.eval", 2, ["train"]),
    ]
    done = exp.wait(timeout=120, raise_on_failure=True)
    assert done.counts.succeeded == 4 and done.counts.total == 4, done.counts

    summaries = {e.name: e for e in client.experiments() if e.study and e.study.id == exp.study}
    assert set(summaries) == {f"{name}.train", f"{name}.eval"}
    assert all(e.study is not None and e.study.name == name for e in summaries.values())

    def by_model(variant: str) -> Dict[str, JobDetail]:
        id = exp.variants[variant].id
        assert id is not None
        jobs = client.job_list(id)
        assert len(jobs) == 2 and all(j.state == "succeeded" for j in jobs), jobs
        return {j.params["model"]: client.job(j.id) for j in jobs}

    train, evals = by_model("train"), by_model("eval")
    for model, ev in evals.items():
        trained = train[model].attempts_detail[-1]
        first = ev.attempts_detail[0]
        assert trained.ended_at is not None and first.started_at is not None
        # Placed, and started, only once the train job of its model had ended.
        assert first.leased_at >= trained.ended_at, (model, first.leased_at, trained.ended_at)
        assert first.started_at >= trained.ended_at, (model, first.started_at, trained.ended_at)
