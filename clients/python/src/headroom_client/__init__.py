"""Python client for the headroom coordinator: ``Client(url, token)`` and ``AsyncClient``."""

from .client import (
    AsyncClient,
    AsyncExperiment,
    Client,
    Experiment,
    Instant,
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
    TokenFileError,
    UnauthorizedError,
)
from .frames import Records
from .models import AttemptTelemetry, GpuSeries, TelemetrySample

__all__ = [
    "AsyncClient",
    "AsyncExperiment",
    "AttemptTelemetry",
    "BadRequestError",
    "Client",
    "ConflictError",
    "ConnectionFailed",
    "Experiment",
    "ForbiddenError",
    "GpuSeries",
    "HeadroomError",
    "Instant",
    "InvalidError",
    "JobsFailedError",
    "NotFoundError",
    "Records",
    "ServerError",
    "TelemetrySample",
    "TokenFileError",
    "UnauthorizedError",
    "load_spec",
    "local_token_path",
    "read_token_file",
]
