"""The rows of ``jobs()``, ``attempts()`` and ``metrics()``, with the same columns whatever
the data: the fixed columns in a fixed order, then each of a job's parameters as
``params.NAME`` (and, in ``attempts()``, each metric's final value as ``metric.NAME``), then
the rest; every row holds every column (None where it has no value). Each column carries its
type, so a frame gives it one dtype (``frames.table_frame``); no pandas here.

``attempts()`` reads the coordinator's JSON export (``GET /v1/export?format=json``), whose
``columns`` name and type every column but the parameters and the metrics; ``metrics()``
reads ``GET /v1/experiments/{id}/metrics``, one series per attempt and metric."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from pydantic import TypeAdapter

#: Rows as plain dicts (``frame=False``); timestamps are ``datetime`` (UTC).
Records = List[Dict[str, Any]]

#: A parameter's column: ``params.NAME``, whatever the name (``params.node`` beside the
#: attempt's own ``node``).
PARAM_PREFIX = "params."
#: The type of a parameter's column: what its values are (see ``frames``).
PARAM = "param"
#: A metric's final value: ``metric.NAME``, whatever the name (``metric.lr`` beside the
#: parameter ``params.lr``, ``metric.energy_j`` beside the measured ``energy_j``).
METRIC_PREFIX = "metric."
#: The type of a metric's column: a number (float64, NaN where never reported; never 0).
METRIC = "metric"


@dataclass(frozen=True)
class Column:
    """A column: its name and its type, one of the JSON export's (``string``, ``integer``,
    ``number``, ``boolean``, ``time``, ``list``), ``object`` (a nested value, kept whole),
    ``param`` or ``""`` (typed by its values). ``nullable``: it may hold None."""

    name: str
    type: str = ""
    nullable: bool = True


@dataclass
class Table:
    """Rows and their columns, in order (the parameters' among them)."""

    columns: List[Column]
    rows: Records


#: ``jobs()``: a ``JobSummary``'s fields, the parameters spread after ``run``.
JOB_COLUMNS: Tuple[Column, ...] = (
    Column("id", "string", False),
    Column("experiment", "string", False),
    Column("experiment_name", "string", False),
    Column("index", "integer", False),
    Column("config", "integer", False),
    Column("run", "integer", False),
    Column("state", "string", False),
    Column("priority", "integer", False),
    Column("attempts", "integer", False),
    Column("max_attempts", "integer", False),
    Column("gpus", "integer", False),
    Column("estimate_mib", "integer"),
    Column("node", "string"),
    Column("gpu_indices", "list", False),
    Column("last_failure", "string"),
    Column("created_at", "time", False),
    Column("submitted_by", "string", False),
    Column("pending_reason", "object"),
)
#: The columns that name a job; its parameters follow them.
JOB_KEYS = ("id", "experiment", "experiment_name", "index", "config", "run")

#: The columns that name an attempt in the export; its parameters follow them, as the CSV
#: export places them.
ATTEMPT_KEYS = ("experiment", "job_id", "job_index", "config", "run", "attempt", "attempt_id")

_DATETIME: TypeAdapter[datetime] = TypeAdapter(datetime)


def _value(v: Any, type: str) -> Any:
    """A cell as a record holds it: times as ``datetime``, numbers as ``float``."""
    if v is None:
        return None
    if type == "time" and isinstance(v, str):
        try:
            return _DATETIME.validate_python(v)
        except ValueError:
            return v
    if type == "number" and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


#: A row's parts: its values by column, its parameters, its metrics' final values.
_Item = Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]


def _table(fixed: Sequence[Column], keys: Sequence[str], items: Iterable[_Item]) -> Table:
    """Rows of ``(values, params, metrics)``: the ``fixed`` columns, each parameter as
    ``params.NAME`` then each metric as ``metric.NAME`` (each sorted by name) after the last
    of ``keys``, then values no column names (a newer server's) in the order first seen."""
    items = list(items)
    names = sorted({k for _, params, _ in items for k in params})
    metric_names = sorted({k for _, _, metrics in items for k in metrics})
    cut = max((i + 1 for i, c in enumerate(fixed) if c.name in keys), default=0)
    params = [Column(PARAM_PREFIX + n, PARAM) for n in names]
    metrics = [Column(METRIC_PREFIX + n, METRIC) for n in metric_names]
    columns = list(fixed[:cut]) + params + metrics + list(fixed[cut:])
    taken = {c.name for c in columns}
    for values, _, _ in items:
        for k in values:
            if k not in taken:
                taken.add(k)
                columns.append(Column(k))
    rows: Records = []
    for values, given, reported in items:
        row: Dict[str, Any] = {}
        for c in columns:
            if c.type == PARAM:
                row[c.name] = given.get(c.name[len(PARAM_PREFIX) :])
            elif c.type == METRIC:
                row[c.name] = _value(reported.get(c.name[len(METRIC_PREFIX) :]), "number")
            else:
                row[c.name] = _value(values.get(c.name), c.type)
        rows.append(row)
    return Table(columns, rows)


def _split_params(row: Dict[str, Any]) -> _Item:
    params = row.get("params")
    values = {k: v for k, v in row.items() if k != "params"}
    return values, dict(params) if isinstance(params, dict) else {}, {}


def _split_export_row(row: Dict[str, Any]) -> _Item:
    """An export row's values, its parameters (``params``) and its metrics: ``metrics``
    (``{name: final}``) and any ``metric.NAME`` value beside it (the nested one wins)."""
    values, params, _ = _split_params(row)
    nested = values.pop("metrics", None)
    metrics: Dict[str, Any] = {}
    for k in [k for k in values if k.startswith(METRIC_PREFIX)]:
        v = values.pop(k)
        if v is not None:
            metrics[k[len(METRIC_PREFIX) :]] = v
    if isinstance(nested, dict):
        metrics.update({str(k): v for k, v in nested.items() if v is not None})
    return values, params, metrics


def jobs_table(jobs: Iterable[Dict[str, Any]]) -> Table:
    """``jobs()``'s rows from ``JobSummary.model_dump()``s."""
    return _table(JOB_COLUMNS, JOB_KEYS, (_split_params(j) for j in jobs))


def attempts_table(columns: Sequence[Dict[str, Any]], rows: Iterable[Dict[str, Any]]) -> Table:
    """``attempts()``'s rows from the JSON export: its ``columns`` (name, type, ...) and its
    rows, each with its parameters in ``params`` and its metrics' final values in
    ``metrics`` (``metric.NAME`` columns, after the parameters' as in the CSV)."""
    fixed = [
        Column(str(c["name"]), str(c.get("type") or ""))
        for c in columns
        if isinstance(c, dict)
        and "name" in c
        and c["name"] not in ("params", "metrics")
        and not str(c["name"]).startswith(METRIC_PREFIX)
    ]
    return _table(fixed, ATTEMPT_KEYS, (_split_export_row(r) for r in rows))


#: ``metrics()``: one row per point of an attempt's metric, the parameters after ``number``.
METRIC_COLUMNS: Tuple[Column, ...] = (
    Column("attempt", "string", False),
    Column("job", "string", False),
    Column("index", "integer", False),
    Column("number", "integer", False),
    Column("metric", "string", False),
    Column("step", "integer", False),
    Column("t", "number", False),
    Column("value", "number", False),
)
#: The columns that name the attempt; its parameters follow them.
METRIC_KEYS = ("attempt", "job", "index", "number")


def metrics_table(series: Iterable[Dict[str, Any]]) -> Table:
    """``metrics()``'s rows from ``AttemptSeries.model_dump()``s: for each attempt, each of
    its metrics (by name) and each point of it, oldest first."""
    items: List[_Item] = []
    for s in series:
        head = {k: s.get(k) for k in METRIC_KEYS}
        params = s.get("params")
        given = dict(params) if isinstance(params, dict) else {}
        for name, points in sorted((s.get("series") or {}).items()):
            for p in points:
                values = {**head, "metric": name, **{k: p.get(k) for k in ("step", "t", "value")}}
                items.append((values, given, {}))
    return _table(METRIC_COLUMNS, METRIC_KEYS, items)


#: One page of the JSON export: its columns, its rows, and ``next_after``.
ExportPage = Tuple[List[Dict[str, Any]], List[Dict[str, Any]], Optional[int]]


def export_rows(doc: Any) -> Optional[ExportPage]:
    """One page of the JSON export: its columns, its rows and ``next_after``; None when
    ``doc`` is not one."""
    if not isinstance(doc, dict):
        return None
    columns, rows, after = doc.get("columns"), doc.get("rows"), doc.get("next_after")
    if not isinstance(columns, list) or not isinstance(rows, list):
        return None
    if after is not None and (not isinstance(after, int) or isinstance(after, bool)):
        return None
    return columns, rows, after
