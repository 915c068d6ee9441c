"""The package is typed (PEP 561) and its types are precise: ``mypy --strict`` passes on the
package and on the notebook-style example, whose DataFrames, models and datetimes are the
types it says, and the example runs against a real coordinator."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

import pytest

import headroom_client

from .conftest import BIN_DIR, REPO, TOKEN

HERE = Path(__file__).resolve().parents[1]
EXAMPLE = HERE / "examples" / "notebook.py"
CACHE = REPO / "target" / "mypy-cache"

# What users write, with each expression's type pinned: `assert_type` fails on Any too.
PRECISE = '''
from datetime import datetime, timedelta
from typing import Any, Dict, List, Optional

import pandas as pd
from typing_extensions import assert_type

from headroom_client import (
    AsyncClient, AsyncExperiment, AttemptSeries, AttemptTelemetry, Client, Experiment, GpuSeries,
    JobsFailedError, Point, RungDecision, ShareStanding, TelemetrySample, UsageReport, UsageRow,
    report,
)
from headroom_client.models import (
    AttemptView, JobDetail, Progress, RetryFailedResponse, StudyRef, SubmittedVariant,
)


def check(hr: Client) -> None:
    exp = hr.submit("sweep.yaml")
    assert_type(exp.wait(raise_on_failure=True), Progress)
    assert_type(hr.wait("lr-sweep", progress=True), Progress)
    assert_type(exp.attempts(), pd.DataFrame)
    assert_type(exp.attempts(frame=False), List[Dict[str, Any]])
    assert_type(exp.jobs(), pd.DataFrame)
    assert_type(hr.jobs("lr-sweep"), pd.DataFrame)
    assert_type(hr.jobs(frame=False), List[Dict[str, Any]])
    assert_type(hr.attempts("lr-sweep", clean_only=True), pd.DataFrame)
    assert_type(hr.job("j"), JobDetail)
    assert_type(hr.job("j").created_at, datetime)
    assert_type(hr.attempt("a"), AttemptView)
    assert_type(hr.attempt("a").ended_at, Optional[datetime])
    t = hr.attempt_telemetry("a")
    assert_type(t, AttemptTelemetry)
    assert_type(t.from_, Optional[datetime])
    assert_type(t.gpus[0].samples[0], TelemetrySample)
    assert_type(t.gpus[0].samples[0].at, datetime)
    assert_type(t.to_frame(), pd.DataFrame)
    assert_type(hr.attempt_telemetry_frame("a"), pd.DataFrame)
    assert_type(hr.gpu_telemetry("node", 0, since=datetime(2024, 1, 1)), GpuSeries)
    assert_type(hr.gpu_telemetry_frame("node", 0), pd.DataFrame)
    assert_type(hr.export("lr-sweep"), str)
    assert_type(hr.export("lr-sweep", clean_only=True, format="json"), List[Dict[str, Any]])
    assert_type(exp.export(format="csv", path="summary.csv"), str)
    assert_type(exp.export(format="json"), List[Dict[str, Any]])
    assert_type(hr.retry_failed("lr-sweep"), RetryFailedResponse)
    assert_type(exp.retry_failed().retried, List[str])
    assert_type(hr.metrics("lr-sweep"), pd.DataFrame)
    assert_type(exp.metrics(frame=False), List[Dict[str, Any]])
    series = hr.metric_series("lr-sweep")
    assert_type(series, List[AttemptSeries])
    assert_type(series[0].series["loss"][0], Point)
    assert_type(series[0].rungs[0], RungDecision)
    assert_type(series[0].rungs[0].cutoff, Optional[float])
    assert_type(hr.attempt("a").metrics, Dict[str, float])
    assert_type(hr.attempt("a").tracking, Optional[str])
    assert_type(exp.progress().counts.pruned, int)
    assert_type(exp.study, Optional[str])
    assert_type(exp.variants["train"], Experiment)
    assert_type(exp.variants["train"].wait(), Progress)
    assert exp.submitted is not None
    assert_type(exp.submitted.variants[0], SubmittedVariant)
    assert_type(exp.submitted.variants[0].experiment, Optional[str])
    assert_type(hr.retry("j", cascade=True).retried, List[str])
    assert_type(hr.experiments()[0].study, Optional[StudyRef])
    assert_type(report(step=3, val_acc=0.91), None)
    used = hr.usage()
    assert_type(used, UsageReport)
    assert_type(hr.usage(timedelta(days=7), by="experiment").rows[0], UsageRow)
    assert_type(used.rows[0].name, Optional[str])
    assert_type(used.rows[0].jobs, Dict[str, int])
    assert_type(used.shares[0], ShareStanding)
    assert_type(used.shares[0].normalized, float)
    assert_type(used.until, datetime)
    try:
        hr.wait(raise_on_failure=True)
    except JobsFailedError as e:
        assert_type(e.failures, Dict[str, Optional[str]])
        assert_type(e.job_ids, List[str])


async def acheck(hr: AsyncClient) -> None:
    exp = hr.experiment("lr-sweep")
    assert_type(await exp.wait(raise_on_failure=True), Progress)
    assert_type(await exp.attempts(), pd.DataFrame)
    assert_type(await exp.jobs(frame=False), List[Dict[str, Any]])
    assert_type(await hr.attempt_telemetry_frame("a"), pd.DataFrame)
    assert_type(await hr.gpu_telemetry("node", 0), GpuSeries)
    assert_type(await hr.export(format="json"), List[Dict[str, Any]])
    assert_type(await exp.export(), str)
    assert_type(await hr.retry_failed("lr-sweep"), RetryFailedResponse)
    assert_type(await exp.retry_failed(), RetryFailedResponse)
    assert_type(await hr.metrics("lr-sweep"), pd.DataFrame)
    assert_type(await exp.metrics(frame=False), List[Dict[str, Any]])
    assert_type(await exp.metric_series(), List[AttemptSeries])
    assert_type(exp.variants["eval"], AsyncExperiment)
    assert_type((await hr.retry("j", cascade=True)).retried, List[str])
    assert_type(await hr.usage("12h", by="user"), UsageReport)
'''


def mypy(args: List[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed (requirements-test.txt; scripts/test installs it)")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(CACHE), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_installed_package_is_marked_typed() -> None:
    assert (Path(headroom_client.__file__).parent / "py.typed").is_file()


def test_the_package_passes_mypy_strict() -> None:
    # pyproject.toml's [tool.mypy]: strict, on src/headroom_client (this checkout's source).
    done = mypy([], HERE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_notebook_example_and_precise_types_pass_mypy_strict(tmp_path: Path) -> None:
    """Run outside the project (no config; the installed package, found by its py.typed):
    an untyped package would make every call Any, which `assert_type` refuses."""
    (tmp_path / "precise.py").write_text(PRECISE)
    done = mypy(["--strict", str(EXAMPLE), "precise.py"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues found in 2 source files" in done.stdout


def test_the_notebook_example_runs(cluster: str) -> None:
    # Jobs run in the directory the notebook runs in, as the agent's user (`nobody` under a
    # root agent): pytest's own temporary directories are private to root.
    workdir = tempfile.mkdtemp(prefix="headroom-notebook-")
    os.chmod(workdir, 0o755)
    env = {
        **os.environ,
        "HEADROOM_SERVER": cluster,
        "HEADROOM_TOKEN": TOKEN,
        "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("HEADROOM_URL", None)
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    shutil.rmtree(workdir, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 of 2 jobs succeeded" in done.stdout, done.stdout
    assert "longest run:" in done.stdout, done.stdout


def test_the_jobs_frame_columns_are_the_job_model_s_fields() -> None:
    """`jobs()`' fixed columns are `JobSummary`'s fields (its parameters spread as
    `params.NAME`): a field added to the model without a column would trail untyped."""
    from headroom_client._tables import JOB_COLUMNS
    from headroom_client.models import JobSummary

    model = {f.alias or n for n, f in JobSummary.model_fields.items() if n != "params"}
    assert {c.name for c in JOB_COLUMNS} == model
