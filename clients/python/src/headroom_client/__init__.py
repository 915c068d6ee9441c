"""Python client for the headroom coordinator: ``Client(url, token)`` and ``AsyncClient``;
``report(step, **metrics)`` for a running job to report its metrics.

``report`` needs nothing beyond the standard library: ``from headroom_client import report``
in a training script imports neither httpx nor pydantic. The rest is imported when first
named (``headroom_client.Client``, ``from headroom_client import Client``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, List

from ._report import report

if TYPE_CHECKING:
    from .client import (
        AsyncClient,
        AsyncExperiment,
        Client,
        Duration,
        Experiment,
        Instant,
        UsageBy,
        load_spec,
        local_token_path,
        read_token_file,
    )
    from .errors import (
        BadRequestError,
        ConflictError,
        ConnectionFailed,
        ForbiddenError,
        HeadroomError,
        InvalidError,
        JobsFailedError,
        NotFoundError,
        ServerError,
        SourceError,
        TokenFileError,
        UnauthorizedError,
    )
    from .frames import Records
    from .models import (
        AlertsView,
        AttemptSeries,
        AttemptTelemetry,
        Environment,
        GitState,
        GpuSeries,
        Point,
        RungDecision,
        SchedulePreview,
        ShareStanding,
        Snapshot,
        Source,
        StudyRef,
        SubmittedVariant,
        TelemetrySample,
        UsageReport,
        UsageRow,
    )

#: Where each name but ``report`` is defined; imported at its first use.
_LAZY = {
    **dict.fromkeys(
        [
            "AsyncClient",
            "AsyncExperiment",
            "Client",
            "Duration",
            "Experiment",
            "Instant",
            "UsageBy",
            "load_spec",
            "local_token_path",
            "read_token_file",
        ],
        ".client",
    ),
    **dict.fromkeys(
        [
            "BadRequestError",
            "ConflictError",
            "ConnectionFailed",
            "ForbiddenError",
            "HeadroomError",
            "InvalidError",
            "JobsFailedError",
            "NotFoundError",
            "ServerError",
            "SourceError",
            "TokenFileError",
            "UnauthorizedError",
        ],
        ".errors",
    ),
    "Records": ".frames",
    **dict.fromkeys(
        [
            "AlertsView",
            "AttemptSeries",
            "AttemptTelemetry",
            "Environment",
            "GitState",
            "GpuSeries",
            "Point",
            "RungDecision",
            "SchedulePreview",
            "ShareStanding",
            "Snapshot",
            "Source",
            "StudyRef",
            "SubmittedVariant",
            "TelemetrySample",
            "UsageReport",
            "UsageRow",
        ],
        ".models",
    ),
}

__all__ = [
    "AlertsView",
    "AsyncClient",
    "AsyncExperiment",
    "AttemptSeries",
    "AttemptTelemetry",
    "BadRequestError",
    "Client",
    "ConflictError",
    "ConnectionFailed",
    "Duration",
    "Environment",
    "Experiment",
    "ForbiddenError",
    "GitState",
    "GpuSeries",
    "HeadroomError",
    "Instant",
    "InvalidError",
    "JobsFailedError",
    "NotFoundError",
    "Point",
    "Records",
    "RungDecision",
    "SchedulePreview",
    "ServerError",
    "ShareStanding",
    "Snapshot",
    "Source",
    "SourceError",
    "StudyRef",
    "SubmittedVariant",
    "TelemetrySample",
    "TokenFileError",
    "UnauthorizedError",
    "UsageBy",
    "UsageReport",
    "UsageRow",
    "load_spec",
    "local_token_path",
    "read_token_file",
    "report",
]

if not TYPE_CHECKING:
    # Hidden from type checkers: for them every name is imported above, and a misspelt one
    # stays an error rather than becoming Any.

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
