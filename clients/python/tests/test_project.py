"""Where a submission's jobs run from, end to end, as a researcher works: a git repository of
their own, submitted from its directory with the Python client to a real coordinator and
agent. The jobs run in that directory (or, with ``snapshot=True``, from a bundle of it taken
at submit), and the experiment, its export and its jobs' logs say which code ran.

An agent running as root (CI) runs the jobs as ``nobody``: the repository is made where
``nobody`` may enter and read it (pytest's ``tmp_path`` is private to root), and the jobs
are shell scripts (the system's ``python3`` may be a shim under ``/root``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from headroom_client import Client, InvalidError, SourceError

try:
    import pwd

    NOBODY = pwd.getpwnam("nobody").pw_uid
except (ImportError, KeyError):
    NOBODY = 65534

#: What the jobs print: the data file read by a relative path, so from where they run.
RUN_SH = 'printf "value=%s\\n" "$(cat data/values.txt)"\nprintf "uid=%s\\n" "$(id -u)"\n'

#: With a snapshot: waits until the submitter has changed the file in their checkout (read
#: through HEADROOM_SUBMIT_DIR), so that each job provably starts after the edit, then prints
#: the file as the job sees it (its bundle) and where it runs.
SNAPSHOT_SH = """\
i=0
while [ "$(cat "$HEADROOM_SUBMIT_DIR/data/values.txt")" = "$SUBMITTED" ]; do
  i=$((i + 1))
  if [ "$i" -gt 600 ]; then echo "the checkout was never edited" >&2; exit 3; fi
  sleep 0.1
done
printf "live=%s\\n" "$(cat "$HEADROOM_SUBMIT_DIR/data/values.txt")"
printf "value=%s\\n" "$(cat data/values.txt)"
printf "pwd=%s\\n" "$(pwd -P)"
printf "submit_dir=%s\\n" "$HEADROOM_SUBMIT_DIR"
"""

#: From a subdirectory: its own data, and the top's by `../`.
BOTH_SH = 'printf "value=%s up=%s\\n" "$(cat data/values.txt)" "$(cat ../data/values.txt)"'


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [
            "git",
            "-c",
            "user.name=Researcher",
            "-c",
            "user.email=researcher@example.com",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "init.defaultBranch=main",
            *args,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _open_to_all(root: Path) -> None:
    """Directories 0755, files 0644: a job run as ``nobody`` can enter and read them."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)


@pytest.fixture
def project(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A researcher's repository, one commit on ``main``: ``run.sh``, ``snapshot.sh`` and
    ``data/values.txt`` (``first``); the current directory, with no Python environment
    activated (the jobs are shell scripts). Its real path: what the client records."""
    top = Path(tempfile.mkdtemp(prefix="headroom-project-")).resolve()
    try:
        root = top / "proj"
        root.mkdir()
        (root / "data").mkdir()
        (root / "data" / "values.txt").write_text("first\n")
        (root / "run.sh").write_text(RUN_SH)
        (root / "snapshot.sh").write_text(SNAPSHOT_SH)
        (root / ".gitignore").write_text("*.log\n")
        git(root, "init", "-q")
        git(root, "add", ".")
        git(root, "commit", "-q", "-m", "first")
        _open_to_all(top)
        monkeypatch.chdir(root)
        monkeypatch.delenv("VIRTUAL_ENV", raising=False)
        monkeypatch.delenv("CONDA_PREFIX", raising=False)
        yield root
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _logs(client: Client, job_ids: List[str]) -> Dict[str, str]:
    return {j: "".join(client.logs(j)) for j in job_ids}


def _failures(client: Client, job_ids: List[str]) -> str:
    """Each job's state, failure class and log: what a failed wait is explained by."""
    out = []
    for j in job_ids:
        d = client.job(j)
        last = d.attempts_detail[-1] if d.attempts_detail else None
        why = last.failure_class if last else None
        out.append(f"{j}: {d.state} {why}\n{''.join(client.logs(j))}")
    return "\n".join(out)


def test_a_job_runs_in_the_checkout_it_was_submitted_from(client: Client, project: Path) -> None:
    head = git(project, "rev-parse", "HEAD")
    name = f"py-proj-checkout-{uuid.uuid4().hex[:8]}"
    exp = client.submit(
        {"name": name, "command": ["sh", "run.sh"], "resources": {"gpus": 0}}
    )
    assert exp.id is not None
    done = exp.wait(timeout=120)
    ids = [j["id"] for j in exp.jobs(frame=False)]
    assert done.counts.succeeded == 1, _failures(client, ids)
    lines = _logs(client, ids)[ids[0]].splitlines()
    assert lines[0] == "value=first", lines
    if os.geteuid() == 0:
        # An agent run as root runs the jobs as `nobody`: the repository was open to it.
        assert lines[1] == f"uid={NOBODY}", lines

    source = client.experiment(exp.id).summary().source
    assert source is not None
    assert source.workdir == os.path.realpath(project)
    assert source.git is not None
    assert source.git.commit == head
    assert source.git.branch == "main"
    assert source.git.dirty is False and source.git.diff_hash is None
    assert source.snapshot is None
    assert source.environment is None
    # By name too: the newest of that name.
    assert client.experiment(name).summary().source == source

    rows: List[Dict[str, Any]] = client.export(exp.id, format="json")
    assert len(rows) == 1
    assert rows[0]["workdir"] == os.path.realpath(project)
    assert rows[0]["git_commit"] == head
    assert rows[0]["git_dirty"] is False
    assert rows[0]["code_hash"] in (None, "")
    header = client.export(exp.id).splitlines()[0].split(",")
    assert {"workdir", "git_commit", "git_dirty", "code_hash"} <= set(header)


def test_an_uncommitted_change_is_recorded_as_dirty(client: Client, project: Path) -> None:
    # The researcher edits the data and submits without committing: the jobs read the edit,
    # and the experiment says the checkout was dirty, with a hash of the change.
    (project / "data" / "values.txt").write_text("edited\n")
    exp = client.submit(
        {
            "name": f"py-proj-dirty-{uuid.uuid4().hex[:8]}",
            "command": ["sh", "run.sh"],
            "resources": {"gpus": 0},
        }
    )
    assert exp.id is not None
    exp.wait(timeout=120)
    ids = [j["id"] for j in exp.jobs(frame=False)]
    assert _logs(client, ids)[ids[0]].splitlines()[0] == "value=edited", _failures(client, ids)
    source = exp.summary().source
    assert source is not None and source.git is not None
    assert source.git.commit == git(project, "rev-parse", "HEAD")
    assert source.git.dirty is True
    assert source.git.diff_hash is not None and re.fullmatch(r"[0-9a-f]{64}", source.git.diff_hash)
    rows: List[Dict[str, Any]] = client.export(exp.id, format="json")
    assert [r["git_dirty"] for r in rows] == [True]


def test_a_snapshot_runs_the_code_as_submitted_whatever_changes_after(
    client: Client, project: Path
) -> None:
    head = git(project, "rev-parse", "HEAD")
    name = f"py-proj-snapshot-{uuid.uuid4().hex[:8]}"
    exp = client.submit(
        {
            "name": name,
            "command": ["sh", "snapshot.sh"],
            "env": {"SUBMITTED": "first"},
            "runs_per_config": 3,
            "resources": {"gpus": 0},
        },
        snapshot=True,
    )
    # At once, as a researcher goes on working: the jobs wait for this edit before reading.
    (project / "data" / "values.txt").write_text("second\n")
    assert exp.id is not None
    done = exp.wait(timeout=180)
    ids = [j["id"] for j in exp.jobs(frame=False)]
    assert len(ids) == 3
    assert done.counts.succeeded == 3, _failures(client, ids)
    real = os.path.realpath(project)
    for job, log in _logs(client, ids).items():
        lines = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
        assert lines.get("live") == "second", (job, log)  # it started after the edit
        assert lines.get("value") == "first", (job, log)  # and ran the code as submitted
        assert lines.get("submit_dir") == real, (job, log)
        assert lines.get("pwd") != real, (job, log)  # from the unpacked bundle

    source = exp.summary().source
    assert source is not None and source.snapshot is not None
    assert re.fullmatch(r"[0-9a-f]{64}", source.snapshot.hash)
    assert source.snapshot.subdir == ""
    assert source.snapshot.bytes > 0
    assert source.workdir == real
    assert source.git is not None and source.git.commit == head and source.git.dirty is False

    rows: List[Dict[str, Any]] = client.export(exp.id, format="json")
    assert len(rows) == 3
    for r in rows:
        assert r["code_hash"] == source.snapshot.hash
        assert r["workdir"] == real
        assert r["git_commit"] == head and r["git_dirty"] is False


def test_a_snapshot_from_a_subdirectory_runs_there_within_the_bundle(
    client: Client, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The researcher submits from `exp/` of the repository: the whole work tree is bundled
    # and the jobs run in its `exp/`, reaching `../data` as they would in the checkout.
    sub = project / "exp"
    sub.mkdir()
    (sub / "data").mkdir()
    (sub / "data" / "values.txt").write_text("from-sub\n")
    (sub / "data" / "values.txt").chmod(0o644)
    for d in (sub, sub / "data"):
        d.chmod(0o755)
    git(project, "add", ".")
    git(project, "commit", "-q", "-m", "exp")
    monkeypatch.chdir(sub)
    exp = client.submit(
        {
            "name": f"py-proj-subdir-{uuid.uuid4().hex[:8]}",
            "command": ["sh", "-c", BOTH_SH],
            "resources": {"gpus": 0},
        },
        snapshot=True,
    )
    assert exp.id is not None
    exp.wait(timeout=120)
    ids = [j["id"] for j in exp.jobs(frame=False)]
    lines = _logs(client, ids)[ids[0]].splitlines()
    assert lines == ["value=from-sub up=first"], _failures(client, ids)
    source = exp.summary().source
    assert source is not None and source.snapshot is not None
    assert source.snapshot.subdir == "exp"
    assert source.workdir == os.path.realpath(sub)


def test_a_missing_workdir_is_refused_before_anything_is_stored(
    client: Client, project: Path
) -> None:
    before = len(client.experiments())
    missing = project / "no-such-dir"
    with pytest.raises(SourceError) as e:
        client.submit(
            {"name": f"py-proj-missing-{uuid.uuid4().hex[:8]}", "command": ["sh", "run.sh"]},
            workdir=missing,
        )
    assert isinstance(e.value, InvalidError)
    assert e.value.field == "workdir"
    assert str(missing) in str(e.value)
    # A file is no directory either.
    with pytest.raises(SourceError) as e:
        client.submit({"name": "py-proj-file", "command": ["true"]}, workdir=project / "run.sh")
    assert e.value.field == "workdir"
    assert len(client.experiments()) == before
