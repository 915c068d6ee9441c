"""Where a submission's jobs run from (``_source``), without a coordinator: the git state of a
real repository made here, the code bundle, the environment and the working directory
resolved, and what ``submit`` sends (through httpx's mock transport)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import httpx
import pytest

from headroom_client import AsyncClient, Client, SourceError
from headroom_client._source import (
    _Ignore,
    git_state,
    make_bundle,
    prepare_submission,
    resolve_environment,
    resolve_workdir,
)
from headroom_client._tables import attempts_table
from headroom_client.models import ExperimentSummary

SPEC = {"name": "src", "command": ["python", "train.py"], "resources": {"gpus": 0}}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with one commit on `main`: a script, a data file and a .gitignore."""
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.name", "Test")
    git(root, "config", "user.email", "test@example.com")
    git(root, "config", "commit.gpgsign", "false")
    (root / "train.py").write_text("print('hi')\n")
    (root / "train.py").chmod(0o755)
    (root / "data.csv").write_text("a,b\n1,2\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / "sub").mkdir()
    (root / "sub" / "conf.yaml").write_text("x: 1\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    return root


@pytest.fixture(autouse=True)
def no_activated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)


def names(bundle_data: bytes) -> List[str]:
    with tarfile.open(fileobj=io.BytesIO(bundle_data), mode="r:gz") as tar:
        return tar.getnames()


# ---- git ----


def test_a_clean_repository_gives_its_commit_and_branch(repo: Path) -> None:
    state = git_state(str(repo))
    assert state == {"commit": git(repo, "rev-parse", "HEAD"), "branch": "main", "dirty": False}


def test_an_edit_makes_it_dirty_and_changes_the_diff_hash(repo: Path) -> None:
    (repo / "train.py").write_text("print('edited')\n")
    first = git_state(str(repo))
    assert first is not None and first["dirty"] is True
    assert len(first["diff_hash"]) == 64
    (repo / "train.py").write_text("print('edited again')\n")
    second = git_state(str(repo))
    assert second is not None and second["diff_hash"] != first["diff_hash"]
    # The hash is git's diff: the same changes, the same hash.
    assert git_state(str(repo)) == second


def test_an_untracked_file_makes_it_dirty_and_enters_the_hash(repo: Path) -> None:
    (repo / "notes.txt").write_text("one\n")
    first = git_state(str(repo))
    assert first is not None and first["dirty"] is True
    diff = subprocess.run(
        ["git", "diff", "HEAD", "--binary"], cwd=repo, capture_output=True, check=True
    ).stdout
    assert first["diff_hash"] == hashlib.sha256(diff + b"notes.txt\0one\n").hexdigest()
    (repo / "notes.txt").write_text("two\n")
    second = git_state(str(repo))
    assert second is not None and second["diff_hash"] != first["diff_hash"]


def test_an_ignored_file_leaves_it_clean(repo: Path) -> None:
    (repo / "run.log").write_text("noise\n")
    state = git_state(str(repo))
    assert state is not None and state["dirty"] is False and "diff_hash" not in state


def test_a_detached_head_has_no_branch(repo: Path) -> None:
    git(repo, "checkout", "-q", "--detach")
    state = git_state(str(repo / "sub"))
    assert state is not None and "branch" not in state
    assert state["commit"] == git(repo, "rev-parse", "HEAD")


def test_no_repository_or_no_commit_gives_no_git(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert git_state(str(plain)) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    assert git_state(str(empty)) is None


def test_git_missing_gives_no_git(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(repo / "nowhere"))
    assert git_state(str(repo)) is None


# ---- the bundle ----


def test_the_same_tree_gives_the_same_bundle(repo: Path) -> None:
    a, b = make_bundle(str(repo)), make_bundle(str(repo))
    assert a.data == b.data and a.hash == b.hash
    assert a.hash == hashlib.sha256(a.data).hexdigest()
    assert a.subdir == "" and a.root == str(repo)
    # Nothing of when it was made: gzip's and tar's times are 0, owners 0, modes fixed.
    assert a.data[4:8] == b"\0\0\0\0"
    with tarfile.open(fileobj=io.BytesIO(a.data), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members) == sorted(members)
    assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" for m in members.values())
    assert members["train.py"].mode == 0o755 and members["data.csv"].mode == 0o644
    assert all(m.isfile() or m.issym() for m in members.values())


def test_git_chooses_the_files_and_headroom_data_is_never_bundled(repo: Path) -> None:
    (repo / "run.log").write_text("ignored\n")
    (repo / "new.py").write_text("untracked\n")
    (repo / "data.csv").unlink()
    (repo / ".headroom").mkdir()
    (repo / ".headroom" / "admin-token").write_text("secret\n")
    (repo / "sub" / "conf.yaml").write_text("x: 2\n")
    bundle = make_bundle(str(repo / "sub"))
    assert bundle.subdir == "sub"
    assert names(bundle.data) == [".gitignore", "new.py", "sub/conf.yaml", "train.py"]
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        conf = tar.extractfile("sub/conf.yaml")
        assert conf is not None and conf.read() == b"x: 2\n"  # as it is now, not as committed


def test_a_walk_honours_headroomignore_and_skips_venvs(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("x\n")
    (root / "src" / "big.bin").write_text("x\n")
    (root / "out").mkdir()
    (root / "out" / "result.txt").write_text("x\n")
    (root / "keep.log").write_text("x\n")
    (root / "drop.log").write_text("x\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / ".venv" / "bin" / "python").write_text("x\n")
    (root / "src" / "__pycache__").mkdir()
    (root / "src" / "__pycache__" / "main.pyc").write_text("x\n")
    (root / ".headroom").mkdir()
    (root / ".headroom" / "admin-token").write_text("secret\n")
    (root / ".headroomignore").write_text("# comment\n*.bin\nout/\n*.log\n!keep.log\n")
    # None of headroom's credentials travel: an agent's data directory, one of another
    # name (its `.gitignore` of `*`), a token file.
    (root / ".headroom-agent").mkdir()
    (root / ".headroom-agent" / "agent-token").write_text("secret\n")
    (root / "state").mkdir()
    (root / "state" / ".gitignore").write_text("*\n")
    (root / "state" / "headroom.db").write_text("db\n")
    (root / "agent-token").write_text("secret\n")
    os.symlink("src/main.py", root / "link.py")
    bundle = make_bundle(str(root))
    assert bundle.subdir == ""
    assert names(bundle.data) == ["keep.log", "link.py", "src/main.py"]
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        assert tar.getmember("link.py").linkname == "src/main.py"


def test_ignore_patterns() -> None:
    rules = _Ignore(["/top.txt", "data/*.npy", "build/", "*.tmp", "**/cache"])
    assert rules.ignores("top.txt", False) and not rules.ignores("a/top.txt", False)
    assert rules.ignores("data/x.npy", False) and not rules.ignores("other/x.npy", False)
    assert rules.ignores("a/build", True) and not rules.ignores("a/build", False)
    assert rules.ignores("deep/down/f.tmp", False)
    assert rules.ignores("cache", True) and rules.ignores("a/b/cache", True)


def test_a_bundle_over_its_cap_is_refused_naming_its_largest_files(tmp_path: Path) -> None:
    root = tmp_path / "big"
    root.mkdir()
    (root / "weights.bin").write_bytes(os.urandom(300_000))
    (root / "small.py").write_text("x\n")
    with pytest.raises(SourceError) as e:
        make_bundle(str(root), max_bytes=100_000)
    assert e.value.field == "snapshot"
    message = e.value.message
    assert "weights.bin (293.0 KiB), small.py (2 B)" in message
    assert "cap of 97.7 KiB" in message and ".headroomignore" in message


def test_a_link_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "links"
    root.mkdir()
    (root / "ok.py").write_text("x\n")
    os.symlink("../../etc/passwd", root / "escape")
    with pytest.raises(SourceError) as e:
        make_bundle(str(root))
    assert e.value.field == "snapshot" and "escape" in e.value.message
    os.unlink(root / "escape")
    os.symlink("/etc/passwd", root / "absolute")
    with pytest.raises(SourceError, match="absolute"):
        make_bundle(str(root))


# ---- the environment and the working directory ----


def test_the_activated_venv_is_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_environment(None) is None
    monkeypatch.setenv("CONDA_PREFIX", "/opt/conda/envs/t")
    assert resolve_environment("inherit") == {"conda": "/opt/conda/envs/t"}
    monkeypatch.setenv("VIRTUAL_ENV", "/home/a/.venv")
    assert resolve_environment(None) == {"venv": "/home/a/.venv"}
    assert resolve_environment("none") is None
    assert resolve_environment({"conda": "torch"}) == {"conda": "torch"}
    with pytest.raises(SourceError) as e:
        resolve_environment({"pip": "x"})
    assert e.value.field == "environment"


def test_a_relative_venv_and_workdir_are_the_spec_file_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "exp").mkdir()
    (tmp_path / "code").mkdir()
    spec = tmp_path / "exp" / "sweep.yaml"
    spec.write_text(
        "name: s\ncommand: [python, t.py]\nworkdir: ../code\nenvironment: {venv: .venv}\n"
    )
    monkeypatch.chdir(tmp_path)
    sent = prepare_submission(str(spec)).body
    assert sent["workdir"] == str(tmp_path / "code")
    assert sent["environment"] == {"venv": str(tmp_path / "exp" / ".venv")}
    # The spec sent agrees with the request.
    assert sent["spec"]["workdir"] == sent["workdir"]
    assert sent["spec"]["environment"] == sent["environment"]
    assert "git" not in sent and "snapshot" not in sent
    monkeypatch.setenv("VIRTUAL_ENV", "/v")
    none = prepare_submission(str(spec), environment="none").body
    assert "environment" not in none and none["spec"]["environment"] == "none"


def test_a_missing_workdir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as e:
        resolve_workdir(None, "nope", str(tmp_path))
    assert e.value.field == "workdir" and str(tmp_path / "nope") in e.value.message
    (tmp_path / "file").write_text("")
    with pytest.raises(SourceError, match="not a directory"):
        resolve_workdir(tmp_path / "file")
    assert resolve_workdir(None) == os.getcwd()


# ---- what submit sends ----

Sent = List[Tuple[str, str, Dict[str, str], bytes]]


def mock(sent: Sent) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        body = request.read()
        sent.append((request.method, request.url.path, dict(request.headers), body))
        if request.url.path.startswith("/v1/bundles/"):
            digest = request.url.path.rsplit("/", 1)[1]
            return httpx.Response(200, json={"hash": digest, "bytes": len(body), "stored": True})
        return httpx.Response(
            200, json={"experiment": None, "name": "src", "seed": 1, "jobs": 1, "dry_run": True}
        )

    return httpx.MockTransport(answer)


def test_submit_uploads_the_bundle_then_names_it(repo: Path) -> None:
    sent: Sent = []
    with Client("http://hr.test", token="t", transport=mock(sent)) as hr:
        hr.submit(dict(SPEC), workdir=repo / "sub", snapshot=True)
    (method, path, headers, data), post = sent
    digest = hashlib.sha256(data).hexdigest()
    assert (method, path) == ("PUT", f"/v1/bundles/{digest}")
    assert headers["content-type"] == "application/octet-stream"
    assert gzip.decompress(data)  # a gzip stream
    body: Dict[str, Any] = json.loads(post[3])
    assert post[:2] == ("POST", "/v1/experiments")
    assert body["snapshot"] == {"hash": digest, "subdir": "sub"}
    assert body["spec"]["code"] == "snapshot" and body["workdir"] == str(repo / "sub")
    assert body["git"]["branch"] == "main" and body["git"]["dirty"] is False


async def test_the_async_face_sends_the_same(repo: Path) -> None:
    sent: Sent = []
    async with AsyncClient("http://hr.test", token="t", transport=mock(sent)) as hr:
        await hr.submit(dict(SPEC), workdir=repo, snapshot=True)
    assert [s[0] for s in sent] == ["PUT", "POST"]
    assert json.loads(sent[1][3])["snapshot"]["subdir"] == ""


def test_a_dry_run_sends_no_bundle(repo: Path) -> None:
    sent: Sent = []
    with Client("http://hr.test", token="t", transport=mock(sent)) as hr:
        hr.submit({**SPEC, "code": "snapshot"}, workdir=repo, dry_run=True)
    (only,) = sent
    assert "snapshot" not in json.loads(only[3])


def test_nothing_is_sent_when_the_source_is_wrong(tmp_path: Path) -> None:
    sent: Sent = []
    (tmp_path / "w.bin").write_bytes(os.urandom(50_000))
    with Client("http://hr.test", token="t", transport=mock(sent)) as hr:
        with pytest.raises(SourceError) as e:
            hr.submit(dict(SPEC), workdir=tmp_path / "missing")
        assert e.value.field == "workdir"
        with pytest.raises(SourceError) as e:
            hr.submit(dict(SPEC), workdir=tmp_path, snapshot=True, max_snapshot_bytes=10_000)
        assert e.value.field == "snapshot"
    assert sent == []


def test_an_upload_refused_raises_its_error(repo: Path) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        err = {"code": "invalid", "message": "bundle over the cap", "field": "snapshot"}
        return httpx.Response(413, json={"error": err})

    with Client("http://hr.test", token="t", transport=httpx.MockTransport(answer)) as hr:
        with pytest.raises(Exception) as e:
            hr.submit(dict(SPEC), workdir=repo, snapshot=True)
    assert getattr(e.value, "field", None) == "snapshot" and getattr(e.value, "status") == 413


def test_the_caller_s_spec_is_not_changed(repo: Path) -> None:
    spec = dict(SPEC)
    prepare_submission(spec, workdir=repo, snapshot=True, environment="none")
    assert spec == SPEC


# ---- what comes back ----


def test_an_experiment_s_source_is_read() -> None:
    summary = ExperimentSummary.model_validate(
        {
            "id": "e",
            "name": "n",
            "seed": 1,
            "created_at": "2024-01-01T00:00:00Z",
            "counts": dict.fromkeys(
                ("queued", "leased", "running", "retrying", "succeeded", "failed", "cancelled"), 0
            ),
            "source": {
                "workdir": "/p",
                "git": {"commit": "a" * 40, "dirty": True, "diff_hash": "b" * 64},
                "snapshot": {"hash": "c" * 64, "subdir": "", "bytes": 10},
                "environment": {"venv": "/p/.venv"},
                "environment_from": "submitter",
            },
        }
    )
    source = summary.source
    assert source is not None and source.git is not None and source.snapshot is not None
    assert source.git.branch is None and source.snapshot.bytes == 10
    assert source.environment is not None and source.environment.venv == "/p/.venv"


def test_the_export_s_source_columns_pass_through() -> None:
    columns = [{"name": n, "type": t} for n, t in (
        ("experiment", "string"), ("workdir", "string"), ("git_commit", "string"),
        ("git_dirty", "boolean"), ("code_hash", "string"), ("failure_class", "string"),
    )]
    row = {"experiment": "e", "workdir": "/p", "git_commit": "a" * 40, "git_dirty": False,
           "code_hash": None, "failure_class": "workdir", "params": {}}
    table = attempts_table(columns, [row])
    assert [c.name for c in table.columns] == [c["name"] for c in columns]
    assert table.rows[0]["failure_class"] == "workdir" and table.rows[0]["git_dirty"] is False


def test_a_directory_the_jobs_user_may_not_enter_is_refused_on_this_host() -> None:
    """As the CLI: where the coordinator is this host's, a working directory the jobs' Unix
    user may not search into is refused naming ``workdir``, and the folder that stops it."""
    import pwd

    from headroom_client._source import enterable_by, is_local

    assert is_local("http://127.0.0.1:7420") and is_local("http://localhost:1")
    assert not is_local("https://headroom.lab.example.org")
    if os.geteuid() != 0:
        pytest.skip("needs root: a folder another user may not enter")
    # Not under pytest's own folders, which are root's alone.
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="headroom-enter-"))
    os.chmod(base, 0o755)
    closed = base / "closed"
    (closed / "proj").mkdir(parents=True)
    os.chmod(closed, 0o700)
    nobody = pwd.getpwnam("nobody").pw_name
    with pytest.raises(SourceError) as refused:
        enterable_by(str(closed / "proj"), nobody)
    assert refused.value.field == "workdir"
    assert f"may not search (x) {closed}" in str(refused.value)
    os.chmod(closed, 0o755)
    enterable_by(str(closed / "proj"), nobody)
    shutil.rmtree(base)


def test_a_rows_file_beside_the_spec_is_read_as_the_cli_reads_it(tmp_path: Path) -> None:
    from headroom_client._spec import load_spec

    (tmp_path / "pairs.csv").write_text("model, lr, bs, amp\nresnet20, 0.1, 32, true\nvgg16, 1e-3, 64, false\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: p\ncommand: [run, '{model}']\nrows: pairs.csv\n")
    assert load_spec(spec)["rows"] == [
        {"model": "resnet20", "lr": 0.1, "bs": 32, "amp": True},
        {"model": "vgg16", "lr": 0.001, "bs": 64, "amp": False},
    ]
    # A spreadsheet's "CSV UTF-8" starts with a byte order mark: not part of the first name.
    (tmp_path / "pairs.csv").write_bytes("\ufeffmodel,lr\nresnet20,0.1\n".encode())
    assert load_spec(spec)["rows"] == [{"model": "resnet20", "lr": 0.1}]
    (tmp_path / "pairs.csv").write_text("model,lr\nresnet20,\n")
    with pytest.raises(ValueError, match="line 2: `lr` is empty"):
        load_spec(spec)
    spec.write_text("name: p\ncommand: [run]\nrows: missing.csv\n")
    with pytest.raises(ValueError, match="rows: reading"):
        load_spec(spec)
