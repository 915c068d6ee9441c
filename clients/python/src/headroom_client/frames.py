"""Records as pandas DataFrames. pandas is optional: it is imported when a frame is asked
for. A table's columns get one dtype each whatever the rows (none included): integers
``Int64`` (``int64`` where never missing), booleans ``boolean`` (``bool``), numbers
``float64``, text pandas' text dtype, times ``datetime64[us, UTC]``, lists and nested values
as Python objects; a parameter's column, whose type no one declares, by its values."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Protocol, Sequence, Union

from ._tables import METRIC, Column, Records as Records, Table

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


def _no_pandas() -> ImportError:
    return ImportError("pandas is not installed: pip install 'headroom-client[pandas]'")


def have_pandas() -> bool:
    return importlib.util.find_spec("pandas") is not None


def _times(df: "pd.DataFrame", columns: Iterable[str]) -> "pd.DataFrame":
    for col in columns:
        if col in df.columns:
            df[col] = _as_time(df[col])
    return df


def _by_values(values: List[Any]) -> "pd.Series":
    """A column no one typed (a parameter's): integers and booleans as themselves
    (nullable where one is missing), anything else as pandas infers it."""
    import pandas as pd

    given = [v for v in values if v is not None]
    missing = len(given) < len(values)
    if given and all(isinstance(v, bool) for v in given):
        return pd.Series(values, dtype="boolean" if missing else "bool")
    if given and all(isinstance(v, int) and not isinstance(v, bool) for v in given):
        try:
            return pd.Series(values, dtype="Int64" if missing else "int64")
        except (OverflowError, TypeError, ValueError):
            return pd.Series(values, dtype=object)
    return pd.Series(values, dtype=None if given else object)


def _column(values: List[Any], column: Column) -> "pd.Series":
    """One column's values with the dtype of its type."""
    import pandas as pd

    nullable = column.nullable or any(v is None for v in values)
    kind = column.type
    try:
        if kind == "integer":
            return pd.Series(values, dtype="Int64" if nullable else "int64")
        if kind == "boolean":
            return pd.Series(values, dtype="boolean" if nullable else "bool")
        if kind in ("number", METRIC):
            return pd.Series(values, dtype="float64")
        if kind == "time":
            return _as_time(pd.Series(values, dtype=object))
        if kind == "string":
            text = pd.Series(values, dtype=object)
            # pandas' text dtype: `str` from pandas 3, object before (as it infers text).
            return text.astype("str") if int(pd.__version__.split(".")[0]) >= 3 else text
    except (OverflowError, TypeError, ValueError):
        return pd.Series(values, dtype=object)
    if kind in ("list", "object"):
        return pd.Series(values, dtype=object)
    return _by_values(values)


def _as_time(values: "pd.Series") -> "pd.Series":
    import pandas as pd

    # Microseconds whatever the rows (pandas infers seconds for none).
    return pd.to_datetime(values, utc=True).dt.as_unit("us")


def table_frame(table: Table) -> "pd.DataFrame":
    """A table as a DataFrame: its columns in order, each with its type's dtype."""
    try:
        import pandas as pd
    except ImportError:
        raise _no_pandas() from None
    data = {c.name: _column([r.get(c.name) for r in table.rows], c) for c in table.columns}
    return pd.DataFrame(data, index=pd.RangeIndex(len(table.rows)))


def records_or_frame(table: Table, want: Optional[bool]) -> Union["pd.DataFrame", Records]:
    """A DataFrame when ``want`` or, by default (None), when pandas is installed; else the
    rows."""
    if want is False or (want is None and not have_pandas()):
        return table.rows
    return table_frame(table)


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
