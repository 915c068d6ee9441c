"""``Client`` (sync) and ``AsyncClient`` over the coordinator's REST API (``/v1``).

Waiting is long-polling, never sleeping: ``wait`` holds ``/v1/progress?after=VERSION`` open
until the counts change, ``logs(follow=True)`` holds the log route open with ``wait_ms``."""

from __future__ import annotations

import codecs
import csv
import io
import os
import re
import time
from pathlib import Path
from typing import (
    Any,
    AsyncIterator,
    Dict,
    Iterator,
    List,
    Optional,
    Union,
)

import httpx
import yaml

from .errors import ConnectionFailed, HeadroomError, NotFoundError, error_from_response
from .models import (
    AttemptView,
    CancelResponse,
    ExperimentSummary,
    Health,
    JobDetail,
    JobSummary,
    NodeView,
    Progress,
    RetryResponse,
    SubmitResponse,
)

DEFAULT_URL = "http://127.0.0.1:7420"
#: How long one long-poll asks the server to hold (the server caps it).
POLL_MS = 20_000
LOG_OFFSET_HEADER = "x-log-offset"
ATTEMPT_ENDED_HEADER = "x-attempt-ended"

SpecLike = Union[Dict[str, Any], str, "os.PathLike[str]"]


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
    return doc


def _records_or_frame(rows: List[Dict[str, Any]], frame: Optional[bool]) -> Any:
    """Rows as a pandas DataFrame (when ``frame`` or, by default, when pandas is installed),
    else as a list of dicts. Parameters are spread into ``params.NAME`` columns."""
    if frame is False:
        return rows
    try:
        import pandas as pd
    except ImportError:
        if frame:
            raise ImportError(
                "pandas is not installed: pip install 'headroom-client[pandas]'"
            ) from None
        return rows
    return pd.json_normalize(rows) if rows else pd.DataFrame()


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


def _csv_rows(text: str) -> List[Dict[str, Any]]:
    return [
        {k: _csv_value(v) for k, v in row.items()}
        for row in csv.DictReader(io.StringIO(text))
    ]


def _export_params(experiment: Optional[str], clean_only: bool) -> Dict[str, str]:
    params = {"experiment": experiment} if experiment else {}
    if clean_only:
        params["clean_only"] = "true"
    return params


def local_token_path(url: str) -> Optional[str]:
    """Where a local ``headroom up`` of this account leaves its admin token for ``url``
    (``~/.headroom/local/<host>_<port>``, 0600), as the CLI finds it."""
    authority = url.split("://", 1)[-1].split("/", 1)[0]
    host, sep, port = authority.rpartition(":")
    if not sep or not port.isdigit():
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
    except OSError:
        return None
    return token or None


def _headers(token: Optional[str], url: str = "") -> Dict[str, str]:
    if token is None:
        token = os.environ.get("HEADROOM_TOKEN")
    if token is None and os.environ.get("HEADROOM_TOKEN_FILE"):
        with open(os.environ["HEADROOM_TOKEN_FILE"], encoding="utf-8") as f:
            token = f.read().strip()
    if token is None:
        token = _local_token(url)
    h = {"accept": "application/json", "user-agent": "headroom-client/0.1"}
    if token:
        h["authorization"] = f"Bearer {token}"
    return h


def _check(resp: httpx.Response) -> httpx.Response:
    if resp.status_code >= 400:
        raise error_from_response(resp)
    return resp


def _unreachable(url: str, e: Exception) -> ConnectionFailed:
    return ConnectionFailed(
        0,
        "unreachable",
        f"cannot reach the coordinator at {url} ({e}); pass Client(url=...) or set "
        "HEADROOM_SERVER",
    )


def _http_options(url: Optional[str], token: Optional[str], timeout: float) -> Dict[str, Any]:
    """What both clients give httpx: the base URL, the headers, and a read timeout past one
    long-poll."""
    # The CLI's variable first; HEADROOM_URL is what earlier clients read.
    base = (
        url or os.environ.get("HEADROOM_SERVER") or os.environ.get("HEADROOM_URL") or DEFAULT_URL
    ).rstrip("/")
    return {
        "base_url": base,
        "headers": _headers(token, base),
        "timeout": httpx.Timeout(timeout, read=timeout + POLL_MS / 1000),
    }


def _finished(p: Progress) -> bool:
    return p.counts.total > 0 and p.counts.finished == p.counts.total


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
        done = not self.follow or (ended and not chunk)
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
    """A synchronous client. ``token`` defaults to ``$HEADROOM_TOKEN``, ``url`` to
    ``$HEADROOM_SERVER`` (as the CLI; ``$HEADROOM_URL`` is still read) or
    ``http://127.0.0.1:7420``."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: float = 30.0,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        options = _http_options(url, token, timeout)
        self.url: str = options["base_url"]
        self._http = httpx.Client(**options, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return _check(self._http.request(method, path, **kw))
        except httpx.TransportError as e:
            raise _unreachable(self.url, e) from e

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        return self._request(method, path, **kw).json()

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
        return Experiment(self, str(id))

    def experiments(self) -> List[ExperimentSummary]:
        return [ExperimentSummary.model_validate(e) for e in self._json("GET", "/v1/experiments")]

    def progress(
        self,
        experiment: Optional[str] = None,
        *,
        after: Optional[int] = None,
        timeout_ms: Optional[int] = None,
    ) -> Progress:
        params = {
            k: v
            for k, v in {"experiment": experiment, "after": after, "timeout_ms": timeout_ms}.items()
            if v is not None
        }
        return Progress.model_validate(self._json("GET", "/v1/progress", params=params))

    def job_list(
        self,
        experiment: Optional[str] = None,
        state: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> List[JobSummary]:
        params = {
            k: v
            for k, v in {"experiment": experiment, "state": state, "limit": limit}.items()
            if v is not None
        }
        return [JobSummary.model_validate(j) for j in self._json("GET", "/v1/jobs", params=params)]

    def jobs(
        self,
        experiment: Optional[str] = None,
        state: Optional[str] = None,
        limit: Optional[int] = None,
        *,
        frame: Optional[bool] = None,
    ) -> Any:
        """Jobs as a DataFrame when pandas is installed (or ``frame=True``), else as dicts."""
        rows = [j.model_dump(mode="json") for j in self.job_list(experiment, state, limit)]
        return _records_or_frame(rows, frame)

    def job(self, id: str) -> JobDetail:
        return JobDetail.model_validate(self._json("GET", f"/v1/jobs/{id}"))

    def attempt(self, id: str) -> AttemptView:
        return AttemptView.model_validate(self._json("GET", f"/v1/attempts/{id}"))

    def attempts(
        self,
        experiment: Optional[str] = None,
        *,
        clean_only: bool = False,
        frame: Optional[bool] = None,
    ) -> Any:
        """One row per attempt (the CSV export's columns: parameters, outcome, peak memory,
        energy...), as a DataFrame when pandas is installed, else as dicts. ``clean_only``
        leaves out contaminated and throttled attempts (as ``headroom export --clean-only``)."""
        params = _export_params(experiment, clean_only)
        text = self._request("GET", "/v1/export", params=params).text
        return _records_or_frame(_csv_rows(text), frame)

    def nodes(self) -> List[NodeView]:
        return [NodeView.model_validate(n) for n in self._json("GET", "/v1/nodes")]

    # ---- changes ----

    def cancel(self, id: str) -> CancelResponse:
        """Cancels an experiment (every unfinished job) or a single job, by id."""
        try:
            return self.cancel_experiment(id)
        except NotFoundError:
            return self.cancel_job(id)

    def cancel_experiment(self, id: str) -> CancelResponse:
        return CancelResponse.model_validate(self._json("POST", f"/v1/experiments/{id}/cancel"))

    def cancel_job(self, id: str) -> CancelResponse:
        return CancelResponse.model_validate(self._json("POST", f"/v1/jobs/{id}/cancel"))

    def retry(self, job_id: str) -> RetryResponse:
        """Runs an ended job once more."""
        return RetryResponse.model_validate(self._json("POST", f"/v1/jobs/{job_id}/retry"))

    def set_plan(self, node: str, plan: str) -> NodeView:
        """Sets a node's concurrency plan, slots per GPU: ``"2,2,1"``."""
        from urllib.parse import quote

        return NodeView.model_validate(
            self._json("PUT", f"/v1/nodes/{quote(node, safe='')}/plan", json={"plan": plan})
        )

    # ---- waiting ----

    def wait(
        self, experiment: Optional[str] = None, *, progress: bool = False, timeout: Optional[float] = None
    ) -> Progress:
        """Blocks until every job (of ``experiment``) has ended; long-polls, never sleeps."""
        deadline = _Deadline(timeout)
        bar = _Progress(progress, experiment or "all")
        try:
            p = self.progress(experiment)
            while True:
                bar.update(p)
                if _finished(p):
                    return p
                p = self.progress(experiment, after=p.version, timeout_ms=deadline.hold_ms())
        finally:
            bar.close()

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
            resp = self._request("GET", f"/v1/attempts/{attempt}/log", params=cursor.params())
            texts, done = cursor.take(resp)
            yield from texts


class Experiment:
    """A submitted experiment: ``wait``, ``jobs``, ``attempts``, ``cancel``."""

    def __init__(self, client: Client, id: Optional[str], submitted: Optional[SubmitResponse] = None):
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
            self.client._json("GET", f"/v1/experiments/{self._need_id()}")
        )

    def progress(self) -> Progress:
        return self.client.progress(self._need_id())

    def wait(self, progress: bool = False, timeout: Optional[float] = None) -> Progress:
        return self.client.wait(self._need_id(), progress=progress, timeout=timeout)

    def jobs(self, state: Optional[str] = None, *, frame: Optional[bool] = None) -> Any:
        return self.client.jobs(self._need_id(), state, frame=frame)

    def attempts(self, *, clean_only: bool = False, frame: Optional[bool] = None) -> Any:
        return self.client.attempts(self._need_id(), clean_only=clean_only, frame=frame)

    def cancel(self) -> CancelResponse:
        return self.client.cancel_experiment(self._need_id())


class AsyncClient:
    """The asynchronous twin of ``Client`` (``await`` every call; ``logs`` is an async
    iterator)."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: float = 30.0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        options = _http_options(url, token, timeout)
        self.url: str = options["base_url"]
        self._http = httpx.AsyncClient(**options, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return _check(await self._http.request(method, path, **kw))
        except httpx.TransportError as e:
            raise _unreachable(self.url, e) from e

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        return (await self._request(method, path, **kw)).json()

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
        return AsyncExperiment(self, str(id))

    async def progress(
        self,
        experiment: Optional[str] = None,
        *,
        after: Optional[int] = None,
        timeout_ms: Optional[int] = None,
    ) -> Progress:
        params = {
            k: v
            for k, v in {"experiment": experiment, "after": after, "timeout_ms": timeout_ms}.items()
            if v is not None
        }
        return Progress.model_validate(await self._json("GET", "/v1/progress", params=params))

    async def jobs(
        self,
        experiment: Optional[str] = None,
        state: Optional[str] = None,
        limit: Optional[int] = None,
        *,
        frame: Optional[bool] = None,
    ) -> Any:
        params = {
            k: v
            for k, v in {"experiment": experiment, "state": state, "limit": limit}.items()
            if v is not None
        }
        rows = [
            JobSummary.model_validate(j).model_dump(mode="json")
            for j in await self._json("GET", "/v1/jobs", params=params)
        ]
        return _records_or_frame(rows, frame)

    async def job(self, id: str) -> JobDetail:
        return JobDetail.model_validate(await self._json("GET", f"/v1/jobs/{id}"))

    async def attempt(self, id: str) -> AttemptView:
        return AttemptView.model_validate(await self._json("GET", f"/v1/attempts/{id}"))

    async def attempts(
        self,
        experiment: Optional[str] = None,
        *,
        clean_only: bool = False,
        frame: Optional[bool] = None,
    ) -> Any:
        params = _export_params(experiment, clean_only)
        text = (await self._request("GET", "/v1/export", params=params)).text
        return _records_or_frame(_csv_rows(text), frame)

    async def nodes(self) -> List[NodeView]:
        return [NodeView.model_validate(n) for n in await self._json("GET", "/v1/nodes")]

    async def cancel(self, id: str) -> CancelResponse:
        try:
            return await self.cancel_experiment(id)
        except NotFoundError:
            return await self.cancel_job(id)

    async def cancel_experiment(self, id: str) -> CancelResponse:
        return CancelResponse.model_validate(await self._json("POST", f"/v1/experiments/{id}/cancel"))

    async def cancel_job(self, id: str) -> CancelResponse:
        return CancelResponse.model_validate(await self._json("POST", f"/v1/jobs/{id}/cancel"))

    async def retry(self, job_id: str) -> RetryResponse:
        return RetryResponse.model_validate(await self._json("POST", f"/v1/jobs/{job_id}/retry"))

    async def set_plan(self, node: str, plan: str) -> NodeView:
        from urllib.parse import quote

        return NodeView.model_validate(
            await self._json("PUT", f"/v1/nodes/{quote(node, safe='')}/plan", json={"plan": plan})
        )

    async def wait(
        self, experiment: Optional[str] = None, *, progress: bool = False, timeout: Optional[float] = None
    ) -> Progress:
        deadline = _Deadline(timeout)
        bar = _Progress(progress, experiment or "all")
        try:
            p = await self.progress(experiment)
            while True:
                bar.update(p)
                if _finished(p):
                    return p
                p = await self.progress(experiment, after=p.version, timeout_ms=deadline.hold_ms())
        finally:
            bar.close()

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
            resp = await self._request("GET", f"/v1/attempts/{attempt}/log", params=cursor.params())
            texts, done = cursor.take(resp)
            for text in texts:
                yield text


class AsyncExperiment:
    def __init__(
        self, client: AsyncClient, id: Optional[str], submitted: Optional[SubmitResponse] = None
    ):
        self.client = client
        self.id = id
        self.submitted = submitted

    def __repr__(self) -> str:
        return f"AsyncExperiment({self.id!r})"

    def _need_id(self) -> str:
        if self.id is None:
            raise ValueError("a dry run stores nothing: there is no experiment")
        return self.id

    async def wait(self, progress: bool = False, timeout: Optional[float] = None) -> Progress:
        return await self.client.wait(self._need_id(), progress=progress, timeout=timeout)

    async def jobs(self, state: Optional[str] = None, *, frame: Optional[bool] = None) -> Any:
        return await self.client.jobs(self._need_id(), state, frame=frame)

    async def attempts(self, *, clean_only: bool = False, frame: Optional[bool] = None) -> Any:
        return await self.client.attempts(self._need_id(), clean_only=clean_only, frame=frame)

    async def cancel(self) -> CancelResponse:
        return await self.client.cancel_experiment(self._need_id())


__all__ = [
    "AsyncClient",
    "AsyncExperiment",
    "Client",
    "Experiment",
    "HeadroomError",
    "load_spec",
]
