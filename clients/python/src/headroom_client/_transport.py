"""How requests reach the coordinator: its address, the token (found as the CLI finds it),
the certificates an ``https://`` coordinator is trusted by, and error answers and transport
failures as ``HeadroomError``s. Shared by both faces of the client."""

from __future__ import annotations

import os
import ssl
from typing import Any, Dict, Optional, Union

import httpx

from .errors import (
    ConnectionFailed,
    HeadroomError,
    TokenFileError,
    UnauthorizedError,
    error_from_response,
)

DEFAULT_URL = "http://127.0.0.1:7420"
#: How long one long-poll asks the server to hold (the server caps it).
POLL_MS = 20_000

PathLike = Union[str, "os.PathLike[str]"]


def local_token_path(url: str) -> Optional[str]:
    """Where a local ``headroom up`` of this account leaves its admin token for ``url``
    (``~/.headroom/local/<host>_<port>``, 0600), as the CLI finds it."""
    authority = url.split("://", 1)[-1].split("/", 1)[0]
    host, sep, port = authority.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        return None
    host = "127.0.0.1" if host.lower() == "localhost" else host.strip("[]")
    if not host or not all(c.isalnum() or c in ".:-" for c in host):
        return None
    home = os.environ.get("HOME")
    if not home:
        return None
    return os.path.join(home, ".headroom", "local", f"{host.replace(':', '.')}_{int(port)}")


def _local_token(url: str) -> Optional[str]:
    path = local_token_path(url)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return token or None


def read_token_file(path: PathLike, source: str = "token_file") -> str:
    """The token in a file: its first line, trimmed. A file that cannot be read, or whose
    first line is blank, raises ``TokenFileError`` naming it."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise TokenFileError(name, source, f"cannot be read ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise TokenFileError(name, source, "is not UTF-8 text") from e
    lines = text.splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise TokenFileError(name, source, "is empty")
    return token


def _token(token: Optional[str], token_file: Optional[PathLike], url: str) -> Optional[str]:
    """As the CLI: the token given, else the token file given, else ``$HEADROOM_TOKEN``, else
    ``$HEADROOM_TOKEN_FILE``, else what a local ``headroom up`` left for ``url``."""
    if token is not None and token_file is not None:
        raise ValueError("pass token or token_file, not both")
    if token is not None:
        return token
    if token_file is not None:
        return read_token_file(token_file, "token_file")
    if os.environ.get("HEADROOM_TOKEN"):
        return os.environ["HEADROOM_TOKEN"]
    if os.environ.get("HEADROOM_TOKEN_FILE"):
        return read_token_file(os.environ["HEADROOM_TOKEN_FILE"], "HEADROOM_TOKEN_FILE")
    return _local_token(url)


def _headers(
    token: Optional[str], url: str = "", token_file: Optional[PathLike] = None
) -> Dict[str, str]:
    h = {"accept": "application/json", "user-agent": "headroom-client/0.1"}
    found = _token(token, token_file, url)
    if found:
        h["authorization"] = f"Bearer {found}"
    return h


def _check(resp: httpx.Response) -> httpx.Response:
    if resp.status_code >= 400:
        raise _naming_a_left_token(error_from_response(resp), resp.request)
    return resp


def _naming_a_left_token(err: HeadroomError, request: httpx.Request) -> HeadroomError:
    """A 401 for the token a local ``headroom up`` left for this address (an ``up`` there
    stopped without removing it) says which file it came from, as the CLI does."""
    if not isinstance(err, UnauthorizedError) or request.url.port is None:
        return err
    url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
    path, left = local_token_path(url), _local_token(url)
    if path is None or left is None or request.headers.get("authorization") != f"Bearer {left}":
        return err
    return UnauthorizedError(
        err.status,
        err.code,
        f"{err.message} (the token left by a `headroom up` in {path}: an `up` there that "
        "stopped without removing it, most likely: remove the file, or pass token= or set "
        "HEADROOM_TOKEN)",
        err.field,
        err.attempt,
    )


def _unreachable(url: str, e: Exception) -> ConnectionFailed:
    if "CERTIFICATE_VERIFY_FAILED" in str(e):
        return ConnectionFailed(
            0,
            "unreachable",
            f"cannot reach the coordinator at {url} ({e}): its certificate is not one this "
            "machine trusts; pass Client(..., ca_file=...) or set HEADROOM_CA_FILE",
        )
    return ConnectionFailed(
        0,
        "unreachable",
        f"cannot reach the coordinator at {url} ({e}); pass Client(url=...) or set "
        "HEADROOM_SERVER",
    )


def _http_options(
    url: Optional[str],
    token: Optional[str],
    token_file: Optional[PathLike],
    timeout: float,
    ca_file: Optional[PathLike] = None,
) -> Dict[str, Any]:
    """What both clients give httpx: the base URL, the headers, a read timeout past one
    long-poll, and the certificates an ``https://`` coordinator is trusted by."""
    # The CLI's variable first; HEADROOM_URL is what earlier clients read.
    base = (
        url or os.environ.get("HEADROOM_SERVER") or os.environ.get("HEADROOM_URL") or DEFAULT_URL
    ).rstrip("/")
    return {
        "base_url": base,
        "headers": _headers(token, base, token_file),
        "timeout": httpx.Timeout(timeout, read=timeout + POLL_MS / 1000),
        "verify": _trust(ca_file),
    }


def _trust(ca_file: Optional[PathLike]) -> Any:
    """The system's roots, and the certificates of ``ca_file`` (else ``$HEADROOM_CA_FILE``),
    as the CLI trusts them: a lab's own CA, a proxy's self-signed certificate."""
    path = ca_file if ca_file is not None else os.environ.get("HEADROOM_CA_FILE")
    if not path:
        return True
    context = ssl.create_default_context()
    try:
        context.load_verify_locations(cafile=os.fspath(path))
    except (OSError, ssl.SSLError) as e:
        source = "ca_file" if ca_file is not None else "HEADROOM_CA_FILE"
        raise ValueError(f"{source} {path}: not a PEM file of certificates: {e}") from e
    return context
