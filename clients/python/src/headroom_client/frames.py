"""Records as pandas DataFrames. pandas is optional: it is imported when a frame is asked
for, and timestamps become ``datetime64[..., UTC]`` columns."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Protocol, Sequence, Union

if TYPE_CHECKING:
    import pandas as pd


class _Sample(Protocol):
    def model_dump(self) -> Dict[str, Any]: ...


class _Series(Protocol):
    """A GPU's series (``models.GpuSeries``), as far as a frame needs it."""

    @property
    def node(self) -> str: ...

    @property
    def samples(self) -> Sequence[_Sample]: ...

#: Rows as plain dicts (``frame=False``); timestamps are ``datetime`` (UTC).
Records = List[Dict[str, Any]]

#: Telemetry readings: float64 columns (NaN where the GPU gave none), whether any row has one.
TELEMETRY_READINGS = (
    "used_mib",
    "free_mib",
    "total_mib",
    "utilization_pct",
    "power_w",
    "energy_j",
    "temperature_c",
    "sm_clock_mhz",
)

#: The time columns of ``jobs()`` and ``attempts()``.
JOB_TIMES = ("created_at",)
ATTEMPT_TIMES = ("started_at", "ended_at")


def _no_pandas() -> ImportError:
    return ImportError("pandas is not installed: pip install 'headroom-client[pandas]'")


def have_pandas() -> bool:
    return importlib.util.find_spec("pandas") is not None


def _times(df: "pd.DataFrame", columns: Iterable[str]) -> "pd.DataFrame":
    import pandas as pd

    for col in columns:
        if col in df.columns:
            # Microseconds whatever the rows (pandas infers seconds for none).
            df[col] = pd.to_datetime(df[col], utc=True).dt.as_unit("us")
    return df


def frame(rows: Records, times: Sequence[str] = ()) -> "pd.DataFrame":
    """Rows as a DataFrame, nested dicts spread into ``NAME.KEY`` columns (``params.lr``)."""
    try:
        import pandas as pd
    except ImportError:
        raise _no_pandas() from None
    if not rows:
        return pd.DataFrame()
    return _times(pd.json_normalize(rows), times)


def records_or_frame(
    rows: Records, want: Optional[bool], times: Sequence[str] = ()
) -> Union["pd.DataFrame", Records]:
    """A DataFrame when ``want`` or, by default (None), when pandas is installed; else the
    rows."""
    if want is False or (want is None and not have_pandas()):
        return rows
    return frame(rows, times)


def telemetry_frame(
    series: Iterable[_Series], fields: Sequence[str], attempt: Optional[str] = None
) -> "pd.DataFrame":
    """One row per sample: ``attempt`` (for an attempt's series), ``node``, ``gpu``, ``at``,
    then the readings, a column per name of a sample's ``fields`` (None where the GPU gave
    none)."""
    try:
        import pandas as pd
    except ImportError:
        raise _no_pandas() from None

    head = (["attempt"] if attempt is not None else []) + ["node", "gpu", "at"]
    columns = head + [f for f in fields if f not in head]
    rows: Records = []
    for s in series:
        for sample in s.samples:
            row: Dict[str, Any] = {"node": s.node, **sample.model_dump()}
            if attempt is not None:
                row["attempt"] = attempt
            rows.append(row)
    extra = sorted({k for r in rows for k in r} - set(columns))
    df = pd.DataFrame.from_records(rows, columns=columns + extra)
    # The same dtypes whatever the rows (none included): a frame to concatenate and plot.
    df["gpu"] = df["gpu"].astype("int64")
    for col in TELEMETRY_READINGS:
        df[col] = df[col].astype("float64")
    return _times(df, ["at"])
