"""Python client for the headroom coordinator: ``Client(url, token)`` and ``AsyncClient``."""

from .client import AsyncClient, AsyncExperiment, Client, Experiment, load_spec
from .errors import (
    BadRequestError,
    ConflictError,
    ConnectionFailed,
    ForbiddenError,
    HeadroomError,
    InvalidError,
    NotFoundError,
    ServerError,
    UnauthorizedError,
)

__all__ = [
    "AsyncClient",
    "AsyncExperiment",
    "BadRequestError",
    "Client",
    "ConflictError",
    "ConnectionFailed",
    "Experiment",
    "ForbiddenError",
    "HeadroomError",
    "InvalidError",
    "NotFoundError",
    "ServerError",
    "UnauthorizedError",
    "load_spec",
]
