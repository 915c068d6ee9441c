"""A notebook's cells as a script: submit a sweep, wait for it, read its jobs and attempts as
DataFrames and its GPU telemetry as frames. Type-checked with ``mypy --strict`` by the tests.

Run it beside a local ``headroom up`` (``python examples/notebook.py``) or set
``HEADROOM_SERVER`` and ``HEADROOM_TOKEN`` / ``HEADROOM_TOKEN_FILE`` as for the CLI."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict

import pandas as pd

from headroom_client import Client, JobsFailedError

# `headroom-fake-job` stands in for a training script (it holds fake GPU memory).
SPEC: Dict[str, Any] = {
    "name": "notebook-sweep",
    "command": ["headroom-fake-job", "--mem", "1GiB", "--seconds", "1", "--print", "lr={lr}"],
    "grid": {"lr": [0.001, 0.01]},
    "resources": {"gpus": 1, "memory": "2GiB"},
}


def main() -> None:
    hr = Client()  # $HEADROOM_SERVER and the token as the CLI finds them
    exp = hr.submit(SPEC)
    try:
        done = exp.wait(progress=True, timeout=300, raise_on_failure=True)
    except JobsFailedError as e:
        for job, failure in e.failures.items():
            print(f"job {job} failed: {failure}")
        raise
    print(f"{done.counts.succeeded} of {done.counts.total} jobs succeeded")

    # Jobs and attempts as DataFrames; the experiment may be named by its name.
    jobs: pd.DataFrame = hr.jobs(SPEC["name"])
    print(jobs[["id", "state", "params.lr", "created_at"]])
    attempts: pd.DataFrame = exp.attempts()
    # A parameter's column is `params.NAME` in both frames.
    per_lr = attempts.groupby("params.lr")[["duration_s", "peak_mem_mib", "energy_j"]].mean()
    print(per_lr)
    print("longest run:", (attempts["ended_at"] - attempts["started_at"]).max())

    # Telemetry: one row per sample, `at` a datetime64 column.
    first = str(attempts["attempt_id"].iloc[0])
    samples: pd.DataFrame = hr.attempt_telemetry_frame(first)
    print(samples.groupby("gpu")[["power_w", "temperature_c", "used_mib"]].max())
    node = str(attempts["node"].iloc[0])
    recent = hr.gpu_telemetry_frame(node, 0, since=timedelta(minutes=5))
    print(recent.set_index("at")["power_w"].resample("10s").mean().tail())


if __name__ == "__main__":
    main()
