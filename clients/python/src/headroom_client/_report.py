"""``report()``: what a running job says of itself, one ``HEADROOM_METRIC {json}`` line on its
standard output, which the job's supervisor reads (as it reads the spec's ``metrics``
patterns). Nothing else happens: no network, no token, no import beyond the standard library,
so a training script may call it every step, with or without a coordinator."""

from __future__ import annotations

import json
import math
import operator
import re
import sys
from typing import Dict, Optional, SupportsFloat, SupportsIndex

#: The start of a reporting line (the coordinator's ``results::METRIC_LINE``).
METRIC_LINE = "HEADROOM_METRIC"
#: The longest metric name, in bytes.
MAX_NAME = 64
#: The largest step (the coordinator's steps are unsigned 64-bit integers).
MAX_STEP = 2**64 - 1

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")


def metric_name_problem(name: str) -> Optional[str]:
    """Why ``name`` is no metric name (None: it is one). Metric names are letters, digits,
    ``_ . / -``, starting with a letter or ``_``, at most 64 bytes."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        return (
            f"metric name {name!r}: letters, digits, `_`, `.`, `/` and `-`, starting with a "
            "letter or `_`"
        )
    if len(name.encode()) > MAX_NAME:
        return f"metric name {name!r}: at most {MAX_NAME} bytes"
    return None


def _value(name: str, value: object) -> Optional[float]:
    # A bool is an int to Python, but no measurement; text is refused before float() parses it.
    if isinstance(value, (bool, str, bytes, bytearray)):
        raise ValueError(f"metric {name!r}: {value!r} is not a number")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"metric {name!r}: {value!r} is not a number") from None
    # A diverged loss (NaN, infinity) must not crash the training that reports it: it is
    # written as `null`, which headroom counts among the ignored values.
    return number if math.isfinite(number) else None


def _step(step: SupportsIndex) -> int:
    if isinstance(step, bool):
        raise ValueError(f"step {step!r} is not an integer")
    try:
        n = operator.index(step)
    except TypeError:
        raise ValueError(f"step {step!r} is not an integer") from None
    if not 0 <= n <= MAX_STEP:
        raise ValueError(f"step {n} is not a non-negative 64-bit integer")
    return n


def metric_line(step: Optional[SupportsIndex] = None, **metrics: SupportsFloat) -> str:
    """The line ``report`` writes, without its newline: ``HEADROOM_METRIC {"step": 3,
    "val_acc": 0.91}`` (``step`` first and only when given)."""
    if not metrics:
        raise ValueError("report() needs at least one metric: report(step, NAME=VALUE, ...)")
    doc: Dict[str, object] = {}
    if step is not None:
        doc["step"] = _step(step)
    for name, value in metrics.items():
        problem = metric_name_problem(name)
        if problem is not None:
            raise ValueError(problem)
        doc[name] = _value(name, value)
    return f"{METRIC_LINE} {json.dumps(doc, separators=(', ', ': '), allow_nan=False)}"


def report(step: Optional[SupportsIndex] = None, **metrics: SupportsFloat) -> None:
    """Reports metrics of the running job: ``report(step=120, val_acc=0.91, loss=0.3)``
    writes ``HEADROOM_METRIC {"step": 120, "val_acc": 0.91, "loss": 0.3}`` on standard output
    and flushes it; headroom reads it from the job's log as a value of each metric at that
    step (without ``step``, a metric's step is the count of its values so far).

    ``step``: a non-negative integer (a NumPy integer will do). Each metric: a number, or
    anything ``float()`` takes (a NumPy scalar, a one-element tensor); NaN and infinity are
    written as ``null``, which headroom ignores and counts (``metrics_ignored``), so a run
    whose loss diverged goes on. Names are letters, digits, ``_ . / -``, starting with a
    letter or ``_``, at most 64 bytes. A wrong name, or a value that is no number at all,
    raises ``ValueError`` naming the metric, and nothing is written.

    No network, no token: outside headroom it is just a line of output."""
    line = metric_line(step, **metrics) + "\n"
    out = sys.stdout if sys.stdout is not None else sys.__stdout__
    if out is None:  # no standard output at all (pythonw): nowhere to report to
        return
    # The whole line in one write.
    out.write(line)
    out.flush()
