"""``Client`` (sync) and ``AsyncClient`` over the coordinator's REST API (``/v1``): two faces
of one implementation. Each operation is written once, without network I/O, in ``_ops`` (a generator
of the requests it needs); a face sends those requests through its httpx client
(``httpx.Client`` or ``httpx.AsyncClient``) and returns the operation's result, so both make
the same requests and give the same results. What is left here is each method's signature,
its typing overloads and its docstring.

Waiting is long-polling, never sleeping: ``wait`` holds ``/v1/progress?after=VERSION`` open
until the counts change, ``logs(follow=True)`` holds the log route open with ``wait_ms``.

Experiments are named by id or by name (the newest of that name), as the CLI names them: the
API takes ids only, so a name is resolved through ``GET /v1/experiments``."""

from __future__ import annotations

import asyncio
from typing import (
    TYPE_CHECKING,
    AsyncIterator,
    Callable,
    Dict,
    Iterator,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    overload,
)

import httpx

from . import _ops as ops
from ._ops import Call, Duration, Instant, Op, Stream
from ._source import MAX_SNAPSHOT_BYTES, EnvironmentLike, is_local, prepare_submission
from ._spec import MAX_SPEC_VALUES, SpecLike, load_spec
# Names of this module before it was split, still importable from it.
from ._transport import (
    DEFAULT_URL,
    POLL_MS,
    PathLike,
    _check,
    _headers,
    _http_options,
    _unreachable,
    local_token_path,
    read_token_file,
)
from .errors import HeadroomError, SourceError
from .frames import Records, records_or_frame
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
    SubmitResponse,
    SubscriptionView,
    UsageReport,
)

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")

#: The export's formats: ``csv`` (the CLI's ``export --csv``) or ``json``.
ExportFormat = Literal["csv", "json"]
#: How ``usage()`` groups its rows: by ``user`` (the CLI's ``usage --by user``) or by
#: ``experiment``.
UsageBy = Literal["user", "experiment"]


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

    # ---- the driver: an operation's requests through httpx.Client ----

    def _send(self, call: Call) -> httpx.Response:
        try:
            resp = self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                content=call.content,
                headers=call.headers,
            )
        except httpx.TransportError as e:
            raise _unreachable(self.url, e) from e
        return _check(resp)

    def _run(self, op: Op[T]) -> T:
        """Runs an operation: sends each request it yields, and raises an error answer into
        it (it may catch it), until it returns."""
        try:
            call = next(op)
            while True:
                try:
                    resp = self._send(call)
                except HeadroomError as e:
                    call = op.throw(e)
                else:
                    call = op.send(resp)
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            op.close()  # interrupted (Ctrl-C, a cancelled task): its `finally`s run now

    def _stream(self, op: Stream) -> Iterator[str]:
        """``_run`` for an operation that also yields text: the text, as it comes."""
        try:
            item = next(op)
            while True:
                if isinstance(item, str):
                    yield item
                    item = op.send(None)
                    continue
                try:
                    resp = self._send(item)
                except HeadroomError as e:
                    item = op.throw(e)
                else:
                    item = op.send(resp)
        except StopIteration:
            return
        finally:
            op.close()

    # ---- reads and submissions ----

    def health(self) -> Health:
        return self._run(ops.health())

    def submit(
        self,
        spec: SpecLike,
        *,
        seed: Optional[int] = None,
        dry_run: bool = False,
        workdir: Optional[PathLike] = None,
        environment: Optional[EnvironmentLike] = None,
        snapshot: Optional[bool] = None,
        max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
    ) -> "Experiment":
        """Submits a spec (a dict, or the path of a YAML/JSON file) with where its jobs run
        from: ``workdir`` (default: the spec's ``workdir``, relative to the spec file, else
        the current directory), the repository state of that directory (git), the Python
        ``environment`` (``"inherit"``: the activated venv or conda environment, the default
        unless the spec says otherwise; ``"none"``; ``{"venv": PATH}``; ``{"conda": NAME}``),
        and with ``snapshot=True`` (or the spec's ``code: snapshot``) a bundle of the code,
        uploaded first (at most ``max_snapshot_bytes`` compressed; not on a dry run).
        A wrong ``workdir``, ``environment`` or bundle raises ``SourceError`` naming it, and
        nothing is sent.

        A study (a spec with ``experiments:``) returns one handle too: its ``study`` is the
        study's id, ``variants`` maps each variant's name to its experiment's handle, and
        ``wait()``/``progress()`` cover every variant (the other calls are its variants').
        The keywords stand for the study's top-level keys (its defaults); a variant that
        sets ``workdir``, ``environment`` or ``code`` itself runs from its own source."""
        op = ops.submit(
            spec,
            seed,
            dry_run,
            workdir,
            environment,
            snapshot,
            max_snapshot_bytes,
            is_local(self.url),
        )
        resp = self._run(op)
        return Experiment(self, resp.experiment, resp)

    def experiment(self, id: str) -> "Experiment":
        """An experiment by id or by name (the newest of that name)."""
        return Experiment(self, self._run(ops.experiment_id(id)))

    def experiments(self) -> List[ExperimentSummary]:
        """Every experiment, oldest first."""
        return self._run(ops.experiments())

    def progress(
        self,
        experiment: Optional[str] = None,
        *,
        after: Optional[int] = None,
        timeout_ms: Optional[int] = None,
    ) -> Progress:
        return self._run(ops.progress(experiment, after, timeout_ms))

    def job_list(
        self,
        experiment: Optional[str] = None,
        state: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> List[JobSummary]:
        return self._run(ops.job_list(experiment, state, limit))

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
        (``frame=False``); ``created_at`` is a datetime. The same columns whatever the jobs:
        a ``JobSummary``'s fields, each parameter as ``params.NAME`` (after ``run``)."""
        return records_or_frame(self._run(ops.jobs(experiment, state, limit)), frame)

    def job(self, id: str) -> JobDetail:
        return self._run(ops.job(id))

    def attempt(self, id: str) -> AttemptView:
        return self._run(ops.attempt(id))

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
        """One row per attempt (the export's columns: parameters, outcome, peak memory,
        energy...), as a DataFrame when pandas is installed, else as dicts. ``clean_only``
        leaves out contaminated and throttled attempts (as ``headroom export --clean-only``).
        ``started_at`` and ``ended_at`` are datetimes; each parameter is ``params.NAME``."""
        return records_or_frame(self._run(ops.attempts(experiment, clean_only)), frame)

    @overload
    def export(
        self,
        experiment: Optional[str] = ...,
        *,
        clean_only: bool = ...,
        format: Literal["csv"] = ...,
        path: Optional[PathLike] = ...,
    ) -> str: ...

    @overload
    def export(
        self,
        experiment: Optional[str] = ...,
        *,
        clean_only: bool = ...,
        format: Literal["json"],
        path: Optional[PathLike] = ...,
    ) -> Records: ...

    @overload
    def export(
        self,
        experiment: Optional[str] = ...,
        *,
        clean_only: bool = ...,
        format: ExportFormat,
        path: Optional[PathLike] = ...,
    ) -> Union[str, Records]: ...

    def export(
        self,
        experiment: Optional[str] = None,
        *,
        clean_only: bool = False,
        format: ExportFormat = "csv",
        path: Optional[PathLike] = None,
    ) -> Union[str, Records]:
        """The export of ``experiment`` (by id or name; default every experiment's), one row
        per attempt, as the coordinator writes it: ``format="csv"``, the CSV's text (as
        ``headroom export --csv``); ``"json"``, the JSON export's rows (each with its
        parameters in ``params``, times as RFC 3339 text), every page. With ``path``, also
        writes it there (the JSON as ``{"columns": [...], "rows": [...]}``)."""
        return self._run(ops.export(experiment, clean_only, format, path))

    # ---- metrics ----

    def metric_series(self, experiment: str) -> List[AttemptSeries]:
        """What each attempt of ``experiment`` (by id or name) reported of itself: its
        metrics' final values (``finals``), their points (``series``: ``step``, ``t``
        seconds since its start, ``value``), the metric lines ignored, ``early_stop``'s
        decisions (``rungs``), with its job, parameters and state (``live``: still running)."""
        return self._run(ops.metric_series(experiment))

    @overload
    def metrics(self, experiment: str, *, frame: Literal[False]) -> Records: ...

    @overload
    def metrics(self, experiment: str, *, frame: Literal[True, None] = ...) -> pd.DataFrame: ...

    @overload
    def metrics(
        self, experiment: str, *, frame: Optional[bool]
    ) -> Union[pd.DataFrame, Records]: ...

    def metrics(
        self, experiment: str, *, frame: Optional[bool] = None
    ) -> Union[pd.DataFrame, Records]:
        """Learning curves, long-form: one row per point of each attempt's metrics
        (``attempt``, ``job``, ``index``, ``number``, each parameter as ``params.NAME``,
        ``metric``, ``step``, ``t``: seconds since the attempt started, ``value``), as a
        DataFrame when pandas is installed, else as dicts. Final values are ``attempts()``'
        ``metric.NAME`` columns."""
        return records_or_frame(self._run(ops.metrics(experiment)), frame)

    # ---- telemetry ----

    def attempt_telemetry(self, attempt: str, *, limit: Optional[int] = None) -> AttemptTelemetry:
        """The telemetry of an attempt's GPUs over its run (empty before it started): one
        series per GPU, the newest ``limit`` samples of each (default 10,000)."""
        return self._run(ops.attempt_telemetry(attempt, limit))

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
        return self._run(ops.gpu_telemetry(node, gpu, since, until, limit))

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
        return self._run(ops.nodes())

    # ---- usage ----

    def usage(self, since: Duration = "30d", *, by: UsageBy = "user") -> UsageReport:
        """What each user (``by="experiment"``: each experiment) used over the last ``since``
        (``"30d"``, ``"12h"``, or a ``timedelta``), as ``headroom usage``: ``rows`` of GPU-hours,
        GiB-hours of reserved GPU memory, energy, attempts and ended jobs by state; and every
        user's fair-share standing now (``shares``: share, decayed GiB-hours, running jobs,
        lowest ``normalized`` first, whose waiting jobs go first). A ``since`` the coordinator
        cannot read raises ``InvalidError`` naming ``since``."""
        return self._run(ops.usage(since, by))

    def alerts(self) -> AlertsView:
        """Your alert subscriptions (an admin's: every one) and their newest deliveries,
        dead letters first, as ``headroom alerts``."""
        return self._run(ops.alerts())

    def subscribe(
        self,
        on: Sequence[str],
        *,
        webhook: Optional[str] = None,
        email: Optional[str] = None,
        slack: bool = False,
        lab_wide: bool = False,
    ) -> SubscriptionView:
        """Subscribes to alerts (``on``: ``experiment-ended``, ``failures-in-a-row``,
        ``gpu-quarantined``, ``gpu-drift``, ``node-lost``, ``job-pending``, ``job-pruned``,
        ``job-preempted``) sent to ``webhook`` (headroom's JSON, or Slack's body with
        ``slack=True``; its host one the coordinator allows) or mailed to ``email``. A refused
        target raises ``InvalidError`` naming ``target.webhook.url`` or ``target.email.to``."""
        return self._run(ops.subscribe(on, webhook, email, slack, lab_wide))

    def unsubscribe(self, id: str) -> SubscriptionView:
        """Removes a subscription (yours, or any for an admin) with its deliveries."""
        return self._run(ops.unsubscribe(id))

    # ---- changes ----

    def cancel(self, id: str, *, requeue: bool = False) -> CancelResponse:
        """Cancels an experiment (every unfinished job; by id or name) or a single job. With
        ``requeue``, nothing is cancelled: the running jobs are stopped after their
        ``checkpoint`` signal and run again, spending no attempt (``requeued`` counts them)."""
        return self._run(ops.cancel(id, requeue))

    def cancel_experiment(self, id: str, *, requeue: bool = False) -> CancelResponse:
        """Cancels every unfinished job of an experiment (by id or name); ``requeue``: as
        ``cancel``."""
        return self._run(ops.cancel_experiment(id, requeue))

    def cancel_job(self, id: str, *, requeue: bool = False) -> CancelResponse:
        return self._run(ops.cancel_job(id, requeue))

    def retry(self, job_id: str, *, cascade: bool = False) -> RetryResponse:
        """Runs an ended job once more. With ``cascade``, also the jobs of its study that
        wait for it (``after``), and those waiting for them, on down, that have ended (a
        failed ``train`` job cancelled its ``eval`` jobs: both run again, in order); the
        answer's ``retried`` lists every job that runs again."""
        return self._run(ops.retry(job_id, cascade))

    def retry_failed(self, experiment: str) -> RetryFailedResponse:
        """Gives every failed job of an experiment (by id or name) one more attempt; the
        answer lists the jobs retried."""
        return self._run(ops.retry_failed(experiment))

    def set_plan(self, node: str, plan: str) -> NodeView:
        """Sets a node's concurrency plan, slots per GPU: ``"2,2,1"``."""
        return self._run(ops.set_plan(node, plan))

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
        return self._run(ops.wait(experiment, progress, timeout, raise_on_failure))

    def logs(self, id: str, *, follow: bool = False) -> Iterator[str]:
        """A job's (latest attempt's) or an attempt's log as text chunks; with ``follow``,
        until the attempt has ended."""
        yield from self._stream(ops.logs(id, follow))


class _ExperimentBase:
    """What both faces' experiments share: the id (or the name, resolved at the first call
    that needs it) and the operations on it."""

    def __init__(
        self,
        id: Optional[str],
        submitted: Optional[SubmitResponse] = None,
        *,
        name: Optional[str] = None,
    ) -> None:
        self.id = id
        #: What the submission answered (jobs, seed, warnings; the preview of a dry run; a
        #: study's ``variants``).
        self.submitted = submitted
        #: The study's id, when this handle is a submitted study (then ``id`` is None and
        #: ``variants`` holds its experiments); None otherwise.
        self.study: Optional[str] = submitted.study if submitted is not None else None
        self._name = name

    def __repr__(self) -> str:
        if self.study is not None:
            return f"{type(self).__name__}(study={self.study!r})"
        return f"{type(self).__name__}({self.id or self._name!r})"

    def _variant_ids(self) -> List[Tuple[str, str]]:
        """A study's experiments (id, name), in the file's order."""
        found = self.submitted.variants if self.submitted is not None else []
        return [(v.experiment, v.name) for v in found if v.experiment is not None]

    def _need_id(self) -> Op[str]:
        if self.id is not None:
            return self.id
        if self.study is not None:
            names = ", ".join(name for _, name in self._variant_ids())
            raise ValueError(
                f"a study is several experiments ({names}): ask one of them, "
                "`.variants[NAME]`; `wait()` and `progress()` take them all"
            )
        if self._name is None:
            raise ValueError("a dry run stores nothing: there is no experiment")
        found = yield from ops.experiment_id(self._name)
        self.id = found
        return found

    def _progress(self) -> Op[Progress]:
        """``progress()``: a study's is its experiments' counts added up."""
        if self.study is not None:
            return ops.study_progress([exp for exp, _ in self._variant_ids()])
        return self._on(ops.progress)

    def _wait(
        self, bar: bool, timeout: Optional[float], raise_on_failure: bool
    ) -> Op[Progress]:
        """``wait()``: a study waits for each of its experiments in turn."""
        if self.study is not None:
            return ops.wait_study(
                self.study, self._variant_ids(), bar, timeout, raise_on_failure
            )
        return self._on(lambda exp: ops.wait(exp, bar, timeout, raise_on_failure))

    def _on(self, make: Callable[[str], Op[T]]) -> Op[T]:
        """``make``'s operation on this experiment's id."""
        exp = yield from self._need_id()
        return (yield from make(exp))


class Experiment(_ExperimentBase):
    """A submitted experiment: ``wait``, ``jobs``, ``attempts``, ``metrics``, ``cancel``,
    ``retry_failed``, ``export``. A submitted study is one too: ``study`` is its id,
    ``variants`` its experiments' handles by variant name, and ``wait``/``progress`` cover
    them all."""

    def __init__(
        self,
        client: Client,
        id: Optional[str],
        submitted: Optional[SubmitResponse] = None,
        *,
        name: Optional[str] = None,
    ) -> None:
        super().__init__(id, submitted, name=name)
        self.client = client
        #: A study's experiments by variant name (``train``), in the file's order; empty for
        #: one experiment. A dry run's hold no experiment.
        self.variants: Dict[str, Experiment] = {
            v.variant: Experiment(client, v.experiment)
            for v in (submitted.variants if submitted is not None else [])
        }

    def summary(self) -> ExperimentSummary:
        return self.client._run(self._on(ops.experiment_summary))

    def progress(self) -> Progress:
        """Its jobs' counts (a study's: every variant's, added up)."""
        return self.client._run(self._progress())

    def wait(
        self,
        progress: bool = False,
        timeout: Optional[float] = None,
        *,
        raise_on_failure: bool = False,
    ) -> Progress:
        """``Client.wait`` for this experiment; for a study, every variant's jobs, one
        experiment after the other (a bar each), their counts added up, and with
        ``raise_on_failure`` one ``JobsFailedError`` (``study`` set) for all of them. Jobs
        that ``on_failure: wait`` holds have not ended: only a retry of the job they wait
        for, or ``timeout``, ends the wait."""
        return self.client._run(self._wait(progress, timeout, raise_on_failure))

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
        table = self.client._run(self._on(lambda exp: ops.jobs(exp, state, None)))
        return records_or_frame(table, frame)

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
        table = self.client._run(self._on(lambda exp: ops.attempts(exp, clean_only)))
        return records_or_frame(table, frame)

    @overload
    def export(
        self,
        *,
        clean_only: bool = ...,
        format: Literal["csv"] = ...,
        path: Optional[PathLike] = ...,
    ) -> str: ...

    @overload
    def export(
        self, *, clean_only: bool = ..., format: Literal["json"], path: Optional[PathLike] = ...
    ) -> Records: ...

    @overload
    def export(
        self, *, clean_only: bool = ..., format: ExportFormat, path: Optional[PathLike] = ...
    ) -> Union[str, Records]: ...

    def export(
        self,
        *,
        clean_only: bool = False,
        format: ExportFormat = "csv",
        path: Optional[PathLike] = None,
    ) -> Union[str, Records]:
        """``Client.export`` of this experiment."""
        return self.client._run(self._on(lambda exp: ops.export(exp, clean_only, format, path)))

    def metric_series(self) -> List[AttemptSeries]:
        """``Client.metric_series`` of this experiment."""
        return self.client._run(self._on(ops.metric_series))

    @overload
    def metrics(self, *, frame: Literal[False]) -> Records: ...

    @overload
    def metrics(self, *, frame: Literal[True, None] = ...) -> pd.DataFrame: ...

    @overload
    def metrics(self, *, frame: Optional[bool]) -> Union[pd.DataFrame, Records]: ...

    def metrics(self, *, frame: Optional[bool] = None) -> Union[pd.DataFrame, Records]:
        """``Client.metrics`` of this experiment: one row per point of each attempt's
        metrics."""
        return records_or_frame(self.client._run(self._on(ops.metrics)), frame)

    def cancel(self, *, requeue: bool = False) -> CancelResponse:
        """Cancels its unfinished jobs; ``requeue``: requeues its running ones instead."""
        return self.client._run(self._on(lambda exp: ops.cancel_experiment(exp, requeue)))

    def retry_failed(self) -> RetryFailedResponse:
        """Gives every failed job of the experiment one more attempt."""
        return self.client._run(self._on(ops.retry_failed))


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

    # ---- the driver: an operation's requests through httpx.AsyncClient ----

    async def _send(self, call: Call) -> httpx.Response:
        try:
            resp = await self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                content=call.content,
                headers=call.headers,
            )
        except httpx.TransportError as e:
            raise _unreachable(self.url, e) from e
        return _check(resp)

    async def _run(self, op: Op[T]) -> T:
        """``Client._run``, awaiting each answer."""
        try:
            call = next(op)
            while True:
                try:
                    resp = await self._send(call)
                except HeadroomError as e:
                    call = op.throw(e)
                else:
                    call = op.send(resp)
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            op.close()  # interrupted (Ctrl-C, a cancelled task): its `finally`s run now

    async def _stream(self, op: Stream) -> AsyncIterator[str]:
        """``Client._stream``, awaiting each answer."""
        try:
            item = next(op)
            while True:
                if isinstance(item, str):
                    yield item
                    item = op.send(None)
                    continue
                try:
                    resp = await self._send(item)
                except HeadroomError as e:
                    item = op.throw(e)
                else:
                    item = op.send(resp)
        except StopIteration:
            return
        finally:
            op.close()

    async def health(self) -> Health:
        return await self._run(ops.health())

    async def submit(
        self,
        spec: SpecLike,
        *,
        seed: Optional[int] = None,
        dry_run: bool = False,
        workdir: Optional[PathLike] = None,
        environment: Optional[EnvironmentLike] = None,
        snapshot: Optional[bool] = None,
        max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
    ) -> "AsyncExperiment":
        """Submits a spec (a dict, or the path of a YAML/JSON file) with where its jobs run
        from: ``workdir`` (default: the spec's ``workdir``, relative to the spec file, else
        the current directory), the repository state of that directory (git), the Python
        ``environment`` (``"inherit"``: the activated venv or conda environment, the default
        unless the spec says otherwise; ``"none"``; ``{"venv": PATH}``; ``{"conda": NAME}``),
        and with ``snapshot=True`` (or the spec's ``code: snapshot``) a bundle of the code,
        uploaded first (at most ``max_snapshot_bytes`` compressed; not on a dry run).
        A wrong ``workdir``, ``environment`` or bundle raises ``SourceError`` naming it, and
        nothing is sent. A study returns one handle, as ``Client.submit`` says."""
        # Git and the bundle's files are read in a thread: the event loop goes on meanwhile.
        prepared = await asyncio.to_thread(
            prepare_submission,
            spec,
            seed=seed,
            dry_run=dry_run,
            workdir=workdir,
            environment=environment,
            snapshot=snapshot,
            max_snapshot_bytes=max_snapshot_bytes,
        )
        resp = await self._run(ops.submit_prepared(prepared, is_local(self.url)))
        return AsyncExperiment(self, resp.experiment, resp)

    def experiment(self, id: str) -> "AsyncExperiment":
        """An experiment by id, or by name (resolved, to the newest of that name, at its
        first call)."""
        given = str(id)
        if ops._is_id(given):
            return AsyncExperiment(self, given)
        return AsyncExperiment(self, None, name=given)

    async def experiments(self) -> List[ExperimentSummary]:
        """Every experiment, oldest first."""
        return await self._run(ops.experiments())

    async def progress(
        self,
        experiment: Optional[str] = None,
        *,
        after: Optional[int] = None,
        timeout_ms: Optional[int] = None,
    ) -> Progress:
        return await self._run(ops.progress(experiment, after, timeout_ms))

    async def job_list(
        self,
        experiment: Optional[str] = None,
        state: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> List[JobSummary]:
        return await self._run(ops.job_list(experiment, state, limit))

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
        """``Client.jobs``."""
        return records_or_frame(await self._run(ops.jobs(experiment, state, limit)), frame)

    async def job(self, id: str) -> JobDetail:
        return await self._run(ops.job(id))

    async def attempt(self, id: str) -> AttemptView:
        return await self._run(ops.attempt(id))

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
        """``Client.attempts``."""
        return records_or_frame(await self._run(ops.attempts(experiment, clean_only)), frame)

    @overload
    async def export(
        self,
        experiment: Optional[str] = ...,
        *,
        clean_only: bool = ...,
        format: Literal["csv"] = ...,
        path: Optional[PathLike] = ...,
    ) -> str: ...

    @overload
    async def export(
        self,
        experiment: Optional[str] = ...,
        *,
        clean_only: bool = ...,
        format: Literal["json"],
        path: Optional[PathLike] = ...,
    ) -> Records: ...

    @overload
    async def export(
        self,
        experiment: Optional[str] = ...,
        *,
        clean_only: bool = ...,
        format: ExportFormat,
        path: Optional[PathLike] = ...,
    ) -> Union[str, Records]: ...

    async def export(
        self,
        experiment: Optional[str] = None,
        *,
        clean_only: bool = False,
        format: ExportFormat = "csv",
        path: Optional[PathLike] = None,
    ) -> Union[str, Records]:
        """``Client.export``."""
        return await self._run(ops.export(experiment, clean_only, format, path))

    async def metric_series(self, experiment: str) -> List[AttemptSeries]:
        """``Client.metric_series``."""
        return await self._run(ops.metric_series(experiment))

    @overload
    async def metrics(self, experiment: str, *, frame: Literal[False]) -> Records: ...

    @overload
    async def metrics(
        self, experiment: str, *, frame: Literal[True, None] = ...
    ) -> pd.DataFrame: ...

    @overload
    async def metrics(
        self, experiment: str, *, frame: Optional[bool]
    ) -> Union[pd.DataFrame, Records]: ...

    async def metrics(
        self, experiment: str, *, frame: Optional[bool] = None
    ) -> Union[pd.DataFrame, Records]:
        """``Client.metrics``."""
        return records_or_frame(await self._run(ops.metrics(experiment)), frame)

    async def attempt_telemetry(
        self, attempt: str, *, limit: Optional[int] = None
    ) -> AttemptTelemetry:
        return await self._run(ops.attempt_telemetry(attempt, limit))

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
        return await self._run(ops.gpu_telemetry(node, gpu, since, until, limit))

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
        return await self._run(ops.nodes())

    async def usage(self, since: Duration = "30d", *, by: UsageBy = "user") -> UsageReport:
        """``Client.usage``."""
        return await self._run(ops.usage(since, by))

    async def alerts(self) -> AlertsView:
        """``Client.alerts``."""
        return await self._run(ops.alerts())

    async def subscribe(
        self,
        on: Sequence[str],
        *,
        webhook: Optional[str] = None,
        email: Optional[str] = None,
        slack: bool = False,
        lab_wide: bool = False,
    ) -> SubscriptionView:
        """``Client.subscribe``."""
        return await self._run(ops.subscribe(on, webhook, email, slack, lab_wide))

    async def unsubscribe(self, id: str) -> SubscriptionView:
        """``Client.unsubscribe``."""
        return await self._run(ops.unsubscribe(id))

    async def cancel(self, id: str, *, requeue: bool = False) -> CancelResponse:
        """``Client.cancel``."""
        return await self._run(ops.cancel(id, requeue))

    async def cancel_experiment(self, id: str, *, requeue: bool = False) -> CancelResponse:
        return await self._run(ops.cancel_experiment(id, requeue))

    async def cancel_job(self, id: str, *, requeue: bool = False) -> CancelResponse:
        return await self._run(ops.cancel_job(id, requeue))

    async def retry(self, job_id: str, *, cascade: bool = False) -> RetryResponse:
        """``Client.retry``: ``cascade`` also runs again the ended jobs of its study that
        wait for it, on down."""
        return await self._run(ops.retry(job_id, cascade))

    async def retry_failed(self, experiment: str) -> RetryFailedResponse:
        """``Client.retry_failed``."""
        return await self._run(ops.retry_failed(experiment))

    async def set_plan(self, node: str, plan: str) -> NodeView:
        return await self._run(ops.set_plan(node, plan))

    async def wait(
        self,
        experiment: Optional[str] = None,
        *,
        progress: bool = False,
        timeout: Optional[float] = None,
        raise_on_failure: bool = False,
    ) -> Progress:
        return await self._run(ops.wait(experiment, progress, timeout, raise_on_failure))

    async def logs(self, id: str, *, follow: bool = False) -> AsyncIterator[str]:
        async for text in self._stream(ops.logs(id, follow)):
            yield text


class AsyncExperiment(_ExperimentBase):
    """A submitted experiment (or study, as ``Experiment``) of ``AsyncClient``; one named by
    name is resolved at its first call."""

    def __init__(
        self,
        client: AsyncClient,
        id: Optional[str],
        submitted: Optional[SubmitResponse] = None,
        *,
        name: Optional[str] = None,
    ) -> None:
        super().__init__(id, submitted, name=name)
        self.client = client
        #: ``Experiment.variants``: a study's experiments by variant name.
        self.variants: Dict[str, AsyncExperiment] = {
            v.variant: AsyncExperiment(client, v.experiment)
            for v in (submitted.variants if submitted is not None else [])
        }

    async def summary(self) -> ExperimentSummary:
        return await self.client._run(self._on(ops.experiment_summary))

    async def progress(self) -> Progress:
        """``Experiment.progress``."""
        return await self.client._run(self._progress())

    async def wait(
        self,
        progress: bool = False,
        timeout: Optional[float] = None,
        *,
        raise_on_failure: bool = False,
    ) -> Progress:
        """``Experiment.wait``."""
        return await self.client._run(self._wait(progress, timeout, raise_on_failure))

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
        table = await self.client._run(self._on(lambda exp: ops.jobs(exp, state, None)))
        return records_or_frame(table, frame)

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
        table = await self.client._run(self._on(lambda exp: ops.attempts(exp, clean_only)))
        return records_or_frame(table, frame)

    @overload
    async def export(
        self,
        *,
        clean_only: bool = ...,
        format: Literal["csv"] = ...,
        path: Optional[PathLike] = ...,
    ) -> str: ...

    @overload
    async def export(
        self, *, clean_only: bool = ..., format: Literal["json"], path: Optional[PathLike] = ...
    ) -> Records: ...

    @overload
    async def export(
        self, *, clean_only: bool = ..., format: ExportFormat, path: Optional[PathLike] = ...
    ) -> Union[str, Records]: ...

    async def export(
        self,
        *,
        clean_only: bool = False,
        format: ExportFormat = "csv",
        path: Optional[PathLike] = None,
    ) -> Union[str, Records]:
        """``AsyncClient.export`` of this experiment."""
        return await self.client._run(
            self._on(lambda exp: ops.export(exp, clean_only, format, path))
        )

    async def metric_series(self) -> List[AttemptSeries]:
        """``Client.metric_series`` of this experiment."""
        return await self.client._run(self._on(ops.metric_series))

    @overload
    async def metrics(self, *, frame: Literal[False]) -> Records: ...

    @overload
    async def metrics(self, *, frame: Literal[True, None] = ...) -> pd.DataFrame: ...

    @overload
    async def metrics(self, *, frame: Optional[bool]) -> Union[pd.DataFrame, Records]: ...

    async def metrics(self, *, frame: Optional[bool] = None) -> Union[pd.DataFrame, Records]:
        """``Client.metrics`` of this experiment."""
        return records_or_frame(await self.client._run(self._on(ops.metrics)), frame)

    async def cancel(self, *, requeue: bool = False) -> CancelResponse:
        return await self.client._run(self._on(lambda exp: ops.cancel_experiment(exp, requeue)))

    async def retry_failed(self) -> RetryFailedResponse:
        """Gives every failed job of the experiment one more attempt."""
        return await self.client._run(self._on(ops.retry_failed))


__all__ = [
    "AsyncClient",
    "AsyncExperiment",
    "Client",
    "Duration",
    "Experiment",
    "HeadroomError",
    "Instant",
    "Records",
    "SourceError",
    "UsageBy",
    "load_spec",
    "local_token_path",
    "read_token_file",
]
