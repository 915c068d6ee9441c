"""Every operation of the client, written once and without network I/O ("sans-IO"; a spec
file is read and an export file written here). Each is a
generator that yields the requests it needs (``Call``), is sent each one's answer (an
``httpx.Response`` below 400: an error answer or a failure to reach the coordinator is raised
at the ``yield`` as a ``HeadroomError``, which the operation may catch), and returns its
typed result; ``logs`` also yields its text. ``Client`` drives them with ``httpx.Client``,
``AsyncClient`` with ``httpx.AsyncClient`` (``client.py``).

Waiting is long-polling, never sleeping: ``wait`` holds ``/v1/progress?after=VERSION`` open
until the counts change, ``logs(follow=True)`` holds the log route open with ``wait_ms``.

Experiments are named by id or by name (the newest of that name), as the CLI names them: the
API takes ids only, so a name is resolved here through ``GET /v1/experiments``."""

from __future__ import annotations

import codecs
import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, Generator, List, Optional, Sequence, Tuple, TypeVar, Union
from urllib.parse import quote

import httpx

from ._source import (
    MAX_SNAPSHOT_BYTES,
    EnvironmentLike,
    Submission,
    enterable_by,
    prepare_submission,
)
from ._spec import SpecLike
from ._tables import (
    Records,
    Table,
    attempts_table,
    export_rows,
    jobs_table,
    metrics_table,
)
from ._transport import POLL_MS, PathLike
from .errors import HeadroomError, JobsFailedError, NotFoundError
from .models import (
    AlertsView,
    AttemptSeries,
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
    RetryFailedResponse,
    RetryResponse,
    StateCounts,
    SubmitResponse,
    SubscriptionView,
    UsageReport,
)

T = TypeVar("T")

LOG_OFFSET_HEADER = "x-log-offset"
ATTEMPT_ENDED_HEADER = "x-attempt-ended"
EXPORT = "/v1/export"
#: The states a job ends in (``pruned``: stopped by ``early_stop``).
ENDED = ("succeeded", "failed", "cancelled", "pruned")

#: A point in time for telemetry windows: a ``datetime`` (naive ones are local time), a
#: ``timedelta`` before now, or an RFC 3339 string.
Instant = Union[datetime, timedelta, str]
#: How far back a usage report reads: ``"30d"``, ``"12h"`` (as the CLI's ``--since``) or a
#: ``timedelta``.
Duration = Union[str, timedelta]
#: How a usage report groups its rows.
USAGE_BY = ("user", "experiment")


@dataclass(frozen=True)
class Call:
    """A request, as both faces send it through httpx: a JSON body (``json``), or raw bytes
    (``content``, with their ``headers``: a code bundle)."""

    method: str
    path: str
    params: Optional[Dict[str, Any]] = None
    json: Any = None
    content: Optional[bytes] = None
    headers: Optional[Dict[str, str]] = None


#: An operation: yields requests, is sent their answers, returns its result.
Op = Generator[Call, httpx.Response, T]
#: A stream of text (``logs``): yields requests, sent their answers, and text, sent None.
Stream = Generator[Union[Call, str], Optional[httpx.Response], None]


# ---- reads and submissions ----


def _json(
    method: str, path: str, params: Optional[Dict[str, Any]] = None, body: Any = None
) -> Op[Any]:
    resp = yield Call(method, path, params, body)
    return resp.json()


def health() -> Op[Health]:
    return Health.model_validate((yield from _json("GET", "/v1/health")))


def submit(
    spec: SpecLike,
    seed: Optional[int],
    dry_run: bool,
    workdir: Optional[PathLike] = None,
    environment: Optional[EnvironmentLike] = None,
    snapshot: Optional[bool] = None,
    max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
    local: bool = False,
) -> Op[SubmitResponse]:
    """The spec with its source (``_source``): the code bundle uploaded first when it is
    run from one, then the submission, which names it (``local``: see ``submit_prepared``)."""
    prepared = prepare_submission(
        spec,
        seed=seed,
        dry_run=dry_run,
        workdir=workdir,
        environment=environment,
        snapshot=snapshot,
        max_snapshot_bytes=max_snapshot_bytes,
    )
    return (yield from submit_prepared(prepared, local))


def submit_prepared(prepared: Submission, local: bool = False) -> Op[SubmitResponse]:
    """``submit`` once its source is worked out (``AsyncClient`` does that in a thread: it
    runs git and reads files). ``local``: the coordinator is this host's, so a working
    directory the jobs' Unix user may not enter is refused before anything is sent (a
    snapshot runs from its own copy). Every bundle (a study's variants may have their own)
    is uploaded before the submission that names it."""
    if local and prepared.entered:
        who = yield from _json("GET", "/v1/whoami")
        user = who.get("unix_user") if isinstance(who, dict) else None
        if isinstance(user, str):
            for workdir in prepared.entered:
                enterable_by(workdir, user)
    for bundle in prepared.bundles:
        yield from upload_bundle(bundle.data, bundle.hash)
    body = prepared.body
    return SubmitResponse.model_validate((yield from _json("POST", "/v1/experiments", body=body)))


def upload_bundle(data: bytes, digest: str) -> Op[Dict[str, Any]]:
    """``PUT /v1/bundles/{digest}``: the coordinator's answer, ``{hash, bytes, stored}``
    (``stored`` False: it had it already)."""
    path = f"/v1/bundles/{_seg(digest)}"
    headers = {"content-type": "application/octet-stream"}
    resp = yield Call("PUT", path, content=data, headers=headers)
    answer = resp.json()
    if not isinstance(answer, dict) or answer.get("hash") != digest:
        raise HeadroomError(0, "bad_answer", f"PUT {path}: the answer names another bundle")
    return answer


def experiments() -> Op[List[ExperimentSummary]]:
    found = yield from _json("GET", "/v1/experiments")
    return [ExperimentSummary.model_validate(e) for e in found]


def experiment_id(given: str) -> Op[str]:
    """An experiment's id from its id or its name (the newest of that name)."""
    given = str(given)
    return given if _is_id(given) else _newest_named(given, (yield from experiments()))


def experiment_id_or_all(given: Optional[str]) -> Op[Optional[str]]:
    return None if given is None else (yield from experiment_id(given))


def experiment_summary(id: str) -> Op[ExperimentSummary]:
    return ExperimentSummary.model_validate(
        (yield from _json("GET", f"/v1/experiments/{_seg(id)}"))
    )


def progress(
    experiment: Optional[str], after: Optional[int] = None, timeout_ms: Optional[int] = None
) -> Op[Progress]:
    exp = yield from experiment_id_or_all(experiment)
    params = _given({"experiment": exp, "after": after, "timeout_ms": timeout_ms})
    return Progress.model_validate((yield from _json("GET", "/v1/progress", params)))


def job_list(
    experiment: Optional[str], state: Optional[str] = None, limit: Optional[int] = None
) -> Op[List[JobSummary]]:
    exp = yield from experiment_id_or_all(experiment)
    params = _given({"experiment": exp, "state": state, "limit": limit})
    return [JobSummary.model_validate(j) for j in (yield from _json("GET", "/v1/jobs", params))]


def jobs(experiment: Optional[str], state: Optional[str], limit: Optional[int]) -> Op[Table]:
    """``jobs()``'s table: a job's fields, its parameters as ``params.NAME``."""
    found = yield from job_list(experiment, state, limit)
    return jobs_table(j.model_dump() for j in found)


def job(id: str) -> Op[JobDetail]:
    return JobDetail.model_validate((yield from _json("GET", f"/v1/jobs/{_seg(id)}")))


def attempt(id: str) -> Op[AttemptView]:
    return AttemptView.model_validate((yield from _json("GET", f"/v1/attempts/{_seg(id)}")))


# ---- the export ----

#: The JSON export, every page: its columns and its rows.
_Export = Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]


def _is_json(resp: httpx.Response) -> bool:
    kind = str(resp.headers.get("content-type", ""))
    return kind.split(";")[0].strip() == "application/json"


def _export_json(experiment: Optional[str], clean_only: bool) -> Op[_Export]:
    """The JSON export's columns and rows, following ``next_after`` page by page."""
    params: Dict[str, Any] = {**_export_params(experiment, clean_only), "format": "json"}
    columns: Optional[List[Dict[str, Any]]] = None
    rows: List[Dict[str, Any]] = []
    while True:
        resp = yield Call("GET", EXPORT, params)
        page = export_rows(resp.json()) if _is_json(resp) else None
        if page is None:
            raise HeadroomError(0, "bad_answer", f"GET {EXPORT}?format=json: not an export")
        cols, got, after = page
        columns = cols if columns is None else columns
        rows.extend(got)
        if after is None:
            return columns, rows
        if "after" in params and after <= params["after"]:
            raise HeadroomError(
                0, "bad_answer", f"GET {EXPORT}: next_after {after} does not advance"
            )
        params = {**params, "after": after}


def attempts(experiment: Optional[str], clean_only: bool) -> Op[Table]:
    """``attempts()``'s table, from the JSON export."""
    exp = yield from experiment_id_or_all(experiment)
    return attempts_table(*(yield from _export_json(exp, clean_only)))


def export(
    experiment: Optional[str], clean_only: bool, format: str, path: Optional[PathLike]
) -> Op[Union[str, Records]]:
    """The export as the coordinator writes it: the CSV's text, or the JSON export's rows
    (every page); written to ``path`` when given (the JSON as one page:
    ``{"columns": [...], "rows": [...]}``)."""
    if format not in ("csv", "json"):
        raise ValueError(f"format is 'csv' or 'json', not {format!r}")
    exp = yield from experiment_id_or_all(experiment)
    if format == "csv":
        resp = yield Call("GET", EXPORT, _export_params(exp, clean_only))
        if path is not None:
            Path(path).write_bytes(resp.content)
        return resp.text
    columns, rows = yield from _export_json(exp, clean_only)
    if path is not None:
        text = json.dumps({"columns": columns, "rows": rows}, ensure_ascii=False)
        Path(path).write_text(text + "\n", encoding="utf-8")
    return rows


# ---- metrics ----


def metric_series(experiment: str) -> Op[List[AttemptSeries]]:
    """Every attempt's metric series and final values (``GET /v1/experiments/{id}/metrics``)."""
    exp = yield from experiment_id(experiment)
    found = yield from _json("GET", f"/v1/experiments/{_seg(exp)}/metrics")
    return [AttemptSeries.model_validate(a) for a in found]


def metrics(experiment: str) -> Op[Table]:
    """``metrics()``'s table: one row per point of each attempt's metrics."""
    found = yield from metric_series(experiment)
    return metrics_table(a.model_dump() for a in found)


# ---- telemetry ----


def attempt_telemetry(attempt: str, limit: Optional[int]) -> Op[AttemptTelemetry]:
    path = f"/v1/attempts/{_seg(attempt)}/telemetry"
    found = yield from _json("GET", path, _given({"limit": limit}))
    return AttemptTelemetry.model_validate(found)


def gpu_telemetry(
    node: str, gpu: int, since: Optional[Instant], until: Optional[Instant], limit: Optional[int]
) -> Op[GpuSeries]:
    path = f"/v1/nodes/{_seg(node)}/gpus/{_seg(gpu)}/telemetry"
    params = _telemetry_params(since, until, limit)
    return GpuSeries.model_validate((yield from _json("GET", path, params)))


def nodes() -> Op[List[NodeView]]:
    return [NodeView.model_validate(n) for n in (yield from _json("GET", "/v1/nodes"))]


# ---- usage ----


def usage(since: Duration, by: str) -> Op[UsageReport]:
    """``GET /v1/usage``: what each user (or experiment) used over ``since``, and every
    user's fair-share standing."""
    if by not in USAGE_BY:
        raise ValueError(f"by is 'user' or 'experiment', not {by!r}")
    params = {"since": _duration(since), "by": by}
    return UsageReport.model_validate((yield from _json("GET", "/v1/usage", params)))


def alerts() -> Op[AlertsView]:
    """``GET /v1/alerts``: the caller's subscriptions and their newest deliveries."""
    return AlertsView.model_validate((yield from _json("GET", "/v1/alerts")))


def subscribe(
    on: Sequence[str],
    webhook: Optional[str],
    email: Optional[str],
    slack: bool,
    lab_wide: bool,
) -> Op[SubscriptionView]:
    """``POST /v1/alerts``: to a webhook (``slack``: Slack's body) or a mailbox."""
    if (webhook is None) == (email is None):
        raise ValueError("give one of webhook= or email=")
    if webhook is not None:
        target: Dict[str, Any] = {
            "webhook": {"url": webhook, "format": "slack" if slack else "json"}
        }
    else:
        if slack:
            raise ValueError("slack= is a webhook's format, not a mail's")
        target = {"email": {"to": email}}
    body = {"on": list(on), "target": target, "lab_wide": lab_wide}
    return SubscriptionView.model_validate((yield from _json("POST", "/v1/alerts", None, body)))


def unsubscribe(id: str) -> Op[SubscriptionView]:
    """``POST /v1/alerts/{id}/remove``."""
    path = f"/v1/alerts/{_seg(id)}/remove"
    return SubscriptionView.model_validate((yield from _json("POST", path)))


# ---- changes ----


def cancel(id: str, requeue: bool = False) -> Op[CancelResponse]:
    """An experiment (by id or name), else the job of that id."""
    if not _is_id(str(id)):
        return (yield from cancel_experiment(id, requeue))
    try:
        return (yield from cancel_experiment(id, requeue))
    except NotFoundError:
        return (yield from cancel_job(id, requeue))


def _requeue(requeue: bool) -> Optional[Dict[str, str]]:
    """``?requeue=true``, or no query at all (the plain cancel it always was)."""
    return {"requeue": "true"} if requeue else None


def cancel_experiment(id: str, requeue: bool = False) -> Op[CancelResponse]:
    exp = yield from experiment_id(id)
    path = f"/v1/experiments/{_seg(exp)}/cancel"
    return CancelResponse.model_validate((yield from _json("POST", path, _requeue(requeue))))


def cancel_job(id: str, requeue: bool = False) -> Op[CancelResponse]:
    path = f"/v1/jobs/{_seg(id)}/cancel"
    return CancelResponse.model_validate((yield from _json("POST", path, _requeue(requeue))))


def retry(job_id: str, cascade: bool = False) -> Op[RetryResponse]:
    """``POST /v1/jobs/{id}/retry``; ``cascade``: also the ended jobs of its study that wait
    for it, on down. Without it the request is the plain one it always was (no query)."""
    path = f"/v1/jobs/{_seg(job_id)}/retry"
    params = {"cascade": "true"} if cascade else None
    return RetryResponse.model_validate((yield from _json("POST", path, params)))


def retry_failed(experiment: str) -> Op[RetryFailedResponse]:
    exp = yield from experiment_id(experiment)
    path = f"/v1/experiments/{_seg(exp)}/retry"
    return RetryFailedResponse.model_validate((yield from _json("POST", path)))


def set_plan(node: str, plan: str) -> Op[NodeView]:
    path = f"/v1/nodes/{_seg(node)}/plan"
    return NodeView.model_validate((yield from _json("PUT", path, body={"plan": plan})))


# ---- waiting ----


def wait(
    experiment: Optional[str], bar: bool, timeout: Optional[float], raise_on_failure: bool
) -> Op[Progress]:
    """Until every job (of ``experiment``) has ended, long-polling; ``bar``: a progress bar."""
    deadline = _Deadline(timeout)
    exp = yield from experiment_id_or_all(experiment)
    p = yield from _until_ended(exp, bar, experiment or "all", deadline)
    if raise_on_failure and p.counts.failed:
        raise _failures(exp, p, (yield from job_list(exp, state="failed")))
    return p


def _until_ended(
    exp: Optional[str], bar: bool, label: str, deadline: "_Deadline"
) -> Op[Progress]:
    """The progress of ``exp`` (an id; None: every experiment) once its jobs have ended."""
    shown = _Progress(bar, label)
    try:
        p = yield from progress(exp)
        while True:
            shown.update(p)
            if _finished(p):
                return p
            p = yield from progress(exp, after=p.version, timeout_ms=deadline.hold_ms())
    finally:
        shown.close()


def wait_study(
    study: str,
    experiments: Sequence[Tuple[str, str]],
    bar: bool,
    timeout: Optional[float],
    raise_on_failure: bool,
) -> Op[Progress]:
    """Until every job of each of ``experiments`` (a study's variants: id and name) has
    ended, one experiment after the other within the one ``timeout`` (the API has no
    progress of a study: a study's jobs are its experiments'); their counts added up. With
    ``raise_on_failure``, raises once they all ended, listing every variant's failed jobs."""
    deadline = _Deadline(timeout)
    ended = []
    for exp, name in experiments:
        ended.append((yield from _until_ended(exp, bar, name, deadline)))
    total = _sum_progress(ended)
    if raise_on_failure and total.counts.failed:
        failed: List[JobSummary] = []
        for (exp, _), p in zip(experiments, ended):
            if p.counts.failed:
                failed.extend((yield from job_list(exp, state="failed")))
        raise JobsFailedError(None, {j.id: j.last_failure for j in failed}, total, study=study)
    return total


def study_progress(experiments: Sequence[str]) -> Op[Progress]:
    """The counts of a study's experiments (ids) added up, as one ``Progress``."""
    found = []
    for exp in experiments:
        found.append((yield from progress(exp)))
    return _sum_progress(found)


def _sum_progress(found: Sequence[Progress]) -> Progress:
    """Several experiments' progress as one: counts added, the newest ``version`` (the
    coordinator's one change counter)."""
    names = list(StateCounts.model_fields)
    counts = {n: sum(getattr(p.counts, n) for p in found) for n in names}
    version = max((p.version for p in found), default=0)
    return Progress(version=version, counts=StateCounts(**counts))


def attempt_of(id: str, follow: bool) -> Op[Optional[str]]:
    """The latest attempt of job ``id``, or ``id`` itself when it names an attempt; with
    ``follow``, waits (long-polling) for a job's first attempt."""
    try:
        d = yield from job(id)
    except NotFoundError:
        yield from attempt(id)  # raises NotFoundError when it is neither
        return id
    while not d.attempts_detail:
        if not follow or d.state in ENDED:
            return None
        p = yield from progress(d.experiment)
        yield from progress(d.experiment, after=p.version, timeout_ms=POLL_MS)
        d = yield from job(id)
    return d.attempts_detail[-1].id


def logs(id: str, follow: bool) -> Stream:
    """A job's (latest attempt's) or an attempt's log as text; with ``follow``, until the
    attempt has ended."""
    found = yield from attempt_of(str(id), follow)
    if found is None:
        return
    cursor = _LogCursor(follow)
    done = False
    while not done:
        resp = yield Call("GET", f"/v1/attempts/{_seg(found)}/log", cursor.params())
        if resp is None:
            raise RuntimeError("a request of logs was sent no answer")
        texts, done = cursor.take(resp)
        for text in texts:
            yield text


# ---- helpers ----


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


def _duration(value: Duration) -> str:
    """A duration as the coordinator reads one: a ``timedelta`` in whole seconds (``90s``), or
    milliseconds when it has a fraction of one; a string as given."""
    if isinstance(value, str):
        return value
    ms = round(value.total_seconds() * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


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
            running=c.running,
            queued=c.queued + c.retrying,
            failed=c.failed,
            **({"pruned": c.pruned} if c.pruned else {}),
            refresh=False,
        )
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
