"""Results beside joules: what a job reports of itself, end to end. A real coordinator and
agent (fake GPUs) run jobs that print the seeds' ``Epoch 3 ... Test Accuracy: 91.2%`` lines
(read by the spec's ``metrics`` patterns) or report with ``headroom_client.report()``; the
export, ``attempts()`` and ``metrics()`` hold the values; ``early_stop`` prunes the same
configurations Optuna's ``SuccessiveHalvingPruner`` prunes on the same curves; and a real
MLflow tracking server receives one run per attempt (and its absence fails no job).

An agent running as root (CI) runs the jobs as ``nobody``: their scripts lie in a folder open
to all, and their Python is one ``nobody`` may run (the test venv's where it can), with this
client importable from a copy open to all (``report`` needs only the standard library)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import httpx
import pandas as pd
import pytest

import headroom_client
from headroom_client import AsyncClient, Client, report
from headroom_client._report import metric_line
from headroom_client._tables import attempts_table, metrics_table
from headroom_client.models import AttemptSeries, AttemptView, JobDetail, StateCounts

from .conftest import TOKEN, free_port, running_cluster

try:
    import pwd

    _NOBODY = pwd.getpwnam("nobody")
    NOBODY, NOGROUP = _NOBODY.pw_uid, _NOBODY.pw_gid
except (ImportError, KeyError):
    NOBODY, NOGROUP = 65534, 65534


# ---- report(): no server needed ----


def _run_python(code: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, **kwargs
    )


def test_report_writes_one_protocol_line_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    report(step=120, val_acc=0.91, loss=3)
    report(**{"val/acc": 0.5, "_ema.loss-2": -1e-3})
    out = capsys.readouterr().out
    assert out == (
        'HEADROOM_METRIC {"step": 120, "val_acc": 0.91, "loss": 3.0}\n'
        'HEADROOM_METRIC {"val/acc": 0.5, "_ema.loss-2": -0.001}\n'
    )
    # The line is `HEADROOM_METRIC`, a space and a JSON object.
    for line in out.splitlines():
        head, _, doc = line.partition(" ")
        assert head == "HEADROOM_METRIC" and isinstance(json.loads(doc), dict)
    # A diverged value is written as null (headroom counts it ignored); the rest stands.
    assert metric_line(2, loss=float("nan"), acc=0.5) == 'HEADROOM_METRIC {"step": 2, "loss": null, "acc": 0.5}'
    assert metric_line(acc=float("inf")) == 'HEADROOM_METRIC {"acc": null}'
    # NumPy scalars (anything float() and operator.index() take) will do.
    np = pytest.importorskip("numpy")
    assert metric_line(np.int64(7), acc=np.float32(0.5)) == 'HEADROOM_METRIC {"step": 7, "acc": 0.5}'


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"acc": "0.9"}, "'acc'"),
        ({"acc": None}, "'acc'"),
        ({"acc": True}, "'acc'"),
        ({"ok": 1.0, "9lives": 1.0}, "'9lives'"),
        ({"val acc": 1.0}, "'val acc'"),
        ({"a" * 65: 1.0}, "at most 64 bytes"),
        ({"step": -1, "acc": 1.0}, "step"),
        ({"step": 1.5, "acc": 1.0}, "step"),
        ({"step": True, "acc": 1.0}, "step"),
        ({"step": 3}, "at least one metric"),
    ],
)
def test_report_refuses_what_is_no_metric_naming_it(
    kwargs: Dict[str, Any], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError) as e:
        report(**kwargs)
    assert says in str(e.value)
    assert capsys.readouterr().out == "", "nothing is written"


def test_report_flushes_at_once_and_imports_nothing_heavy() -> None:
    # Standard output a pipe (block-buffered, as a job's is): the line arrives while the
    # process still runs, and neither httpx, pydantic nor yaml was imported for it.
    code = (
        "import sys, time\n"
        "from headroom_client import report\n"
        "report(step=1, loss=0.5)\n"
        "heavy = sorted(m for m in ('httpx', 'pydantic', 'yaml', 'pandas') if m in sys.modules)\n"
        "print('heavy=' + ','.join(heavy), file=sys.stderr, flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line == 'HEADROOM_METRIC {"step": 1, "loss": 0.5}\n'
        assert proc.poll() is None, "read before the process ended: flushed"
        assert proc.stderr.readline().strip() == "heavy="
    finally:
        proc.kill()
        proc.wait()
    # The client's names are still there, imported when first named.
    done = _run_python(
        "import sys, headroom_client as h\n"
        "assert 'httpx' not in sys.modules\n"
        "assert h.Client.__name__ == 'Client' and 'httpx' in sys.modules\n"
        "from headroom_client import AttemptSeries, JobsFailedError, Records\n"
        "assert 'report' in dir(h) and 'Client' in dir(h)\n"
        "try:\n"
        "    h.NoSuchName\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    assert done.returncode == 0, done.stderr
    assert "report" in headroom_client.__all__


def test_counts_and_tables_know_pruned_jobs_and_metric_columns() -> None:
    counts = StateCounts(
        queued=0, leased=0, running=1, retrying=0, succeeded=2, failed=1, cancelled=0, pruned=3
    )
    assert counts.total == 7 and counts.finished == 6
    # An older coordinator's counts have no `pruned`.
    assert StateCounts.model_validate(
        {k: 0 for k in ("queued", "leased", "running", "retrying", "succeeded", "failed")}
        | {"cancelled": 1}
    ).pruned == 0

    # The JSON export's rows: metrics nested (`metrics`) or as `metric.NAME` beside them.
    columns = [
        {"name": n, "type": t}
        for n, t in [
            ("experiment", "string"),
            ("job_id", "string"),
            ("job_index", "integer"),
            ("config", "integer"),
            ("run", "integer"),
            ("attempt", "integer"),
            ("attempt_id", "string"),
            ("success", "boolean"),
            ("energy_j", "number"),
        ]
    ]
    base = {"experiment": "e", "job_id": "j", "config": 0, "run": 0, "attempt": 1}
    rows = [
        {**base, "job_index": 0, "attempt_id": "a0", "success": True, "energy_j": 12.5,
         "params": {"lr": 0.1}, "metrics": {"lr": 0.5, "energy_j": 7}},
        {**base, "job_index": 1, "attempt_id": "a1", "success": True, "energy_j": None,
         "params": {"lr": 0.2}, "metric.acc": 0.75},
        {**base, "job_index": 2, "attempt_id": "a2", "success": False, "energy_j": 3.0,
         "params": {"lr": 0.3}, "metrics": {}},
    ]
    table = attempts_table(columns, rows)
    names = [c.name for c in table.columns]
    assert names == [
        "experiment", "job_id", "job_index", "config", "run", "attempt", "attempt_id",
        "params.lr", "metric.acc", "metric.energy_j", "metric.lr", "success", "energy_j",
    ]
    from headroom_client.frames import table_frame

    df = table_frame(table)
    assert df["params.lr"].tolist() == [0.1, 0.2, 0.3]
    assert df["metric.lr"].tolist()[0] == 0.5 and math.isnan(df["metric.lr"].tolist()[1])
    assert df["metric.energy_j"].tolist()[0] == 7.0
    assert df["energy_j"].tolist()[0] == 12.5
    assert df["metric.acc"].dtype == "float64" and df["metric.energy_j"].dtype == "float64"
    assert df["metric.acc"].isna().tolist() == [True, False, True], "never reported: NaN, not 0"

    series = [
        AttemptSeries.model_validate(
            {
                "attempt": "a0", "job": "j0", "index": 0, "number": 1, "params": {"lr": 0.1},
                "state": "running", "live": True, "finals": {"acc": 0.9}, "ignored": 0,
                "series": {
                    "loss": [{"step": 1, "t": 0.5, "value": 2.0}],
                    "acc": [{"step": 1, "t": 0.5, "value": 0.8}, {"step": 2, "t": 1.0, "value": 0.9}],
                },
            }
        )
    ]
    m = table_frame(metrics_table(s.model_dump() for s in series))
    assert list(m.columns) == [
        "attempt", "job", "index", "number", "params.lr", "metric", "step", "t", "value",
    ]
    assert m[["metric", "step", "value"]].values.tolist() == [
        ["acc", 1, 0.8], ["acc", 2, 0.9], ["loss", 1, 2.0],
    ]
    assert m["step"].dtype == "int64" and m["value"].dtype == "float64"
    empty = table_frame(metrics_table([]))
    assert empty.empty and list(empty.columns) == [
        "attempt", "job", "index", "number", "metric", "step", "t", "value",
    ]


# ---- end to end: where the jobs run from, and with what Python ----


def _open_to_all(root: Path) -> None:
    """Directories 0755, files 0644 (scripts 0755): a job run as ``nobody`` reads them."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)


def _runs_for_the_jobs(python: str) -> bool:
    """Whether a job may run ``python``: as ``nobody`` where the agent is root."""
    if not python or not os.path.exists(python):
        return False
    extra: Dict[str, Any] = {}
    if os.geteuid() == 0:
        extra = {"user": NOBODY, "group": NOGROUP, "extra_groups": []}
    try:
        done = subprocess.run(
            [python, "-c", "import json, sys; assert sys.version_info >= (3, 8)"],
            cwd="/",
            capture_output=True,
            timeout=60,
            **extra,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def job_python() -> str:
    """The Python the jobs run: the test venv's (``$HEADROOM_TEST_PYTHON``, else this one)
    where the jobs' user may run it, else the system's."""
    candidates = [
        os.environ.get("HEADROOM_TEST_PYTHON", ""),
        sys.executable,
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ]
    for python in candidates:
        if _runs_for_the_jobs(python):
            return python
    pytest.fail(f"no Python the jobs' user may run among {candidates}")


@pytest.fixture(scope="module")
def job_site() -> Iterator[Path]:
    """This client, as installed, copied where the jobs' user may read it: their
    ``PYTHONPATH``, so that ``from headroom_client import report`` works in a job."""
    top = Path(tempfile.mkdtemp(prefix="headroom-site-")).resolve()
    try:
        shutil.copytree(
            Path(headroom_client.__file__).parent,
            top / "headroom_client",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        _open_to_all(top)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A folder the jobs run in (their scripts are written there), open to all."""
    top = Path(tempfile.mkdtemp(prefix="headroom-results-")).resolve()
    try:
        os.chmod(top, 0o755)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _write(workdir: Path, name: str, text: str) -> str:
    path = workdir / name
    path.write_text(text)
    _open_to_all(workdir)
    return str(path)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _submit(client: Client, workdir: Path, spec: Dict[str, Any]) -> Any:
    """Submits from ``workdir``, with no Python environment to activate (the commands name
    their interpreter)."""
    return client.submit(spec, workdir=workdir, environment="none")


def _details(client: Client, exp_id: str) -> List[JobDetail]:
    jobs = client.job_list(exp_id)
    return sorted((client.job(j.id) for j in jobs), key=lambda d: d.index)


def _explain(client: Client, exp_id: str) -> str:
    """Each job's state, its attempts' classes and metrics, and its log."""
    out = []
    for d in _details(client, exp_id):
        last: Optional[AttemptView] = d.attempts_detail[-1] if d.attempts_detail else None
        out.append(
            f"job {d.index} {d.id}: {d.state} params={d.params} "
            f"class={last.failure_class if last else None} "
            f"metrics={last.metrics if last else None} "
            f"ignored={last.metrics_ignored if last else None} "
            f"rungs={[r.model_dump() for r in last.rungs] if last else None} "
            f"tracking={last.tracking if last else None}\n"
            + "".join(client.logs(d.id))
        )
    return "\n".join(out)


def _csv(text: str) -> Tuple[List[str], List[Dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    rows = list(reader)
    return list(reader.fieldnames or []), rows


SEEDS_SH = """\
printf 'Epoch 1 loss 0.9 Test Accuracy: 80.5%%\\n'
printf 'Epoch 2 loss 0.5 Test Accuracy: 91.2%%\\n'
printf 'Epoch 3 loss 0.6 Test Accuracy: 89.0%%\\n'
if [ "$1" = hit ]; then printf 'Rare: 7\\n'; fi
printf 'done\\n'
"""


def test_a_seeds_log_read_by_patterns_fills_the_export_and_frames(
    client: Client, workdir: Path
) -> None:
    script = _write(workdir, "seeds.sh", SEEDS_SH)
    name = _unique("py-results-seeds")
    exp = _submit(
        client,
        workdir,
        {
            "name": name,
            "command": ["sh", script, "{variant}"],
            "grid": {"variant": ["hit", "miss"]},
            "resources": {"gpus": 0},
            "metrics": {
                "val_acc": {"pattern": r"Test Accuracy: ([0-9.]+)%", "take": "max", "scale": 0.01},
                "rare": {"pattern": r"Rare: ([0-9]+)"},
                "never": {"pattern": r"no such line ([0-9]+)"},
            },
            "metric_step": r"Epoch ([0-9]+)",
        },
    )
    assert exp.id is not None
    done = exp.wait(timeout=120)
    assert done.counts.succeeded == 2, _explain(client, exp.id)

    # The CSV export: `metric.NAME` after the parameters; a value never seen is empty.
    header, rows = _csv(exp.export())
    assert "metric.val_acc" in header and "metric.rare" in header, header
    assert header.index("variant") < header.index("metric.rare") < header.index("metric.val_acc")
    by = {r["variant"]: r for r in rows}
    assert float(by["hit"]["metric.val_acc"]) == pytest.approx(0.912)
    assert float(by["miss"]["metric.val_acc"]) == pytest.approx(0.912)
    assert float(by["hit"]["metric.rare"]) == 7.0
    assert by["miss"]["metric.rare"] == "", "never reported: empty, not 0"
    assert all(r.get("metric.never", "") == "" for r in rows), rows

    # The JSON export: `metrics` per row.
    jrows = exp.export(format="json")
    jby = {r["params"]["variant"]: r for r in jrows}
    assert jby["hit"]["metrics"]["val_acc"] == pytest.approx(0.912)
    assert jby["hit"]["metrics"]["rare"] == 7.0
    assert "rare" not in jby["miss"]["metrics"] and "never" not in jby["miss"]["metrics"]

    # attempts(): float columns, NaN where never reported.
    frame = exp.attempts()
    assert frame["metric.val_acc"].dtype == "float64"
    fby = {r["params.variant"]: r for _, r in frame.iterrows()}
    assert fby["hit"]["metric.val_acc"] == pytest.approx(0.912)
    assert fby["hit"]["metric.rare"] == 7.0 and math.isnan(fby["miss"]["metric.rare"])
    if "metric.never" in frame.columns:
        assert frame["metric.never"].isna().all()
    assert list(frame.columns).index("params.variant") < list(frame.columns).index("metric.rare")

    # metrics(): each epoch's accuracy at its step (`metric_step`), per attempt.
    m = exp.metrics()
    assert list(m.columns) == [
        "attempt", "job", "index", "number", "params.variant", "metric", "step", "t", "value",
    ]
    acc = m[m["metric"] == "val_acc"]
    for variant in ("hit", "miss"):
        one = acc[acc["params.variant"] == variant]
        assert one["step"].tolist() == [1, 2, 3], one
        assert one["value"].tolist() == pytest.approx([0.805, 0.912, 0.89])
        assert (one["t"] >= 0).all() and one["t"].is_monotonic_increasing
        assert set(one["number"]) == {1}
    assert set(m["metric"]) == {"val_acc", "rare"}
    assert m[m["metric"] == "rare"]["params.variant"].tolist() == ["hit"]

    # The models: finals per attempt, no value for `never`, no ignored line.
    for s in client.metric_series(name):
        assert s.finals["val_acc"] == pytest.approx(0.912) and "never" not in s.finals
        assert s.ignored == 0 and s.live is False and s.state == "succeeded"
        assert ("rare" in s.finals) == (s.params["variant"] == "hit")
    for d in _details(client, exp.id):
        view = d.attempts_detail[-1]
        assert view.metrics["val_acc"] == pytest.approx(0.912)
        assert "never" not in view.metrics
        assert not view.metrics_ignored


TRAIN_PY = """\
import time

from headroom_client import report

for step in range(1, 6):
    report(step=step * 10, loss=1.0 / step, acc=step / 10)
    time.sleep(0.05)
report(**{"val/acc": 0.25})
print("trained")
"""


def test_a_job_reporting_with_report_fills_the_export_and_frames(
    client: Client, workdir: Path, job_python: str, job_site: Path
) -> None:
    script = _write(workdir, "train.py", TRAIN_PY)
    name = _unique("py-results-report")
    exp = _submit(
        client,
        workdir,
        {
            "name": name,
            "command": [job_python, script],
            "env": {"PYTHONPATH": str(job_site), "PYTHONDONTWRITEBYTECODE": "1"},
            "resources": {"gpus": 0},
            # No pattern: only how `acc`'s final value is taken.
            "metrics": {"acc": {"take": "max"}, "loss": {"take": "min"}},
        },
    )
    assert exp.id is not None
    done = exp.wait(timeout=120)
    assert done.counts.succeeded == 1, _explain(client, exp.id)
    job = client.job_list(exp.id)[0]
    log = "".join(client.logs(job.id))
    assert 'HEADROOM_METRIC {"step": 10, "loss": 1.0, "acc": 0.1}' in log and "trained" in log

    rows = exp.export(format="json")
    assert rows[0]["metrics"] == {"acc": 0.5, "loss": 0.2, "val/acc": 0.25}
    header, crows = _csv(exp.export())
    assert {"metric.acc", "metric.loss", "metric.val/acc"} <= set(header)
    assert float(crows[0]["metric.acc"]) == 0.5 and float(crows[0]["metric.loss"]) == 0.2

    frame = exp.attempts()
    assert frame["metric.acc"].tolist() == [0.5] and frame["metric.loss"].tolist() == [0.2]
    assert frame["metric.val/acc"].tolist() == [0.25]

    m = client.metrics(name)  # by name
    loss = m[m["metric"] == "loss"]
    assert loss["step"].tolist() == [10, 20, 30, 40, 50]
    assert loss["value"].tolist() == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2])
    # Without a step: the count of that metric's values so far.
    assert m[m["metric"] == "val/acc"]["step"].tolist() == [1]
    records = exp.metrics(frame=False)
    assert len(records) == len(m) and list(records[0]) == list(m.columns)

    view = client.job(job.id).attempts_detail[-1]
    assert view.metrics == {"acc": 0.5, "loss": 0.2, "val/acc": 0.25}
    assert view.tracking is None  # no `tracking` in the spec


BOTH_SH = """\
printf 'HEADROOM_METRIC {"lr": 0.5, "energy_j": 7}\\n'
sleep 1
"""


def test_metrics_named_like_a_parameter_or_a_measurement_keep_their_own_columns(
    client: Client, workdir: Path
) -> None:
    script = _write(workdir, "both.sh", BOTH_SH)
    name = _unique("py-results-names")
    exp = _submit(
        client,
        workdir,
        {
            "name": name,
            "command": ["sh", script],
            "grid": {"lr": [0.1]},
            "resources": {"gpus": 1, "memory": "1GiB"},
        },
    )
    assert exp.id is not None
    done = exp.wait(timeout=120)
    assert done.counts.succeeded == 1, _explain(client, exp.id)
    view = client.job(client.job_list(exp.id)[0].id).attempts_detail[-1]
    assert view.metrics == {"lr": 0.5, "energy_j": 7.0}

    header, rows = _csv(exp.export())
    # The parameter, then the metrics (sorted), in the CSV; each name once.
    i = header.index("lr")
    assert header[i : i + 3] == ["lr", "metric.energy_j", "metric.lr"], header
    assert header.count("energy_j") == 1 and header.count("lr") == 1
    assert float(rows[0]["lr"]) == 0.1 and float(rows[0]["metric.lr"]) == 0.5
    assert float(rows[0]["metric.energy_j"]) == 7.0
    # The measured energy is the attempt's, whatever the job said.
    measured = rows[0]["energy_j"]
    if view.energy_j is None:
        assert measured == ""
    else:
        assert float(measured) == pytest.approx(view.energy_j)

    jrow = exp.export(format="json")[0]
    assert jrow["params"] == {"lr": 0.1} and jrow["metrics"] == {"lr": 0.5, "energy_j": 7.0}
    assert jrow["energy_j"] == view.energy_j

    frame = exp.attempts()
    cols = list(frame.columns)
    assert cols.count("energy_j") == 1 and cols.count("metric.energy_j") == 1
    assert cols.index("params.lr") < cols.index("metric.energy_j") < cols.index("metric.lr")
    assert frame["params.lr"].tolist() == [0.1] and frame["metric.lr"].tolist() == [0.5]
    assert frame["metric.energy_j"].tolist() == [7.0]
    energy = frame["energy_j"].tolist()[0]
    assert (math.isnan(energy) and view.energy_j is None) or energy == pytest.approx(view.energy_j)
    rec = exp.attempts(frame=False)[0]
    assert rec["params.lr"] == 0.1 and rec["metric.lr"] == 0.5 and rec["metric.energy_j"] == 7.0


BAD_LINES_SH = """\
printf 'HEADROOM_METRIC {"acc": 0.5\\n'
printf 'HEADROOM_METRIC [1, 2]\\n'
printf 'HEADROOM_METRIC {"acc": 0.75}\\n'
printf 'still fine\\n'
"""


def test_a_malformed_metric_line_is_counted_and_fails_nothing(
    client: Client, workdir: Path
) -> None:
    script = _write(workdir, "bad.sh", BAD_LINES_SH)
    exp = _submit(
        client,
        workdir,
        {"name": _unique("py-results-bad"), "command": ["sh", script], "resources": {"gpus": 0}},
    )
    assert exp.id is not None
    done = exp.wait(timeout=120, raise_on_failure=True)
    assert done.counts.succeeded == 1, _explain(client, exp.id)
    d = _details(client, exp.id)[0]
    view = d.attempts_detail[-1]
    assert d.state == "succeeded" and view.success is True
    assert view.metrics_ignored == 2, _explain(client, exp.id)
    assert view.metrics == {"acc": 0.75}
    (series,) = exp.metric_series()
    assert series.ignored == 2 and series.finals == {"acc": 0.75}
    assert [p.value for p in series.series["acc"]] == [0.75]
    assert exp.attempts()["metric.acc"].tolist() == [0.75]


async def test_the_async_client_reads_metrics_too(cluster: str, workdir: Path) -> None:
    script = _write(workdir, "bad.sh", BAD_LINES_SH)
    async with AsyncClient(cluster, TOKEN) as c:
        exp = await c.submit(
            {"name": _unique("py-results-async"), "command": ["sh", script], "resources": {"gpus": 0}},
            workdir=workdir,
            environment="none",
        )
        assert exp.id is not None
        done = await exp.wait(timeout=120)
        assert done.counts.succeeded == 1 and done.counts.pruned == 0
        m = await exp.metrics()
        assert m[["metric", "step", "value"]].values.tolist() == [["acc", 1, 0.75]]
        (series,) = await c.metric_series(exp.id)
        assert series.finals == {"acc": 0.75} and series.ignored == 2
        assert (await c.metrics(exp.id, frame=False))[0]["value"] == 0.75
        frame = await exp.attempts()
        assert frame["metric.acc"].tolist() == [0.75]


# ---- early stopping, against Optuna ----

#: Steps each scripted curve has; `early_stop`'s rungs with grace 2 and factor 2: 2, 4, 8.
STEPS = 12
GRACE = 2
FACTOR = 2


def _curve(final: float, speed: float, wobble: float) -> List[float]:
    return [
        round(final * (1 - math.exp(-s / speed)) + wobble * math.sin(s * 1.7), 4)
        for s in range(1, STEPS + 1)
    ]


#: Eight learning curves: fast and slow starters, low and high plateaus, a little wobble.
CURVES = [
    _curve(*c)
    for c in [
        (0.80, 3.0, 0.010),
        (0.60, 2.0, 0.020),
        (0.90, 6.0, 0.010),
        (0.70, 1.5, 0.015),
        (0.95, 4.0, 0.005),
        (0.50, 1.0, 0.010),
        (0.85, 2.5, 0.020),
        (0.75, 8.0, 0.010),
    ]
]

CURVE_PY = """\
import json
import sys
import time

from headroom_client import report

curve = json.load(open("curves.json"))[int(sys.argv[1])]
for step, value in enumerate(curve, start=1):
    report(step=step, val_acc=value)
    time.sleep(0.4)
# Wrapping up (a checkpoint, an evaluation): a job pruned at its last rung is stopped before
# it ends of itself, however late the decision comes (about two seconds here).
time.sleep(5)
print("finished all steps")
"""


@contextlib.contextmanager
def _one_gpu_cluster(node: str, *coordinator_flags: str) -> Iterator[str]:
    """A coordinator (with `coordinator_flags`) and an agent with one fake GPU of one slot:
    jobs run one at a time, in the order they were submitted."""
    with running_cluster(node, "1x24GiB", "1", *coordinator_flags) as url:
        with Client(url, TOKEN) as c:
            assert [g.slots for g in c.nodes()[0].gpus] == [1]
        yield url


@pytest.fixture(scope="module")
def serial_cluster() -> Iterator[str]:
    with _one_gpu_cluster("py-serial") as url:
        yield url


def _optuna_asha(order: List[int]) -> Tuple[Dict[int, int], Dict[Tuple[int, int], List[float]]]:
    """The curves (in ``order``) as Optuna trials, one after the other, each reporting every
    step and asking ``should_prune``: the step each pruned one stopped at, and the values
    each trial was compared with at each rung it reached (its own included)."""
    try:
        import optuna
    except ImportError:
        pytest.fail("optuna is not installed (requirements-test.txt)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = optuna.pruners.SuccessiveHalvingPruner(
        min_resource=GRACE, reduction_factor=FACTOR, min_early_stopping_rate=0, bootstrap_count=0
    )
    study = optuna.create_study(direction="maximize", pruner=pruner)
    pruned: Dict[int, int] = {}
    compared: Dict[Tuple[int, int], List[float]] = {}
    seen: Dict[int, Dict[int, float]] = {}  # rung -> {curve: its value there}
    for i in order:
        trial = study.ask()
        for step, value in enumerate(CURVES[i], start=1):
            trial.report(value, step)
            stop = trial.should_prune()
            attrs = study.get_trials(deepcopy=False)[-1].system_attrs
            for key, v in attrs.items():
                if key.startswith("completed_rung_"):
                    rung = int(key.rsplit("_", 1)[1])
                    if i not in seen.setdefault(rung, {}):
                        seen[rung][i] = v
                        compared[(i, rung)] = list(seen[rung].values())
            if stop:
                pruned[i] = step
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(trial, CURVES[i][-1])
    return pruned, compared


def test_early_stopping_prunes_what_optunas_successive_halving_prunes(
    serial_cluster: str, workdir: Path, job_python: str, job_site: Path
) -> None:
    _write(workdir, "curves.json", json.dumps(CURVES))
    script = _write(workdir, "curve.py", CURVE_PY)
    with Client(serial_cluster, TOKEN) as client:
        exp = _submit(
            client,
            workdir,
            {
                "name": _unique("py-results-asha"),
                "command": [job_python, script, "{curve}"],
                "env": {"PYTHONPATH": str(job_site), "PYTHONDONTWRITEBYTECODE": "1"},
                "grid": {"curve": list(range(len(CURVES)))},
                "resources": {"gpus": 1, "memory": "1GiB"},
                "early_stop": {
                    "metric": "val_acc",
                    "mode": "max",
                    "rule": "asha",
                    "grace_steps": GRACE,
                    "reduction_factor": FACTOR,
                    "min_early_stopping_rate": 0,
                    "bootstrap_count": 0,
                },
            },
        )
        assert exp.id is not None
        # Pruned is no failure: nothing raises.
        done = exp.wait(timeout=600, raise_on_failure=True)
        details = _details(client, exp.id)
        why = _explain(client, exp.id)

        # One at a time, in submission order: the comparisons Optuna makes trial after trial.
        spans = [(a.started_at, a.ended_at, d.params["curve"]) for d in details for a in d.attempts_detail]
        assert all(s is not None and e is not None for s, e, _ in spans), why
        runs = sorted(spans, key=lambda r: r[0])
        for (_, ended, _), (started, _, _) in zip(runs, runs[1:]):
            assert started >= ended, f"attempts overlapped: {runs}"
        order = [c for _, _, c in runs]
        assert len(order) == len(CURVES), why

        want_pruned, compared = _optuna_asha(order)
        assert 0 < len(want_pruned) < len(CURVES), "the curves prune some, not all"

        got_pruned = {d.params["curve"] for d in details if d.state == "pruned"}
        assert got_pruned == set(want_pruned), f"optuna prunes {want_pruned}\n{why}"
        assert done.counts.pruned == len(want_pruned) and done.counts.failed == 0
        assert done.counts.succeeded == len(CURVES) - len(want_pruned)

        series = {s.params["curve"]: s for s in exp.metric_series()}
        for d in details:
            curve = d.params["curve"]
            (attempt,) = d.attempts_detail  # pruned: never retried
            s = series[curve]
            if curve in want_pruned:
                assert d.state == "pruned" and attempt.failure_class == "pruned", why
                assert d.last_failure in (None, "pruned"), why
                # It stopped at the rung Optuna stopped it at, not at the end.
                stops = [r for r in attempt.rungs if r.pruned]
                assert [r.step for r in stops] == [want_pruned[curve]], why
                assert attempt.rungs[-1].pruned and s.rungs == attempt.rungs
                # Stopped by headroom, not ended of itself.
                log = "".join(client.logs(d.id))
                assert "finished all steps" not in log, (curve, log)
                assert max(p.step for p in s.series["val_acc"]) >= want_pruned[curve]
            else:
                assert d.state == "succeeded" and attempt.failure_class is None, why
                assert not any(r.pruned for r in attempt.rungs), why
                assert [p.step for p in s.series["val_acc"]] == list(range(1, STEPS + 1))
            # Each rung reached: its step, the curve's value there, and whom it was compared
            # with, as Optuna compared them.
            for r in attempt.rungs:
                assert r.step == GRACE * FACTOR**r.rung
                assert r.value == CURVES[curve][r.step - 1]
                values = compared[(curve, r.rung)]
                assert r.competitors == len(values), (curve, r, values)
                if r.cutoff is not None:
                    keep = max(len(values) // FACTOR - 1, 0)
                    assert r.cutoff == sorted(values, reverse=True)[keep], (curve, r, values)
            reached = {rung for (c, rung) in compared if c == curve}
            assert {r.rung for r in attempt.rungs} == reached, (curve, attempt.rungs)

        # The export and the frames say so too.
        frame = exp.attempts()
        fby = {r["params.curve"]: r for _, r in frame.iterrows()}
        for curve in range(len(CURVES)):
            assert (fby[curve]["failure_class"] == "pruned") == (curve in want_pruned)
        jobs = exp.jobs()
        assert sorted(jobs[jobs["state"] == "pruned"]["params.curve"]) == sorted(want_pruned)


# ---- MLflow ----


def _mlflow_exe() -> str:
    exe = Path(sys.executable).parent / "mlflow"
    found = str(exe) if exe.exists() else shutil.which("mlflow")
    if not found:
        pytest.fail("mlflow is not installed (requirements-test.txt)")
    return found


class MlflowServer:
    """A real MLflow tracking server on loopback (SQLite in a folder of its own)."""

    def __init__(self, dir: Path, port: Optional[int] = None) -> None:
        self.dir = dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = dir / "mlflow.log"
        self._file = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [
                _mlflow_exe(),
                "server",
                "--backend-store-uri",
                f"sqlite:///{dir / 'mlflow.db'}",
                "--default-artifact-root",
                str(dir / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._file,
            stderr=subprocess.STDOUT,
            cwd=dir,
            # Its own process group: the server's workers stop with it.
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"mlflow server exited:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"mlflow server did not answer /health:\n{self.output()}")
            time.sleep(0.5)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # Its workers too (the group outlives its leader for a moment).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._file.close()

    def again(self) -> "MlflowServer":
        """The same server started again: its port, its database."""
        return MlflowServer(self.dir, self.port)

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = httpx.request(method, f"{self.url}/api/2.0/mlflow/{path}", timeout=30, **kwargs)
        assert resp.status_code == 200, f"{method} {path}: {resp.status_code} {resp.text}"
        return resp.json()


@pytest.fixture
def mlflow_server() -> Iterator[MlflowServer]:
    dir = Path(tempfile.mkdtemp(prefix="headroom-mlflow-"))
    server = MlflowServer(dir)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(dir, ignore_errors=True)


def _tracked(client: Client, job_id: str, prefix: str, timeout: float) -> AttemptView:
    """The job's last attempt once its ``tracking`` starts with ``prefix``: ``mlflow run
    RUN_ID`` once written; ``mlflow unreachable (try N of 8, ...)`` while the coordinator
    tries again (``waiting to be written`` before its first try)."""
    deadline = time.monotonic() + timeout
    while True:
        view = client.job(job_id).attempts_detail[-1]
        if view.tracking is not None and view.tracking.startswith(prefix):
            return view
        if time.monotonic() > deadline:
            pytest.fail(f"attempt {view.id}: `tracking` still {view.tracking!r} after {timeout}s")
        time.sleep(0.5)


TRACKED_SH = """\
for s in 1 2 3; do
  printf 'HEADROOM_METRIC {"step": %s, "loss": %s}\\n' "$s" "$(awk "BEGIN{print $1 * $s}")"
  sleep 0.2
done
"""


def test_each_attempt_becomes_an_mlflow_run_and_a_lost_tracker_fails_no_job(
    workdir: Path, mlflow_server: MlflowServer
) -> None:
    # The coordinator writes only to the tracking servers its admin listed.
    with _one_gpu_cluster("py-tracked", "--mlflow-servers", mlflow_server.url) as url, Client(
        url, TOKEN
    ) as client:
        _tracked_runs(client, workdir, mlflow_server)


def _tracked_runs(client: Client, workdir: Path, mlflow_server: MlflowServer) -> None:
    script = _write(workdir, "tracked.sh", TRACKED_SH)
    name = _unique("py-results-mlflow")
    exp = _submit(
        client,
        workdir,
        {
            "name": name,
            "command": ["sh", script, "{lr}"],
            "grid": {"lr": [0.5, 2]},
            "resources": {"gpus": 1, "memory": "1GiB"},
            "tracking": {"mlflow": mlflow_server.url},
        },
    )
    assert exp.id is not None
    done = exp.wait(timeout=180)
    assert done.counts.succeeded == 2, _explain(client, exp.id)

    details = _details(client, exp.id)
    views = {d.id: _tracked(client, d.id, "mlflow run ", timeout=60) for d in details}

    # The experiment is named as headroom's; one run per attempt.
    found = mlflow_server.api("GET", "experiments/get-by-name", params={"experiment_name": name})
    exp_id = found["experiment"]["experiment_id"]
    runs = mlflow_server.api(
        "POST", "runs/search", json={"experiment_ids": [exp_id], "max_results": 100}
    ).get("runs", [])
    assert len(runs) == 2, runs
    by_id = {r["info"]["run_id"]: r for r in runs}
    for d in details:
        view = views[d.id]
        assert view.tracking is not None
        run_id = view.tracking.split()[-1]
        assert run_id in by_id, (view.tracking, list(by_id))
        run = by_id[run_id]
        assert run["info"]["run_name"] == f"{name}-{d.index}-{view.number}"
        assert run["info"]["status"] == "FINISHED"
        data = run["data"]
        tags = {t["key"]: t["value"] for t in data.get("tags", [])}
        assert tags.get("headroom.job") == d.id, tags
        assert tags.get("headroom.attempt") == view.id, tags
        assert tags.get("headroom.experiment") == name, tags
        params = {p["key"]: p["value"] for p in data.get("params", [])}
        assert float(params["lr"]) == d.params["lr"], params
        metrics = {m["key"]: m["value"] for m in data.get("metrics", [])}
        # The job's own metric: its series, step by step, and its final value.
        lr = float(d.params["lr"])
        assert metrics["loss"] == pytest.approx(lr * 3), metrics
        history = mlflow_server.api(
            "GET", "metrics/get-history", params={"run_id": run_id, "metric_key": "loss"}
        )["metrics"]
        by_step = {h["step"]: h["value"] for h in history}
        for s in (1, 2, 3):
            assert by_step.get(s) == pytest.approx(lr * s), history
        # headroom's own figures, named apart from the job's metrics: the energy (fake GPUs
        # count it), `clean` as 1/0.
        assert view.energy_j is not None, "fake GPUs have an energy counter"
        assert metrics["headroom.energy_j"] == pytest.approx(view.energy_j), metrics
        if view.peak_mem_mib is not None:
            assert metrics["headroom.peak_mem_mib"] == pytest.approx(view.peak_mem_mib), metrics
        assert metrics.get("headroom.clean") in (0.0, 1.0), metrics

    # The tracker goes away: the next job still succeeds, and its attempt says at once that
    # its results could not be written, and that they will be tried again.
    mlflow_server.stop()
    lost = _submit(
        client,
        workdir,
        {
            "name": _unique("py-results-mlflow-lost"),
            "command": ["sh", script, "1"],
            "resources": {"gpus": 0},
            "tracking": {"mlflow": mlflow_server.url},
        },
    )
    assert lost.id is not None
    done = lost.wait(timeout=120)
    assert done.counts.succeeded == 1, _explain(client, lost.id)
    job = client.job_list(lost.id)[0]
    assert client.job(job.id).state == "succeeded"
    view = _tracked(client, job.id, "mlflow unreachable (try ", timeout=30)
    assert view.tracking is not None and mlflow_server.url in view.tracking, view.tracking
    assert view.success is True and view.metrics.get("loss") == 3.0

    # It comes back: the run is written by a later try, once.
    back = mlflow_server.again()
    try:
        view = _tracked(client, job.id, "mlflow run ", timeout=120)
        assert view.tracking is not None
        run = back.api("GET", "runs/get", params={"run_id": view.tracking.split()[-1]})["run"]
        assert run["info"]["status"] == "FINISHED"
        tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
        assert tags["headroom.attempt"] == view.id
    finally:
        back.stop()
