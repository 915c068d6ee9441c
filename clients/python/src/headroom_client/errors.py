"""Typed exceptions for the API's one error shape:
``{"error": {"code", "message", "field"?, "attempt"?}}``."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Dict, List, Optional

import httpx

if TYPE_CHECKING:
    from .models import Progress


class HeadroomError(Exception):
    """An error answer of the coordinator. ``code`` is for programs (``invalid``,
    ``not_found``, ...), ``field`` names the request field at fault when there is one,
    ``attempt`` the attempt the error is about (``stale_fence``)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: Optional[str] = None,
        attempt: Optional[str] = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.attempt = attempt
        where = f" ({field})" if field else ""
        super().__init__(f"{status} {code}{where}: {message}")


class BadRequestError(HeadroomError):
    """Malformed request: not JSON, a bad id or query string (400)."""


class UnauthorizedError(HeadroomError):
    """No token, or a wrong, revoked or expired one (401)."""


class ForbiddenError(HeadroomError):
    """The token's role may not do this (403)."""


class NotFoundError(HeadroomError):
    """No such experiment, job, attempt or node (404)."""


class ConflictError(HeadroomError):
    """Refused by state: a job in the wrong state, a stale fence, an unknown agent (409)."""


class InvalidError(HeadroomError):
    """A field of the request is wrong; ``field`` names it (422)."""


class SourceError(InvalidError):
    """A field of a submission found wrong by the client, before anything is sent: ``field``
    names it (``workdir``: no such directory; ``environment``: not ``inherit``, ``none``,
    ``{venv: PATH}`` or ``{conda: NAME}``; ``snapshot``: the code bundle is over its cap or
    holds a file it cannot). ``status`` is 0: no answer came."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(0, "invalid", message, field)


class ServerError(HeadroomError):
    """The coordinator failed (5xx); ``store_unavailable`` is worth retrying."""


class ConnectionFailed(HeadroomError):
    """The coordinator could not be reached at all."""


class TokenFileError(HeadroomError):
    """The token file (``Client(token_file=...)`` or ``$HEADROOM_TOKEN_FILE``) cannot be read
    or holds no token; ``path`` names it."""

    def __init__(self, path: str, source: str, reason: str) -> None:
        self.path = path
        super().__init__(0, "token_file", f"{source} {path}: {reason}")


class JobsFailedError(HeadroomError):
    """``wait(..., raise_on_failure=True)``: every job ended, and some failed. ``failures``
    maps each failed job's id to its failure class (``nonzero``, ``oom``, ``timeout``,
    ``lost``, ``workdir`` or ``environment`` (the node lacks the job's directory or Python
    environment: never retried)...; None when the server recorded none); ``progress`` holds
    the final counts. Cancelled jobs are not failures. ``study``: the study's id when a
    submitted study was waited for (its experiments' jobs, ``experiment`` None)."""

    def __init__(
        self,
        experiment: Optional[str],
        failures: Dict[str, Optional[str]],
        progress: "Progress",
        *,
        study: Optional[str] = None,
    ) -> None:
        self.experiment = experiment
        self.study = study
        self.failures = failures
        self.progress = progress
        classes = Counter(c or "unknown" for c in failures.values())
        why = ", ".join(f"{c}: {n}" for c, n in sorted(classes.items()))
        if study:
            of = f"study {study}"
        else:
            of = f"experiment {experiment}" if experiment else "all experiments"
        super().__init__(
            0,
            "jobs_failed",
            f"{progress.counts.failed} of {progress.counts.total} jobs of {of} failed ({why})",
        )

    @property
    def job_ids(self) -> List[str]:
        """The failed jobs' ids."""
        return list(self.failures)


_BY_CODE = {
    "bad_request": BadRequestError,
    "unauthenticated": UnauthorizedError,
    "forbidden": ForbiddenError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "stale_fence": ConflictError,
    "unknown_agent": ConflictError,
    "invalid": InvalidError,
    "internal": ServerError,
    "store_unavailable": ServerError,
    "busy": ServerError,
    "throttled": UnauthorizedError,
}

_BY_STATUS = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    422: InvalidError,
}


def error_from_response(resp: httpx.Response) -> HeadroomError:
    """The typed exception for an error answer (any status >= 400)."""
    code, message, field, attempt = "", resp.text.strip(), None, None
    try:
        body = resp.json()
        detail = body.get("error", {}) if isinstance(body, dict) else {}
        if isinstance(detail, dict):
            code = str(detail.get("code") or "")
            message = str(detail.get("message") or message)
            field = detail.get("field")
            attempt = detail.get("attempt")
    except ValueError:
        pass
    cls = _BY_CODE.get(code) or _BY_STATUS.get(resp.status_code)
    if cls is None:
        cls = ServerError if resp.status_code >= 500 else HeadroomError
    return cls(resp.status_code, code or f"http_{resp.status_code}", message, field, attempt)
