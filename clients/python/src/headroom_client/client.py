"""``Client`` (sync) and ``AsyncClient`` over the coordinator's REST API (``/v1``).

Waiting is long-polling, never sleeping: ``wait`` holds ``/v1/progress?after=VERSION`` open
until the counts change, ``logs(follow=True)`` holds the log route open with ``wait_ms``.

Experiments are named by id or by name (the newest of that name), as the CLI names them: the
API takes ids only, so a name is resolved here through ``GET /v1/experiments``."""

from __future__ import annotations

import codecs
import csv
import io
import os
import re
import ssl
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Dict,
    Iterator,
    List,
    Literal,
    Optional,
    Sequence,
    Union,
    overload,
)
from urllib.parse import quote

import httpx
import yaml
from pydantic import TypeAdapter

from .errors import (
    ConnectionFailed,
    HeadroomError,
    JobsFailedError,
    NotFoundError,
    TokenFileError,
    UnauthorizedError,
    error_from_response,
)
from .frames import ATTEMPT_TIMES, JOB_TIMES, Records, records_or_frame
from .models import (
    AttemptTelemetry,
    AttemptView,
    CancelResponse,
    ExperimentSummary,
    GpuSeries,
    Health,
    JobDetail,
    JobSummary,
    NodeView,
    Progress,
    RetryResponse,
    SubmitResponse,
)

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_URL = "http://127.0.0.1:7420"
#: How long one long-poll asks the server to hold (the server caps it).
POLL_MS = 20_000
LOG_OFFSET_HEADER = "x-log-offset"
ATTEMPT_ENDED_HEADER = "x-attempt-ended"

SpecLike = Union[Dict[str, Any], str, "os.PathLike[str]"]
PathLike = Union[str, "os.PathLike[str]"]
#: A point in time for telemetry windows: a ``datetime`` (naive ones are local time), a
#: ``timedelta`` before now, or an RFC 3339 string.
Instant = Union[datetime, timedelta, str]


class _SpecLoader(yaml.SafeLoader):
    """YAML 1.2 scalars, as the CLI reads specs: ``1e-4`` is a float, ``yes``/``no``/``on``
    stay strings (PyYAML's YAML 1.1 rules would differ from what ``headroom submit`` sends)."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
# Integers stay integers: the int resolver comes first for plain digits.
for _first in "-+0123456789":
    _res = _SpecLoader.yaml_implicit_resolvers.get(_first, [])
    _res.sort(key=lambda r: r[0] != "tag:yaml.org,2002:int")


def load_spec(spec: SpecLike) -> Dict[str, Any]:
    """A spec as the API takes it: a dict as is, a path to a YAML or JSON file read."""
    if isinstance(spec, dict):
        return spec
    path = Path(spec)
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_SpecLoader)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML/JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a spec is a mapping (name, command, ...)")
    _check_expanded_size(doc, path)
    return doc


#: Most values a spec may hold once its YAML aliases are expanded (each alias stands for a
#: copy of what it names): a 562-byte file of nested aliases is billions of values.
MAX_SPEC_VALUES = 1_000_000


def _check_expanded_size(doc: Any, path: Path) -> None:
    """Counts the values of ``doc`` as they would be sent (aliases as copies), stopping at
    the bound: it costs at most ``MAX_SPEC_VALUES`` steps, whatever the aliases."""
    seen = 0
    stack = [doc]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_SPEC_VALUES:
            raise ValueError(
                f"{path}: the spec holds more than {MAX_SPEC_VALUES:,} values once its YAML "
                "aliases are expanded (an alias is a copy of what it names): refused"
            )
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)



def _csv_value(v: str) -> Any:
    if v == "":
        return None
    if v in ("true", "false"):
        return v == "true"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


_DATETIME: TypeAdapter[datetime] = TypeAdapter(datetime)


def _csv_rows(text: str) -> Records:
    """The export's rows, numbers and booleans typed, its time columns as ``datetime``."""
    rows: Records = []
    for row in csv.DictReader(io.StringIO(text)):
        typed = {k: _csv_value(v) for k, v in row.items()}
        for col in ATTEMPT_TIMES:
            if isinstance(typed.get(col), str):
                typed[col] = _DATETIME.validate_python(typed[col])
        rows.append(typed)
    return rows


def _export_params(experiment: Optional[str], clean_only: bool) -> Dict[str, str]:
    params = {"experiment": experiment} if experiment else {}
    if clean_only:
        params["clean_only"] = "true"
    return params


def _given(params: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def _seg(value: Union[str, int]) -> str:
    """A path segment, percent-encoded (a node name may hold any character)."""
    return quote(str(value), safe="")


def _instant(value: Optional[Instant]) -> Optional[str]:
    """RFC 3339 (UTC) for the telemetry routes' ``since``/``until``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, timedelta):
        value = datetime.now(timezone.utc) - value
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _telemetry_params(
    since: Optional[Instant], until: Optional[Instant], limit: Optional[int]
) -> Dict[str, Any]:
    return _given({"since": _instant(since), "until": _instant(until), "limit": limit})


def _is_id(given: str) -> bool:
    """Whether ``given`` is an id (a UUID) rather than a name."""
    try:
        uuid.UUID(given)
    except ValueError:
        return False
    return True


def _newest_named(name: str, experiments: Sequence[ExperimentSummary]) -> str:
    """The id of the newest experiment called ``name`` (the API lists oldest first)."""
    for e in reversed(experiments):
        if e.name == name:
            return e.id
    raise NotFoundError(404, "not_found", f"no experiment named `{name}`", "experiment")


# ---- where the server and the token come from, as the CLI finds them ----


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


def _finished(p: Progress) -> bool:
    return p.counts.total > 0 and p.counts.finished == p.counts.total


def _failures(experiment: Optional[str], p: Progress, failed: List[JobSummary]) -> JobsFailedError:
    return JobsFailedError(experiment, {j.id: j.last_failure for j in failed}, p)


class _Deadline:
    """How long the next long-poll of ``wait`` may hold, within its ``timeout``."""

    def __init__(self, timeout: Optional[float]) -> None:
        self.timeout = timeout
        self.at = None if timeout is None else time.monotonic() + timeout

    def hold_ms(self) -> int:
        if self.at is None:
            return POLL_MS
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"jobs still unfinished after {self.timeout}s")
        return min(POLL_MS, max(1, int(left * 1000)))


class _LogCursor:
    """Where a log read is, and the text of each answer (UTF-8 split across chunks kept)."""

    def __init__(self, follow: bool) -> None:
        self.follow = follow
        self.offset = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def params(self) -> Dict[str, int]:
        return {"offset": self.offset, "wait_ms": POLL_MS if self.follow else 0}

    def take(self, resp: httpx.Response) -> "tuple[List[str], bool]":
        """The text of one answer, and whether the read is over."""
        chunk = resp.content
        self.offset = int(resp.headers.get(LOG_OFFSET_HEADER, self.offset + len(chunk)))
        texts = [self.decoder.decode(chunk)]
        ended = resp.headers.get(ATTEMPT_ENDED_HEADER) == "true"
        # Answers come a megabyte at a time: without ``follow``, read on to what is there.
        done = not chunk and (not self.follow or ended)
        if done:
            texts.append(self.decoder.decode(b"", final=True))
        return [t for t in texts if t], done


class _Progress:
    """A tqdm bar when asked for and installed (``tqdm.auto``: a widget in notebooks)."""

    def __init__(self, enabled: bool, desc: str) -> None:
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=0, desc=desc, unit="job")
            except ImportError:
                self.bar = None

    def update(self, p: Progress) -> None:
        if self.bar is None:
            return
        c = p.counts
        self.bar.total = c.total
        self.bar.n = c.finished
        self.bar.set_postfix(
            running=c.running, queued=c.queued + c.retrying, failed=c.failed, refresh=False
        )
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Client:
    """A synchronous client. ``url`` defaults to ``$HEADROOM_SERVER`` (as the CLI;
    ``$HEADROOM_URL`` is still read) or ``http://127.0.0.1:7420``; the token to ``token``,
    else the first line of ``token_file``, else ``$HEADROOM_TOKEN``, else
    ``$HEADROOM_TOKEN_FILE``, else the one a local ``headroom up`` left for that address.

    Wherever an experiment is asked for, its id or its name (the newest of that name) will
    do."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        token_file: Optional[PathLike] = None,
        ca_file: Optional[PathLike] = None,
        timeout: float = 30.0,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        options = _http_options(url, token, token_file, timeout, ca_file)
        self.url: str = options["base_url"]
        self._http = httpx.Client(**options, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return _check(self._http.request(method, path, **kw))
        except httpx.TransportError as e:
            raise _unreachable(self.url, e) from e

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        return self._request(method, path, **kw).json()

    def _experiment_id(self, given: str) -> str:
        """An experiment's id from its id or its name (the newest of that name)."""
        given = str(given)
        return given if _is_id(given) else _newest_named(given, self.experiments())

    def _experiment_id_or_all(self, given: Optional[str]) -> Optional[str]:
        return None if given is None else self._experiment_id(given)

    # ---- reads and submissions ----

    def health(self) -> Health:
        return Health.model_validate(self._json("GET", "/v1/health"))

    def submit(
        self, spec: SpecLike, *, seed: Optional[int] = None, dry_run: bool = False
    ) -> "Experiment":
        """Submits a spec (a dict, or the path of a YAML/JSON file)."""
        body: Dict[str, Any] = {"spec": load_spec(spec), "dry_run": dry_run}
        if seed is not None:
            body["seed"] = seed
        resp = SubmitResponse.model_validate(self._json("POST", "/v1/experiments", json=body))
        return Experiment(self, resp.experiment, resp)

    def experiment(self, id: str) -> "Experiment":
        """An experiment by id or by name (the newest of that name)."""
        return Experiment(self, self._experiment_id(id))

    def experiments(self) -> List[ExperimentSummary]:
        """Every experiment, oldest first."""
        return [ExperimentSummary.model_validate(e) for e in self._json("GET", "/v1/experiments")]

    def progress(
        self,
        experiment: Optional[str] = None,
        *,
        after: Optional[int] = None,
        timeout_ms: Optional[int] = None,
    ) -> Progress:
        params = _given(
            {
                "experiment": self._experiment_id_or_all(experiment),
                "after": after,
                "timeout_ms": timeout_ms,
            }
        )
        return Progress.model_validate(self._json("GET", "/v1/progress", params=params))

    def job_list(
        self,
        experiment: Optional[str] = None,
        state: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> List[JobSummary]:
        params = _given(
            {"experiment": self._experiment_id_or_all(experiment), "state": state, "limit": limit}
        )
        return [JobSummary.model_validate(j) for j in self._json("GET", "/v1/jobs", params=params)]

    @overload
    def jobs(
        self,
        experiment: Optional[str] = ...,
        state: Optional[str] = ...,
        limit: Optional[int] = ...,
        *,
        frame: Literal[False],
    ) -> Records: ...

    @overload
    def jobs(
        self,
        experiment: Optional[str] = ...,
        state: Optional[str] = ...,
        limit: Optional[int] = ...,
        *,
        frame: Literal[True, None] = ...,
    ) -> pd.DataFrame: ...

    @overload
    def jobs(
        self,
        experiment: Optional[str] = ...,
        state: Optional[str] = ...,
        limit: Optional[int] = ...,
        *,
        frame: Optional[bool],
    ) -> Union[pd.DataFrame, Records]: ...

    def jobs(
        self,
        experiment: Optional[str] = None,
        state: Optional[str] = None,
        limit: Optional[int] = None,
        *,
        frame: Optional[bool] = None,
    ) -> Union[pd.DataFrame, Records]:
        """Jobs as a DataFrame when pandas is installed (or ``frame=True``), else as dicts
        (``frame=False``); ``created_at`` is a datetime."""
        rows = [j.model_dump() for j in self.job_list(experiment, state, limit)]
        return records_or_frame(rows, frame, JOB_TIMES)

    def job(self, id: str) -> JobDetail:
        return JobDetail.model_validate(self._json("GET", f"/v1/jobs/{_seg(id)}"))

    def attempt(self, id: str) -> AttemptView:
        return AttemptView.model_validate(self._json("GET", f"/v1/attempts/{_seg(id)}"))

    @overload
    def attempts(
        self, experiment: Optional[str] = ..., *, clean_only: bool = ..., frame: Literal[False]
    ) -> Records: ...

    @overload
    def attempts(
        self,
        experiment: Optional[str] = ...,
        *,
        clean_only: bool = ...,
        frame: Literal[True, None] = ...,
    ) -> pd.DataFrame: ...

    @overload
    def attempts(
        self, experiment: Optional[str] = ..., *, clean_only: bool = ..., frame: Optional[bool]
    ) -> Union[pd.DataFrame, Records]: ...

    def attempts(
        self,
        experiment: Optional[str] = None,
        *,
        clean_only: bool = False,
        frame: Optional[bool] = None,
    ) -> Union[pd.DataFrame, Records]:
        """One row per attempt (the CSV export's columns: parameters, outcome, peak memory,
        energy...), as a DataFrame when pandas is installed, else as dicts. ``clean_only``
        leaves out contaminated and throttled attempts (as ``headroom export --clean-only``).
        ``started_at`` and ``ended_at`` are datetimes."""
        params = _export_params(self._experiment_id_or_all(experiment), clean_only)
        text = self._request("GET", "/v1/export", params=params).text
        return records_or_frame(_csv_rows(text), frame, ATTEMPT_TIMES)

    # ---- telemetry ----

    def attempt_telemetry(self, attempt: str, *, limit: Optional[int] = None) -> AttemptTelemetry:
        """The telemetry of an attempt's GPUs over its run (empty before it started): one
        series per GPU, the newest ``limit`` samples of each (default 10,000)."""
        return AttemptTelemetry.model_validate(
            self._json(
                "GET", f"/v1/attempts/{_seg(attempt)}/telemetry", params=_given({"limit": limit})
            )
        )

    def attempt_telemetry_frame(self, attempt: str, *, limit: Optional[int] = None) -> pd.DataFrame:
        """``attempt_telemetry`` as a DataFrame: one row per sample (``attempt``, ``node``,
        ``gpu``, ``at`` as datetime64 UTC, the readings)."""
        return self.attempt_telemetry(attempt, limit=limit).to_frame()

    def gpu_telemetry(
        self,
        node: str,
        gpu: int,
        *,
        since: Optional[Instant] = None,
        until: Optional[Instant] = None,
        limit: Optional[int] = None,
    ) -> GpuSeries:
        """One GPU's series from ``since`` (default an hour before ``until``) to ``until``
        (default now), oldest first: the newest ``limit`` samples (default 10,000). Times are
        datetimes, timedeltas before now, or RFC 3339 strings."""
        return GpuSeries.model_validate(
            self._json(
                "GET",
                f"/v1/nodes/{_seg(node)}/gpus/{_seg(gpu)}/telemetry",
                params=_telemetry_params(since, until, limit),
            )
        )

    def gpu_telemetry_frame(
        self,
        node: str,
        gpu: int,
        *,
        since: Optional[Instant] = None,
        until: Optional[Instant] = None,
        limit: Optional[int] = None,
    ) -> pd.DataFrame:
        """``gpu_telemetry`` as a DataFrame: one row per sample (``node``, ``gpu``, ``at`` as
        datetime64 UTC, the readings)."""
        return self.gpu_telemetry(node, gpu, since=since, until=until, limit=limit).to_frame()

    def nodes(self) -> List[NodeView]:
        return [NodeView.model_validate(n) for n in self._json("GET", "/v1/nodes")]

    # ---- changes ----

    def cancel(self, id: str) -> CancelResponse:
        """Cancels an experiment (every unfinished job; by id or name) or a single job."""
        if not _is_id(str(id)):
            return self.cancel_experiment(id)
        try:
            return self.cancel_experiment(id)
        except NotFoundError:
            return self.cancel_job(id)

    def cancel_experiment(self, id: str) -> CancelResponse:
        """Cancels every unfinished job of an experiment (by id or name)."""
        exp = self._experiment_id(id)
        return CancelResponse.model_validate(
            self._json("POST", f"/v1/experiments/{_seg(exp)}/cancel")
        )

    def cancel_job(self, id: str) -> CancelResponse:
        return CancelResponse.model_validate(self._json("POST", f"/v1/jobs/{_seg(id)}/cancel"))

    def retry(self, job_id: str) -> RetryResponse:
        """Runs an ended job once more."""
        return RetryResponse.model_validate(self._json("POST", f"/v1/jobs/{_seg(job_id)}/retry"))

    def set_plan(self, node: str, plan: str) -> NodeView:
        """Sets a node's concurrency plan, slots per GPU: ``"2,2,1"``."""
        return NodeView.model_validate(
            self._json("PUT", f"/v1/nodes/{_seg(node)}/plan", json={"plan": plan})
        )

    # ---- waiting ----

    def wait(
        self,
        experiment: Optional[str] = None,
        *,
        progress: bool = False,
        timeout: Optional[float] = None,
        raise_on_failure: bool = False,
    ) -> Progress:
        """Blocks until every job (of ``experiment``, by id or name) has ended; long-polls,
        never sleeps. With ``raise_on_failure``, raises ``JobsFailedError`` (the failed jobs'
        ids and failure classes) when any job failed."""
        deadline = _Deadline(timeout)
        exp = self._experiment_id_or_all(experiment)
        bar = _Progress(progress, experiment or "all")
        try:
            p = self.progress(exp)
            while True:
                bar.update(p)
                if _finished(p):
                    break
                p = self.progress(exp, after=p.version, timeout_ms=deadline.hold_ms())
        finally:
            bar.close()
        if raise_on_failure and p.counts.failed:
            raise _failures(exp, p, self.job_list(exp, state="failed"))
        return p

    def _attempt_of(self, id: str, follow: bool) -> Optional[str]:
        """The latest attempt of job ``id``, or ``id`` itself when it names an attempt."""
        try:
            d = self.job(id)
        except NotFoundError:
            self.attempt(id)  # raises NotFoundError when it is neither
            return id
        while not d.attempts_detail:
            if not follow or d.state in ("succeeded", "failed", "cancelled"):
                return None
            p = self.progress(d.experiment)
            self.progress(d.experiment, after=p.version, timeout_ms=POLL_MS)
            d = self.job(id)
        return d.attempts_detail[-1].id

    def logs(self, id: str, *, follow: bool = False) -> Iterator[str]:
        """A job's (latest attempt's) or an attempt's log as text chunks; with ``follow``,
        until the attempt has ended."""
        attempt = self._attempt_of(str(id), follow)
        if attempt is None:
            return
        cursor = _LogCursor(follow)
        done = False
        while not done:
            resp = self._request("GET", f"/v1/attempts/{_seg(attempt)}/log", params=cursor.params())
            texts, done = cursor.take(resp)
            yield from texts


class Experiment:
    """A submitted experiment: ``wait``, ``jobs``, ``attempts``, ``cancel``."""

    def __init__(
        self, client: Client, id: Optional[str], submitted: Optional[SubmitResponse] = None
    ) -> None:
        self.client = client
        self.id = id
        #: What the submission answered (jobs, seed, warnings; the preview of a dry run).
        self.submitted = submitted

    def __repr__(self) -> str:
        return f"Experiment({self.id!r})"

    def _need_id(self) -> str:
        if self.id is None:
            raise ValueError("a dry run stores nothing: there is no experiment")
        return self.id

    def summary(self) -> ExperimentSummary:
        return ExperimentSummary.model_validate(
            self.client._json("GET", f"/v1/experiments/{_seg(self._need_id())}")
        )

    def progress(self) -> Progress:
        return self.client.progress(self._need_id())

    def wait(
        self,
        progress: bool = False,
        timeout: Optional[float] = None,
        *,
        raise_on_failure: bool = False,
    ) -> Progress:
        return self.client.wait(
            self._need_id(), progress=progress, timeout=timeout, raise_on_failure=raise_on_failure
        )

    @overload
    def jobs(self, state: Optional[str] = ..., *, frame: Literal[False]) -> Records: ...

    @overload
    def jobs(
        self, state: Optional[str] = ..., *, frame: Literal[True, None] = ...
    ) -> pd.DataFrame: ...

    @overload
    def jobs(
        self, state: Optional[str] = ..., *, frame: Optional[bool]
    ) -> Union[pd.DataFrame, Records]: ...

    def jobs(
        self, state: Optional[str] = None, *, frame: Optional[bool] = None
    ) -> Union[pd.DataFrame, Records]:
        return self.client.jobs(self._need_id(), state, frame=frame)

    @overload
    def attempts(self, *, clean_only: bool = ..., frame: Literal[False]) -> Records: ...

    @overload
    def attempts(
        self, *, clean_only: bool = ..., frame: Literal[True, None] = ...
    ) -> pd.DataFrame: ...

    @overload
    def attempts(
        self, *, clean_only: bool = ..., frame: Optional[bool]
    ) -> Union[pd.DataFrame, Records]: ...

    def attempts(
        self, *, clean_only: bool = False, frame: Optional[bool] = None
    ) -> Union[pd.DataFrame, Records]:
        return self.client.attempts(self._need_id(), clean_only=clean_only, frame=frame)

    def cancel(self) -> CancelResponse:
        return self.client.cancel_experiment(self._need_id())


class AsyncClient:
    """The asynchronous twin of ``Client`` (``await`` every call; ``logs`` is an async
    iterator), with the same defaults for the server and the token."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        token_file: Optional[PathLike] = None,
        ca_file: Optional[PathLike] = None,
        timeout: float = 30.0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        options = _http_options(url, token, token_file, timeout, ca_file)
        self.url: str = options["base_url"]
        self._http = httpx.AsyncClient(**options, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return _check(await self._http.request(method, path, **kw))
        except httpx.TransportError as e:
            raise _unreachable(self.url, e) from e

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        return (await self._request(method, path, **kw)).json()

    async def _experiment_id(self, given: str) -> str:
        given = str(given)
        return given if _is_id(given) else _newest_named(given, await self.experiments())

    async def _experiment_id_or_all(self, given: Optional[str]) -> Optional[str]:
        return None if given is None else await self._experiment_id(given)

    async def health(self) -> Health:
        return Health.model_validate(await self._json("GET", "/v1/health"))

    async def submit(
        self, spec: SpecLike, *, seed: Optional[int] = None, dry_run: bool = False
    ) -> "AsyncExperiment":
        body: Dict[str, Any] = {"spec": load_spec(spec), "dry_run": dry_run}
        if seed is not None:
            body["seed"] = seed
        resp = SubmitResponse.model_validate(await self._json("POST", "/v1/experiments", json=body))
        return AsyncExperiment(self, resp.experiment, resp)

    def experiment(self, id: str) -> "AsyncExperiment":
        """An experiment by id, or by name (resolved, to the newest of that name, at its
        first call)."""
        given = str(id)
        if _is_id(given):
            return AsyncExperiment(self, given)
        return AsyncExperiment(self, None, name=given)

    async def experiments(self) -> List[ExperimentSummary]:
        return [
            ExperimentSummary.model_validate(e) for e in await self._json("GET", "/v1/experiments")
        ]

    async def progress(
        self,
        experiment: Optional[str] = None,
        *,
        after: Optional[int] = None,
        timeout_ms: Optional[int] = None,
    ) -> Progress:
        params = _given(
            {
                "experiment": await self._experiment_id_or_all(experiment),
                "after": after,
                "timeout_ms": timeout_ms,
            }
        )
        return Progress.model_validate(await self._json("GET", "/v1/progress", params=params))

    async def job_list(
        self,
        experiment: Optional[str] = None,
        state: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> List[JobSummary]:
        params = _given(
            {
                "experiment": await self._experiment_id_or_all(experiment),
                "state": state,
                "limit": limit,
            }
        )
        return [
            JobSummary.model_validate(j) for j in await self._json("GET", "/v1/jobs", params=params)
        ]

    @overload
    async def jobs(
        self,
        experiment: Optional[str] = ...,
        state: Optional[str] = ...,
        limit: Optional[int] = ...,
        *,
        frame: Literal[False],
    ) -> Records: ...

    @overload
    async def jobs(
        self,
        experiment: Optional[str] = ...,
        state: Optional[str] = ...,
        limit: Optional[int] = ...,
        *,
        frame: Literal[True, None] = ...,
    ) -> pd.DataFrame: ...

    @overload
    async def jobs(
        self,
        experiment: Optional[str] = ...,
        state: Optional[str] = ...,
        limit: Optional[int] = ...,
        *,
        frame: Optional[bool],
    ) -> Union[pd.DataFrame, Records]: ...

    async def jobs(
        self,
        experiment: Optional[str] = None,
        state: Optional[str] = None,
        limit: Optional[int] = None,
        *,
        frame: Optional[bool] = None,
    ) -> Union[pd.DataFrame, Records]:
        rows = [j.model_dump() for j in await self.job_list(experiment, state, limit)]
        return records_or_frame(rows, frame, JOB_TIMES)

    async def job(self, id: str) -> JobDetail:
        return JobDetail.model_validate(await self._json("GET", f"/v1/jobs/{_seg(id)}"))

    async def attempt(self, id: str) -> AttemptView:
        return AttemptView.model_validate(await self._json("GET", f"/v1/attempts/{_seg(id)}"))

    @overload
    async def attempts(
        self, experiment: Optional[str] = ..., *, clean_only: bool = ..., frame: Literal[False]
    ) -> Records: ...

    @overload
    async def attempts(
        self,
        experiment: Optional[str] = ...,
        *,
        clean_only: bool = ...,
        frame: Literal[True, None] = ...,
    ) -> pd.DataFrame: ...

    @overload
    async def attempts(
        self, experiment: Optional[str] = ..., *, clean_only: bool = ..., frame: Optional[bool]
    ) -> Union[pd.DataFrame, Records]: ...

    async def attempts(
        self,
        experiment: Optional[str] = None,
        *,
        clean_only: bool = False,
        frame: Optional[bool] = None,
    ) -> Union[pd.DataFrame, Records]:
        params = _export_params(await self._experiment_id_or_all(experiment), clean_only)
        text = (await self._request("GET", "/v1/export", params=params)).text
        return records_or_frame(_csv_rows(text), frame, ATTEMPT_TIMES)

    async def attempt_telemetry(
        self, attempt: str, *, limit: Optional[int] = None
    ) -> AttemptTelemetry:
        return AttemptTelemetry.model_validate(
            await self._json(
                "GET", f"/v1/attempts/{_seg(attempt)}/telemetry", params=_given({"limit": limit})
            )
        )

    async def attempt_telemetry_frame(
        self, attempt: str, *, limit: Optional[int] = None
    ) -> pd.DataFrame:
        return (await self.attempt_telemetry(attempt, limit=limit)).to_frame()

    async def gpu_telemetry(
        self,
        node: str,
        gpu: int,
        *,
        since: Optional[Instant] = None,
        until: Optional[Instant] = None,
        limit: Optional[int] = None,
    ) -> GpuSeries:
        return GpuSeries.model_validate(
            await self._json(
                "GET",
                f"/v1/nodes/{_seg(node)}/gpus/{_seg(gpu)}/telemetry",
                params=_telemetry_params(since, until, limit),
            )
        )

    async def gpu_telemetry_frame(
        self,
        node: str,
        gpu: int,
        *,
        since: Optional[Instant] = None,
        until: Optional[Instant] = None,
        limit: Optional[int] = None,
    ) -> pd.DataFrame:
        series = await self.gpu_telemetry(node, gpu, since=since, until=until, limit=limit)
        return series.to_frame()

    async def nodes(self) -> List[NodeView]:
        return [NodeView.model_validate(n) for n in await self._json("GET", "/v1/nodes")]

    async def cancel(self, id: str) -> CancelResponse:
        if not _is_id(str(id)):
            return await self.cancel_experiment(id)
        try:
            return await self.cancel_experiment(id)
        except NotFoundError:
            return await self.cancel_job(id)

    async def cancel_experiment(self, id: str) -> CancelResponse:
        exp = await self._experiment_id(id)
        return CancelResponse.model_validate(
            await self._json("POST", f"/v1/experiments/{_seg(exp)}/cancel")
        )

    async def cancel_job(self, id: str) -> CancelResponse:
        return CancelResponse.model_validate(
            await self._json("POST", f"/v1/jobs/{_seg(id)}/cancel")
        )

    async def retry(self, job_id: str) -> RetryResponse:
        return RetryResponse.model_validate(
            await self._json("POST", f"/v1/jobs/{_seg(job_id)}/retry")
        )

    async def set_plan(self, node: str, plan: str) -> NodeView:
        return NodeView.model_validate(
            await self._json("PUT", f"/v1/nodes/{_seg(node)}/plan", json={"plan": plan})
        )

    async def wait(
        self,
        experiment: Optional[str] = None,
        *,
        progress: bool = False,
        timeout: Optional[float] = None,
        raise_on_failure: bool = False,
    ) -> Progress:
        deadline = _Deadline(timeout)
        exp = await self._experiment_id_or_all(experiment)
        bar = _Progress(progress, experiment or "all")
        try:
            p = await self.progress(exp)
            while True:
                bar.update(p)
                if _finished(p):
                    break
                p = await self.progress(exp, after=p.version, timeout_ms=deadline.hold_ms())
        finally:
            bar.close()
        if raise_on_failure and p.counts.failed:
            raise _failures(exp, p, await self.job_list(exp, state="failed"))
        return p

    async def _attempt_of(self, id: str, follow: bool) -> Optional[str]:
        """The latest attempt of job ``id``, or ``id`` itself when it names an attempt."""
        try:
            d = await self.job(id)
        except NotFoundError:
            await self.attempt(id)  # raises NotFoundError when it is neither
            return id
        while not d.attempts_detail:
            if not follow or d.state in ("succeeded", "failed", "cancelled"):
                return None
            p = await self.progress(d.experiment)
            await self.progress(d.experiment, after=p.version, timeout_ms=POLL_MS)
            d = await self.job(id)
        return d.attempts_detail[-1].id

    async def logs(self, id: str, *, follow: bool = False) -> AsyncIterator[str]:
        attempt = await self._attempt_of(str(id), follow)
        if attempt is None:
            return
        cursor = _LogCursor(follow)
        done = False
        while not done:
            resp = await self._request(
                "GET", f"/v1/attempts/{_seg(attempt)}/log", params=cursor.params()
            )
            texts, done = cursor.take(resp)
            for text in texts:
                yield text


class AsyncExperiment:
    """A submitted experiment of ``AsyncClient``; one named by name is resolved at its first
    call."""

    def __init__(
        self,
        client: AsyncClient,
        id: Optional[str],
        submitted: Optional[SubmitResponse] = None,
        *,
        name: Optional[str] = None,
    ) -> None:
        self.client = client
        self.id = id
        self.submitted = submitted
        self._name = name

    def __repr__(self) -> str:
        return f"AsyncExperiment({self.id or self._name!r})"

    async def _need_id(self) -> str:
        if self.id is None:
            if self._name is None:
                raise ValueError("a dry run stores nothing: there is no experiment")
            self.id = await self.client._experiment_id(self._name)
        return self.id

    async def summary(self) -> ExperimentSummary:
        exp = await self._need_id()
        return ExperimentSummary.model_validate(
            await self.client._json("GET", f"/v1/experiments/{_seg(exp)}")
        )

    async def progress(self) -> Progress:
        return await self.client.progress(await self._need_id())

    async def wait(
        self,
        progress: bool = False,
        timeout: Optional[float] = None,
        *,
        raise_on_failure: bool = False,
    ) -> Progress:
        return await self.client.wait(
            await self._need_id(),
            progress=progress,
            timeout=timeout,
            raise_on_failure=raise_on_failure,
        )

    @overload
    async def jobs(self, state: Optional[str] = ..., *, frame: Literal[False]) -> Records: ...

    @overload
    async def jobs(
        self, state: Optional[str] = ..., *, frame: Literal[True, None] = ...
    ) -> pd.DataFrame: ...

    @overload
    async def jobs(
        self, state: Optional[str] = ..., *, frame: Optional[bool]
    ) -> Union[pd.DataFrame, Records]: ...

    async def jobs(
        self, state: Optional[str] = None, *, frame: Optional[bool] = None
    ) -> Union[pd.DataFrame, Records]:
        return await self.client.jobs(await self._need_id(), state, frame=frame)

    @overload
    async def attempts(self, *, clean_only: bool = ..., frame: Literal[False]) -> Records: ...

    @overload
    async def attempts(
        self, *, clean_only: bool = ..., frame: Literal[True, None] = ...
    ) -> pd.DataFrame: ...

    @overload
    async def attempts(
        self, *, clean_only: bool = ..., frame: Optional[bool]
    ) -> Union[pd.DataFrame, Records]: ...

    async def attempts(
        self, *, clean_only: bool = False, frame: Optional[bool] = None
    ) -> Union[pd.DataFrame, Records]:
        return await self.client.attempts(
            await self._need_id(), clean_only=clean_only, frame=frame
        )

    async def cancel(self) -> CancelResponse:
        return await self.client.cancel_experiment(await self._need_id())


__all__ = [
    "AsyncClient",
    "AsyncExperiment",
    "Client",
    "Experiment",
    "HeadroomError",
    "Instant",
    "Records",
    "load_spec",
    "local_token_path",
    "read_token_file",
]
