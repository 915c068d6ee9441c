"""The API's answers as pydantic models. Each names the OpenAPI component it mirrors
(``__schema__``); a test checks field names and required-ness against the served document,
so a change on either side fails. Unknown fields from a newer server are kept, not refused."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional

from pydantic import BaseModel, ConfigDict, Field

from .frames import telemetry_frame

if TYPE_CHECKING:
    import pandas as pd


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")
    __schema__: ClassVar[str] = ""


class ErrorDetail(_Model):
    __schema__ = "ErrorDetail"
    code: str
    message: str
    field: Optional[str] = None
    attempt: Optional[str] = None


class Health(_Model):
    __schema__ = "Health"
    status: str
    schema_version: int


class StateCounts(_Model):
    __schema__ = "StateCounts"
    queued: int
    leased: int
    running: int
    retrying: int
    succeeded: int
    failed: int
    cancelled: int
    #: Stopped by ``early_stop`` (ended, not failed; 0 from a coordinator without it).
    pruned: int = 0

    @property
    def total(self) -> int:
        return (
            self.queued
            + self.leased
            + self.running
            + self.retrying
            + self.succeeded
            + self.failed
            + self.cancelled
            + self.pruned
        )

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed + self.cancelled + self.pruned


class Progress(_Model):
    __schema__ = "Progress"
    version: int
    counts: StateCounts


class ExpandedJob(_Model):
    __schema__ = "ExpandedJob"
    index: int
    config: int
    run: int
    params: Dict[str, Any]
    argv: List[str]
    background: Optional[Dict[str, Any]] = None


class SubmittedVariant(_Model):
    """One variant of a submitted study: its name in the study (``variant``: ``train``), its
    experiment's name (``STUDY.VARIANT``) and id (None on a dry run), its job count and seed,
    GPUs per job, the declared memory per GPU (``"8GiB"``; None: learned), the parameters
    its estimate is learned by (``memory_key``), the variants it waits for (``after``), and
    how long one of its runs is expected to take (``expected_ms``), by which the study is
    queued longest first, with where that comes from (``expected_from``: ``declared`` or
    ``learned``)."""

    __schema__ = "SubmittedVariant"
    variant: str
    name: str
    experiment: Optional[str] = None
    jobs: int
    seed: int
    gpus: int
    memory: Optional[str] = None
    memory_key: List[str] = []
    after: List[str] = []
    expected_ms: Optional[int] = None
    expected_from: Optional[str] = None


class GroupPreview(_Model):
    """One experiment's (or variant's) share of a dry run's schedule: its jobs, how many run
    at once, its largest estimate per GPU (MiB) and where it comes from (``declared``,
    ``learned`` or ``none``), jobs that never fit and why, where the plans' slots promise
    sharing its estimates do not allow (``cannot_share``, in words), and whether its jobs
    need no GPU (``cpu_only``: they take CPU slots)."""

    __schema__ = "GroupPreview"
    group: str
    jobs: int
    at_once: int
    estimate_mib: Optional[int] = None
    estimate_from: str
    never_fit: int
    never_fit_reasons: List[str]
    cannot_share: Optional[str] = None
    cpu_only: bool = False


class SchedulePreview(_Model):
    """A dry run's schedule on the live nodes through the coordinator's placement: the plans'
    slots, the jobs that run at once, those that never fit, per experiment, and the expected
    makespan (seconds; None while some job's run time is unknown: ``unknown_durations``)."""

    __schema__ = "SchedulePreview"
    slots: int
    at_once: int
    never_fit: int
    groups: List[GroupPreview]
    makespan_s: Optional[float] = None
    unknown_durations: int
    #: More jobs than a dry run simulates: no makespan.
    too_many_to_simulate: bool = False


class SubmitResponse(_Model):
    """What a submission stored: one experiment (``experiment``, its id; None on a dry run),
    or a study's experiments (``study``, its id, with ``experiment`` None; ``variants``, one
    per variant in the file's order, also on a dry run). ``name``, ``seed`` and ``jobs`` are
    the study's for a study (its jobs: every variant's)."""

    __schema__ = "SubmitResponse"
    experiment: Optional[str] = None
    name: str
    seed: int
    jobs: int
    dry_run: bool
    preview: Optional[List[ExpandedJob]] = None
    #: How many jobs of a dry run ``preview`` leaves out (it shows the first 1,000).
    preview_omitted: int = 0
    warnings: List[str] = []
    #: A study's id (None for one experiment or a dry run).
    study: Optional[str] = None
    #: A study's variants (empty for one experiment).
    variants: List[SubmittedVariant] = []
    #: A dry run's schedule on the live nodes (None when stored).
    schedule: Optional[SchedulePreview] = None


class GitState(_Model):
    """The repository state of an experiment's working directory at submit: ``commit``,
    ``branch`` (None: a detached HEAD), ``dirty`` and ``diff_hash`` (SHA-256 of the
    uncommitted changes; None when clean)."""

    __schema__ = "GitState"
    commit: str
    branch: Optional[str] = None
    dirty: bool
    diff_hash: Optional[str] = None


class Snapshot(_Model):
    """The code bundle an experiment's jobs run from (``code: snapshot``): its SHA-256, the
    working directory within it (``""``: its root) and its size."""

    __schema__ = "Snapshot"
    hash: str
    subdir: str = ""
    bytes: int = 0


class Environment(_Model):
    """A Python environment the jobs run with: a venv's directory, or a conda environment's
    name or prefix (one of the two is set)."""

    venv: Optional[str] = None
    conda: Optional[str] = None


class Source(_Model):
    """Where an experiment's jobs run from: the directory (``workdir``), the code's state
    (``git``; ``snapshot`` when they run from a bundle) and the Python ``environment``, with
    whence it came (``environment_from``: ``spec`` or ``submitter``)."""

    __schema__ = "Source"
    workdir: Optional[str] = None
    git: Optional[GitState] = None
    snapshot: Optional[Snapshot] = None
    environment: Optional[Environment] = None
    environment_from: Optional[str] = None


class StudyRef(_Model):
    """The study an experiment was submitted in: its id and name."""

    __schema__ = "StudyRef"
    id: str
    name: str


class ExperimentSummary(_Model):
    __schema__ = "ExperimentSummary"
    id: str
    name: str
    seed: int
    created_at: datetime
    counts: StateCounts
    submitted_by: str = "anonymous"
    #: Where its jobs run from (None: a coordinator that records none).
    source: Optional[Source] = None
    #: The study it was submitted in (None: submitted alone).
    study: Optional[StudyRef] = None


class JobSummary(_Model):
    __schema__ = "JobSummary"
    id: str
    experiment: str
    experiment_name: str
    index: int
    config: int
    run: int
    state: str
    priority: int
    params: Dict[str, Any]
    attempts: int
    max_attempts: int
    gpus: int
    estimate_mib: Optional[int] = None
    node: Optional[str] = None
    gpu_indices: List[int]
    last_failure: Optional[str] = None
    created_at: datetime
    submitted_by: str = "anonymous"
    #: Why it waits, as the API gives it: ``{"reason": KIND, ...}``; e.g. a study's
    #: ``{"reason": "waits_for", "experiment": ..., "jobs": N, "when": "succeeded" or
    #: "ended", "ended_otherwise": N}`` (``ended_otherwise``: how many of those ended
    #: otherwise; ``retry(THAT_JOB, cascade=True)`` runs one again, and the jobs waiting).
    #: Held back by its user's cap: ``{"reason": "user_cap", "user": ..., "cap": "jobs",
    #: "gpus" or "gpu_memory", "limit": N, "held": N}`` (memory in MiB); by fair share:
    #: ``{"reason": "fair_share", "user": ..., "used_mib_h": N, "share": N, "ahead": USER,
    #: "ahead_used_mib_h": N, "ahead_share": N}`` (``ahead``'s jobs go first; ``usage()``).
    pending_reason: Optional[Dict[str, Any]] = None


class CounterWindow(_Model):
    """One GPU's total-energy counter at an attempt's first and last readings (``from_`` is
    the API's ``from``)."""

    __schema__ = "CounterWindow"
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    gpu: int
    from_: datetime = Field(alias="from")
    to: datetime
    from_j: float
    to_j: float
    #: The attempt's processes' mean share of the GPU's SM time, percent (None: not given).
    util_pct: Optional[float] = None


class Phases(_Model):
    """A run's GPU memory over time: its steady use, where its peak falls (shares of the
    run, ``peak_from`` to ``peak_until``), its length, and by how much (thousandths of its
    length, ``margin_permille``) its timing is taken to be off when it is placed: a tenth
    for declared phases, its runs' own spread for learned ones."""

    __schema__ = "Phases"
    steady_mib: int
    peak_from: float
    peak_until: float
    expected_ms: int
    # Coordinators before this field sent none: a tenth, as they placed by.
    margin_permille: int = 100


class Sharing(_Model):
    """An attempt that ran beside others on one of its GPUs: for how much of its run
    (``overlap``, 0 to 1), with whom (``with_``, the API's ``with``), and its apportioned
    energy (an estimate by ``share_method``)."""

    __schema__ = "Sharing"
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    overlap: float
    with_: List[str] = Field(alias="with")
    energy_share_j: Optional[float] = None
    share_method: str


class Point(_Model):
    """A value of a metric: its ``step``, when (``t``, seconds since the job started) and
    the ``value``."""

    __schema__ = "Point"
    step: int
    t: float
    value: float


class RungDecision(_Model):
    """``early_stop``'s decision for an attempt at a rung (step ``step``): its ``value``
    there, the ``cutoff`` it had to reach (at least for ``mode: max``, at most for ``min``;
    None when stopped before more than ``bootstrap_count`` attempts reached the rung), how
    many attempts' values it was compared with (``competitors``, its own included), and
    whether it was stopped (``pruned``)."""

    __schema__ = "RungDecision"
    rung: int
    step: int
    value: float
    cutoff: Optional[float] = None
    competitors: int
    pruned: bool


class AttemptSeries(_Model):
    """One attempt's metrics (``GET /v1/experiments/{id}/metrics``): its job (``job``, its
    ``index`` in the experiment), its ``number`` (1: the first attempt), the parameters it ran
    with, its job's ``state`` now, whether it still runs (``live``: its series grow), each
    metric's final value (``finals``) and points (``series``, oldest first), the metric lines
    it printed that were ignored (``ignored``) and ``early_stop``'s decisions (``rungs``)."""

    __schema__ = "AttemptSeries"
    attempt: str
    job: str
    index: int
    number: int
    params: Dict[str, Any]
    state: str
    live: bool
    finals: Dict[str, float]
    series: Dict[str, List[Point]]
    ignored: int
    rungs: List[RungDecision] = []


class AttemptView(_Model):
    __schema__ = "AttemptView"
    id: str
    job: str
    number: int
    node: str
    gpus: List[int]
    fence: int
    phase: str
    leased_at: datetime
    started_at: Optional[datetime] = None
    ended_at: Optional[datetime] = None
    pid: Optional[int] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    failure_class: Optional[str] = None
    success: Optional[bool] = None
    estimate_mib: Optional[int] = None
    peak_mem_mib: Optional[int] = None
    peak_source: Optional[str] = None
    cleanup_ms: Optional[int] = None
    cleanup_verified: Optional[bool] = None
    log_tail: Optional[str] = None
    estimate_source: str = ""
    params: Dict[str, Any] = {}
    ladder_step: int = 0
    contaminated: Optional[bool] = None
    submitted_by: str = "anonymous"
    # What the attempt's supervisor measured over the run (None: not measured).
    energy_j: Optional[float] = None
    energy_source: Optional[str] = None
    mean_power_w: Optional[float] = None
    max_power_w: Optional[float] = None
    max_temp_c: Optional[float] = None
    start_temp_c: Optional[float] = None
    mean_util_pct: Optional[float] = None
    throttled_thermal: Optional[bool] = None
    throttled_power: Optional[bool] = None
    throttle_reasons: Optional[List[str]] = None
    contamination_reason: Optional[str] = None
    contamination_pid: Optional[int] = None
    contamination_command: Optional[str] = None
    #: How long after the job's exec its figures begin (ms; 0: read before the exec).
    first_reading_ms: Optional[int] = None
    #: The figures cover the job's whole run (False: they begin late or could not be read).
    covers_run: Optional[bool] = None
    #: Each GPU's energy counter at the run's first and last readings.
    counters: List[CounterWindow] = []
    #: Memory no listed process held on one of its GPUs during the run, beyond what there
    #: was before it (MiB): "ghost" memory; None: none seen.
    ghost_mib: Optional[int] = None
    #: The run's memory over time fitted as phases, when it ended well and its peak stood
    #: out: what its configuration's next runs are placed by.
    memory_profile: Optional[Phases] = None
    #: Another attempt ran on one of its GPUs during its run; ``sharing`` says with whom.
    shared: bool = False
    sharing: Optional[Sharing] = None
    waiting: Optional[str] = None
    exclusive_wait_ms: Optional[int] = None
    cooldown_wait_ms: Optional[int] = None
    cooldown_from_temp_c: Optional[float] = None
    cooldown_start_temp_c: Optional[float] = None
    cooldown_timed_out: Optional[bool] = None
    # The colocated background's record (None: the attempt ran alone).
    background_pid: Optional[int] = None
    background_ready_ms: Optional[int] = None
    background_exit_code: Optional[int] = None
    background_signal: Optional[int] = None
    background_exited_early: Optional[bool] = None
    # Highest host RAM of the attempt's processes together (MiB), from its cgroup.
    host_peak_mib: Optional[int] = None
    #: The hard GPU memory limit it ran under (MiB on each GPU), where the node sets one.
    memory_cap_mib: Optional[int] = None
    #: Why it ran out of GPU memory: ``cap_hit`` (past its own limit or estimate), or
    #: ``neighbour_grew`` (a neighbour on its GPU grew past its estimate: ``oom_neighbour``,
    #: that attempt's id).
    oom_cause: Optional[str] = None
    oom_neighbour: Optional[str] = None
    #: What the run reported of itself (the spec's ``metrics``, ``HEADROOM_METRIC`` lines):
    #: each metric's final value; a metric never reported is absent, never 0.
    metrics: Dict[str, float] = {}
    #: Metric lines it printed that were ignored (malformed, no finite number, too many
    #: names); None: none.
    metrics_ignored: Optional[int] = None
    #: ``early_stop``'s decision at each rung it reached.
    rungs: List[RungDecision] = []
    #: Where its results went (``tracking``): ``mlflow run RUN_ID``, or why not
    #: (``mlflow unreachable: ...``); None: no tracking, or not yet.
    tracking: Optional[str] = None


class JobDetail(JobSummary):
    __schema__ = "JobDetail"
    argv: List[str]
    env: Dict[str, str]
    profile: str
    timeout_ms: Optional[int] = None
    retry_on: List[str]
    memory_key: str
    oom_ladder: List[Dict[str, Any]]
    ladder_step: int
    attempts_detail: List[AttemptView]
    prestart: Optional[Dict[str, Any]] = None
    #: Why the job starts at its ladder step: another run of its configuration fit only there.
    ladder_from: Optional[str] = None


class CancelResponse(_Model):
    __schema__ = "CancelResponse"
    cancelled: int
    #: With ``requeue=True``: running jobs asked to stop after their checkpoint signal and
    #: run again (none cancelled).
    requeued: int = 0


class RetryResponse(_Model):
    """``retry``: the job's state now, and with ``cascade`` the ids of the jobs that run
    again (the job and the ended jobs of its study that wait for it, on down)."""

    __schema__ = "RetryResponse"
    state: str
    retried: List[str] = []


class RetryFailedResponse(_Model):
    """``retry_failed``: the experiment's id, and the ids of the failed jobs given one more
    attempt (empty: none had failed)."""

    __schema__ = "RetryFailedResponse"
    experiment: str
    retried: List[str]


class GpuProcess(_Model):
    __schema__ = "GpuProcess"
    pid: int
    used_mib: int
    attempt: Optional[str] = None
    user: Optional[str] = None
    command: Optional[str] = None
    used_mib_unknown: bool = False
    outside_pid_namespace: bool = False
    #: Its share of the GPU's SM time, percent (None where the driver does not give it).
    sm_util_pct: Optional[int] = None


class QuarantineView(_Model):
    __schema__ = "QuarantineView"
    attempt: str
    reason: str
    since: datetime


class DriftView(_Model):
    """A gap between what is placed on a GPU (its attempts' estimates) and what it uses."""

    __schema__ = "DriftView"
    #: ``over`` (it uses more than placed) or ``under`` (it uses less).
    direction: str
    gap_mib: int
    since: datetime
    #: It has lasted past the coordinator's ``--alert-drift-after``.
    lasting: bool


class GpuView(_Model):
    __schema__ = "GpuView"
    index: int
    uuid: str
    name: str
    total_mib: int
    used_mib: Optional[int] = None
    free_mib: Optional[int] = None
    slots: int
    slots_used: int
    estimated_mib: int
    headroom_mib: int
    attempts: List[str]
    foreign: List[GpuProcess] = []
    quarantine: List[QuarantineView] = []
    error: Optional[str] = None
    #: Used memory no listed process holds (ghost memory); None: cannot be told.
    unattributed_mib: Optional[int] = None
    #: Its drift, while its use and what is placed on it are apart.
    drift: Optional[DriftView] = None


class NodeView(_Model):
    __schema__ = "NodeView"
    name: str
    agent: Optional[str] = None
    plan: str
    headroom: str
    last_seen: Optional[datetime] = None
    alive: bool
    gpus: List[GpuView]


class TelemetrySample(_Model):
    """One GPU's reading at one instant (the agent samples once a second). A reading the GPU
    does not support, or that failed, is None, never 0."""

    __schema__ = "TelemetrySample"
    gpu: int
    at: datetime
    used_mib: Optional[int] = None
    free_mib: Optional[int] = None
    total_mib: Optional[int] = None
    utilization_pct: Optional[int] = None
    power_w: Optional[float] = None
    #: The GPU's total-energy counter (joules since the driver loaded): the energy of a
    #: stretch of time is the difference of two readings.
    energy_j: Optional[float] = None
    temperature_c: Optional[float] = None
    sm_clock_mhz: Optional[int] = None
    #: Clock event reasons now (``sw_thermal_slowdown``...); empty: none; None: not available.
    throttle: Optional[List[str]] = None
    error: Optional[str] = None


class GpuSeries(_Model):
    """One GPU's samples, oldest first."""

    __schema__ = "GpuSeries"
    node: str
    gpu: int
    samples: List[TelemetrySample]

    def to_frame(self) -> "pd.DataFrame":
        """One row per sample: ``node``, ``gpu``, ``at`` (datetime64, UTC), the readings."""
        return telemetry_frame([self], list(TelemetrySample.model_fields))


class AttemptTelemetry(_Model):
    """An attempt's GPUs over its run (start to end, or to now while it runs); ``from_`` and
    ``to`` (the API's ``from``/``to``) are None before it started."""

    __schema__ = "AttemptTelemetry"
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    attempt: str
    node: str
    from_: Optional[datetime] = Field(default=None, alias="from")
    to: Optional[datetime] = None
    gpus: List[GpuSeries]

    def to_frame(self) -> "pd.DataFrame":
        """One row per sample of each GPU: ``attempt``, ``node``, ``gpu``, ``at`` (datetime64,
        UTC), the readings."""
        return telemetry_frame(
            self.gpus, list(TelemetrySample.model_fields), attempt=self.attempt
        )


class UsageRow(_Model):
    """What the runs of one user (or one experiment) used within a usage report's window:
    the part of each attempt's run inside it. ``key`` is the user's name, or the experiment's
    id (``by="experiment"``, its ``name`` beside it); ``gpu_hours``: GPUs held x hours;
    ``gib_hours``: GiB of GPU memory reserved x hours (what fair share charges);
    ``energy_kwh``: of the attempts that measured one, ``clean_energy_kwh`` of those that had
    their GPUs to themselves; ``jobs``: the jobs that ended in the window, by end state
    (``succeeded``, ``failed``, ``cancelled``...)."""

    __schema__ = "UsageRow"
    key: str
    #: The experiment's name (``by="experiment"``; None by user).
    name: Optional[str] = None
    gpu_hours: float
    gib_hours: float
    energy_kwh: float
    clean_energy_kwh: float
    attempts: int
    jobs: Dict[str, int]


class ShareStanding(_Model):
    """A user's fair-share standing now: their ``share`` (weight), their decayed usage
    (``used_gib_hours``, GiB-hours of reserved GPU memory, halved every ``half_life_s``,
    running attempts included), ``normalized`` (``used_gib_hours / share``: the lower, the
    sooner their waiting jobs go), and what their jobs hold now (leased or running: jobs,
    GPUs, GPU memory in MiB)."""

    __schema__ = "ShareStanding"
    user: str
    share: int
    used_gib_hours: float
    normalized: float
    running_jobs: int
    running_gpus: int
    running_mib: int


class UsageReport(_Model):
    """``usage()``: what each user (or experiment, ``by``) used from ``since`` to ``until``
    (``rows``), and every user's fair-share standing now (``shares``, lowest ``normalized``
    first: whose jobs go first), with the coordinator's half-life (seconds)."""

    __schema__ = "UsageReport"
    since: datetime
    until: datetime
    by: str
    half_life_s: int
    rows: List[UsageRow]
    shares: List[ShareStanding]


class SubscriptionView(_Model):
    """An alert subscription (``alerts()``, ``subscribe()``): what it is told of (``on``:
    ``experiment-ended``, ``gpu-quarantined``, ...), where (``target``: ``{"webhook": {"url",
    "format"}}``, the URL shown by scheme and host only, or ``{"email": {"to"}}``), whose
    (``owner``), and whether it hears of every user's jobs (``lab_wide``)."""

    __schema__ = "SubscriptionView"
    id: str
    owner: str
    on: List[str]
    target: Dict[str, Any]
    lab_wide: bool
    created_at: datetime


class DeliveryView(_Model):
    """One event sent to one subscription: ``pending`` (tried again at ``next_try_at``),
    ``delivered`` or ``dead`` (given up: a dead letter), with its tries and last error. ``id``
    is the idempotency key its receiver is given."""

    __schema__ = "DeliveryView"
    id: str
    subscription: str
    kind: str
    summary: str
    state: str
    tries: int
    last_error: Optional[str] = None
    event_at: datetime
    delivered_at: Optional[datetime] = None
    next_try_at: Optional[datetime] = None


class AlertsView(_Model):
    """``alerts()``: the caller's subscriptions (an admin's: every one) and their newest
    deliveries, dead letters first."""

    __schema__ = "AlertsView"
    subscriptions: List[SubscriptionView]
    deliveries: List[DeliveryView]


#: Every model checked against the OpenAPI document.
ALL_MODELS = [
    ErrorDetail,
    GroupPreview,
    SchedulePreview,
    Health,
    StateCounts,
    Progress,
    ExpandedJob,
    SubmitResponse,
    SubmittedVariant,
    ExperimentSummary,
    StudyRef,
    GitState,
    Snapshot,
    Source,
    JobSummary,
    AttemptView,
    JobDetail,
    CancelResponse,
    RetryResponse,
    RetryFailedResponse,
    GpuProcess,
    QuarantineView,
    GpuView,
    NodeView,
    TelemetrySample,
    GpuSeries,
    AttemptTelemetry,
    CounterWindow,
    Phases,
    Sharing,
    Point,
    RungDecision,
    AttemptSeries,
    UsageRow,
    ShareStanding,
    UsageReport,
    DriftView,
    SubscriptionView,
    DeliveryView,
    AlertsView,
]
