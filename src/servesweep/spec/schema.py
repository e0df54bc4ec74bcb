"""The sweep file's schema: validated, frozen pydantic models.

These models are the contract between the sweep file and every other layer:
launchers read :class:`ServerSpec`, the load generator reads :class:`WorkloadSpec`,
the report reads :class:`Objective`, the search reads :class:`SearchSpec`. Durations
accept ``30``, ``"30s"``, ``"5m"``, ``"1h30m"``, ``"250ms"``; sizes accept ``1024``,
``"512MiB"``, ``"1GiB"``, ``"2GB"`` (see :mod:`servesweep.spec.values`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)

from servesweep.spec.schema_search import CapacitySpec, ParamRange, SearchSpec
from servesweep.spec.values import (
    SLO_KEYS,
    Duration,
    Size,
    check_slos,
    parse_duration,
    parse_size,
)
from servesweep.spec.values import FrozenModel as _Frozen

__all__ = [
    "SLO_KEYS",
    "CapacitySpec",
    "CapacityWorkload",
    "CommandSpec",
    "ConfirmBudget",
    "ConfirmSpec",
    "DecisionSpec",
    "DockerSpec",
    "Duration",
    "EvalSpec",
    "EvalWorkload",
    "ExecutorSpec",
    "FakeGpusSpec",
    "LoadWorkload",
    "Objective",
    "ParamRange",
    "ParamsSpec",
    "ReleaseSpec",
    "ScreeningSpec",
    "SearchSpec",
    "ServerSpec",
    "Size",
    "SweepSpec",
    "SystemdSpec",
    "Timeouts",
    "WorkloadSpec",
    "parse_duration",
    "parse_size",
    "workload_spec",
]

ParamValue = str | int | float | bool | None | list[Any] | dict[str, Any]


def _one_or_list(value: Any) -> Any:
    """A single string where a list of strings is expected: a list of one."""
    return [value] if isinstance(value, str) else value


StrList = Annotated[list[str], BeforeValidator(_one_or_list)]


def _one_number(value: Any) -> Any:
    """A single number where a list of levels is expected: a list of one."""
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _values_or_range(value: Any) -> str:
    return "~range" if isinstance(value, dict) else "~values"


GridValues = Annotated[
    Annotated[list[ParamValue], Tag("~values")] | Annotated[ParamRange, Tag("~range")],
    Discriminator(_values_or_range),
]
"""A grid param: a list of values (categorical) or a range ``{low, high, step, log}``."""


class Timeouts(_Frozen):
    """How long each lifecycle step may take."""

    stop: Duration = 30.0
    """Grace period between SIGTERM (or ``systemctl stop``) and SIGKILL."""
    kill: Duration = 10.0
    """After SIGKILL: how long processes may take to disappear before ``stop_failed``."""
    release: Duration = 300.0
    """How long GPU memory may take to come back before ``gpu_busy``."""
    ready: Duration = 900.0
    """How long the new instance may take to produce a real generation."""
    request: Duration = 600.0
    """Per-request timeout of the load generator."""


class ReleaseSpec(_Frozen):
    """The release gate's tolerance: used memory back within this of the baseline."""

    tolerance: Size = 512 * 2**20
    settle: Duration = 0.2
    """Used memory must stay within tolerance this long."""
    foreign_holders: Literal["wait", "fail", "kill-own"] = "wait"
    """A process that is not ours holds GPU memory: wait for it (until the release
    timeout), fail at once, or kill holders that are servesweep's own earlier instances."""


class SystemdSpec(_Frozen):
    unit: str
    systemctl: list[str] = Field(default_factory=lambda: ["systemctl"])
    """Command prefix, e.g. ``[systemctl, -H, host]`` or a wrapper."""
    journalctl: list[str] = Field(default_factory=lambda: ["journalctl"])
    unit_dir: str = "/etc/systemd/system"
    mode: Literal["execstart", "envfile"] = "execstart"
    """``execstart``: the drop-in replaces ExecStart with the trial's argv;
    ``envfile``: the unit keeps its own ExecStart (which uses ``$SERVESWEEP_ARGS``) and
    the drop-in sets ``SERVESWEEP_ARGS``, ``SERVESWEEP_PROGRAM`` and the trial's
    variables with ``Environment=`` lines (no separate environment file)."""


class DockerSpec(_Frozen):
    image: str
    docker: list[str] = Field(default_factory=lambda: ["docker"])
    """Command prefix, e.g. ``[docker, -H, unix:///run/x.sock]``."""
    run_args: list[str] = Field(default_factory=list)
    network: str = "host"
    gpus_flag: bool = True
    """Pass ``--gpus device=...`` (needs the NVIDIA container toolkit)."""
    name_prefix: str = "servesweep"


class CommandSpec(_Frozen):
    """Shell commands for the ``command`` launcher (or the ``generic`` engine's template).

    Placeholders: ``{args}`` (the trial's argv after the program, shell-quoted),
    ``{port}``, ``{host}``, ``{model}``, ``{gpus}`` (comma list), ``{trial}``, ``{log}``,
    ``{pid_file}`` and ``{param.NAME}`` for one param's value.
    """

    start: str
    stop: str | None = None
    status: str | None = None
    pid_file: str | None = None


class FakeGpusSpec(_Frozen):
    """Create the fake GPUs of ``fake_gpu_dir`` when the directory does not exist yet
    (demos, tests, the quickstart). Existing directories are left as they are."""

    count: int = Field(default=1, ge=1, le=64)
    memory: Size = 80 * 2**30
    name: str = "NVIDIA H200 (fake)"


class ServerSpec(_Frozen):
    engine: Literal["vllm", "sglang", "trtllm", "llamacpp", "llama-server", "generic", "sim"]
    launcher: Literal["subprocess", "systemd", "docker", "command"] = "subprocess"
    model: str | None = None
    served_model_name: str | None = None
    """The model name used in requests; default: ask ``/v1/models``."""
    model_config_file: str | None = Field(default=None, alias="model_config")
    """``model_config:`` in the file: a ``config.json`` that describes the model when its
    files live elsewhere (another machine, an image); the memory prediction reads it."""
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    """The first port: slot k of a machine listens on ``port + k`` (or ``ports[k]``)."""
    ports: list[Annotated[int, Field(ge=1, le=65535)]] | None = None
    """Explicit ports of the slots (slot k uses ``ports[k]``); their number caps the
    slots of a machine."""
    gpus: list[int] = Field(default_factory=list)
    """The GPU pool: trials run on disjoint subsets of it."""
    gpus_per_trial: int | str | None = Field(default=None)
    """GPUs one trial needs: a number, or an expression of params such as
    ``"{param.tensor-parallel-size}"`` or ``"{param.tp} * {param.dp}"``. Default: the
    whole pool (one trial at a time)."""
    args: dict[str, ParamValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    release: ReleaseSpec = Field(default_factory=ReleaseSpec)
    executable: list[str] | None = None
    """Override the preset's program, e.g. ``[/opt/venv/bin/python, -m, vllm.entrypoints...]``."""
    command: str | None = None
    """For ``engine: generic``: the command template (see :class:`CommandSpec` placeholders)."""
    systemd: SystemdSpec | None = None
    docker: DockerSpec | None = None
    commands: CommandSpec | None = None
    gpu_backend: Literal["auto", "nvml", "fake", "none"] = "auto"
    fake_gpu_dir: str | None = None
    """Directory of the fake GPU protocol (docs/fake-gpus.md); also ``SERVESWEEP_FAKE_GPUS``.
    Relative paths are relative to the sweep file (like every path of the file: see
    :data:`servesweep.spec.load.PATH_FIELDS`)."""
    fake_gpus: FakeGpusSpec | None = None
    api_key_env: str | None = None
    """Name of an environment variable holding the API key; the key is never stored."""
    env_passthrough: list[str] = Field(default_factory=list)
    """Names of variables (``HF_TOKEN``) the server gets from servesweep's environment
    at launch: the values are never written to the sweep file, the results database,
    logs or drop-ins (docs/launchers.md says how each launcher passes them)."""
    log_dir: str | None = None
    """Where per-trial server logs go; default ``runs/`` beside the results database."""

    @field_validator("env_passthrough")
    @classmethod
    def _env_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(
                    f"env_passthrough takes variable names only, not {name!r} "
                    "(the value comes from the environment servesweep runs in)"
                )
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus_unique(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError("GPU indexes must be unique")
        if any(g < 0 for g in value):
            raise ValueError("GPU indexes must not be negative")
        return value

    @model_validator(mode="after")
    def _launcher_needs(self) -> ServerSpec:
        if self.launcher == "systemd" and self.systemd is None:
            raise ValueError("launcher 'systemd' needs a 'systemd: {unit: ...}' section")
        if self.launcher == "docker" and self.docker is None:
            raise ValueError("launcher 'docker' needs a 'docker: {image: ...}' section")
        if self.launcher == "command" and self.commands is None:
            raise ValueError("launcher 'command' needs a 'commands: {start: ...}' section")
        if self.engine == "generic" and not self.command and self.launcher == "subprocess":
            raise ValueError("engine 'generic' needs 'command' (a command template)")
        return self


class ParamsSpec(_Frozen):
    """The server params to sweep. All parts combine: the grid's product, plus the
    explicit points, plus zipped lists (each combined with the grid when both are
    given: ``grid × zip``), minus exclusions, filtered by ``when`` constraints.
    A sampling search draws from the same space (see :mod:`servesweep.spec.space`)."""

    @property
    def ranges(self) -> dict[str, ParamRange]:
        """The grid params given as ranges."""
        return {k: v for k, v in self.grid.items() if isinstance(v, ParamRange)}

    grid: dict[str, GridValues] = Field(default_factory=dict)
    """Lists of values; a sampling search (``search.strategy``) also takes ranges."""
    points: list[dict[str, ParamValue]] = Field(default_factory=list)
    zip: dict[str, list[ParamValue]] = Field(default_factory=dict)
    exclude: list[dict[str, ParamValue]] = Field(default_factory=list)
    when: StrList = Field(default_factory=list)
    """Python-like boolean expressions over param names, e.g. ``topk <= budget``."""


class EvalSpec(_Frozen):
    """A correctness suite run as a workload."""

    suite: str
    """``builtin:coding``, ``builtin:text``, or a path to a JSONL file."""
    samples: int = Field(default=1, ge=1)
    temperature: float = 0.0
    max_tokens: int = Field(default=512, ge=1)
    limit: int | None = Field(default=None, ge=1)
    """Run only the first N tasks."""
    timeout: Duration = 10.0
    """Wall-clock limit per program run in the sandbox."""
    parallel: int = Field(default=4, ge=1)
    sandbox: Literal["auto", "bwrap", "unshare", "host-filesystem"] = "auto"
    """Where generated code runs: ``auto`` (bubblewrap, else util-linux unshare as
    root; both without the host's files and network), one of them by name, or
    ``host-filesystem`` (no namespaces: generated code sees the host's files and
    network; unsafe, and every result and the report say so)."""

    @model_validator(mode="before")
    @classmethod
    def _no_allow_no_netns(cls, data: Any) -> Any:
        if isinstance(data, dict) and "allow_no_netns" in data:
            raise ValueError(
                "eval.allow_no_netns is replaced by eval.sandbox: without namespaces "
                "generated code also sees the host's files; apt-get install bubblewrap, "
                "or write sandbox: host-filesystem to accept that"
            )
        return data


class _Workload(_Frozen):
    """What every kind of workload has; workloads never need a server restart."""

    kind: ClassVar[str]
    """``load``, ``eval`` or ``capacity``: which member of :data:`WorkloadSpec`."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")
    endpoint: Literal["chat", "completions"] = "chat"
    dataset: str = "builtin:chat"
    """``builtin:chat``, ``builtin:coding``, ``builtin:math``, ``synthetic``, a JSONL or
    ShareGPT JSON path."""
    input_tokens: int | None = Field(default=None, ge=1)
    """For ``synthetic``: prompt length in tokens."""
    concurrency: Annotated[list[Annotated[int, Field(ge=1)]], BeforeValidator(_one_number)] = Field(
        default_factory=list
    )
    """Closed-loop levels: this many requests in flight."""
    rate: Annotated[list[Annotated[float, Field(gt=0)]], BeforeValidator(_one_number)] = Field(
        default_factory=list
    )
    """Open-loop request rates (req/s); use with ``arrival``."""
    arrival: Literal["constant", "poisson", "gamma"] = "poisson"
    burstiness: float = Field(default=1.0, gt=0)
    requests: int | None = Field(default=None, ge=1)
    duration: Duration | None = None
    warmup: Annotated[int, Field(ge=0)] | Literal["auto", "launch"] = "auto"
    """Unmeasured requests before each level (a number), or ``auto``: each launch of
    the server is warmed until its measurements stop drifting (``launch`` is how
    the sweep marks the workload that does it; not written in a sweep file)."""
    max_tokens: int = Field(default=256, ge=1)
    ignore_eos: bool = False
    temperature: float = 0.0
    stream: bool = True
    seed: int = 0
    repeats: int = Field(default=1, ge=1)
    launches: int | None = Field(default=None, ge=1)
    """Separate launches of the server this workload is measured in (None: the
    sweep's ``launches``): what varies from one start to the next is measured."""
    workers: int = Field(default=1, ge=1, le=64)
    """Load-generator processes for this workload (their samples are merged); raise it
    when the generator warns that its own event loop lags."""
    slo: dict[str, float] = Field(default_factory=dict)
    """Goodput SLOs in ms, e.g. ``{ttft_ms: 500, tpot_ms: 50}``."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    max_error_rate: float = Field(default=0.05, ge=0, le=1)
    """More failed requests than this fraction: ``bench_errors``."""
    eval: EvalSpec | None = None
    """A correctness suite instead of load levels (an :class:`EvalWorkload`)."""
    capacity: CapacitySpec | None = None
    """Search the highest load meeting an SLO instead of running fixed levels (a
    :class:`CapacityWorkload`)."""

    @field_validator("slo")
    @classmethod
    def _known_slos(cls, value: dict[str, float]) -> dict[str, float]:
        check_slos(value)
        return value

    @field_validator("warmup")
    @classmethod
    def _warmup_words(cls, value: int | str) -> int | str:
        if value == "launch":
            raise ValueError("use a number of requests or 'auto'")
        return value

    @property
    def warmup_requests(self) -> int:
        """The fixed warm-up before each level (0 with ``auto``)."""
        return self.warmup if isinstance(self.warmup, int) else 0


class LoadWorkload(_Workload):
    """Fixed load levels (``concurrency`` or ``rate``), each measured ``repeats`` times."""

    kind: ClassVar[Literal["load"]] = "load"

    @model_validator(mode="after")
    def _load_shape(self) -> LoadWorkload:
        if self.concurrency and self.rate:
            raise ValueError("give either 'concurrency' or 'rate', not both")
        if not self.concurrency and not self.rate:
            object.__setattr__(self, "concurrency", [1])
        if any(c < 1 for c in self.concurrency):
            raise ValueError("concurrency levels must be >= 1")
        if any(r <= 0 for r in self.rate):
            raise ValueError("request rates must be > 0")
        if self.requests is None and self.duration is None:
            object.__setattr__(self, "requests", 32)
        return self


class EvalWorkload(_Workload):
    """A correctness suite (``eval``), run as one result."""

    kind: ClassVar[Literal["eval"]] = "eval"
    eval: EvalSpec


class CapacityWorkload(_Workload):
    """A search for the highest load meeting an SLO (``capacity``): its levels are
    chosen as it runs (see ``bench.capacity.CapacityPlan``)."""

    kind: ClassVar[Literal["capacity"]] = "capacity"
    capacity: CapacitySpec

    @model_validator(mode="after")
    def _capacity_shape(self) -> CapacityWorkload:
        if self.eval is not None:
            raise ValueError("a workload is either an 'eval' or a 'capacity' search, not both")
        for field in ("concurrency", "rate"):
            if getattr(self, field):
                raise ValueError(
                    f"a capacity workload chooses its own load levels between "
                    f"capacity.low and capacity.high: drop '{field}'"
                )
        if self.repeats != 1:
            raise ValueError("a capacity workload measures each level once: drop 'repeats'")
        if self.launches not in (None, 1):
            raise ValueError("a capacity workload is searched in one launch: drop 'launches'")
        if self.requests is None and self.duration is None:
            object.__setattr__(self, "requests", 32)
        return self


def _workload_kind(value: Any) -> str:
    """The union tag of a workload: ``capacity`` when it has a capacity section, else
    ``eval`` when it has an eval section, else ``load``."""
    if isinstance(value, _Workload):
        return f"~{value.kind}"
    if isinstance(value, dict):
        if value.get("capacity") is not None:
            return "~capacity"
        if value.get("eval") is not None:
            return "~eval"
    return "~load"


WorkloadSpec = Annotated[
    Annotated[LoadWorkload, Tag("~load")]
    | Annotated[EvalWorkload, Tag("~eval")]
    | Annotated[CapacityWorkload, Tag("~capacity")],
    Discriminator(_workload_kind),
]
"""One client-side benchmark, of one kind: :class:`LoadWorkload`,
:class:`EvalWorkload` or :class:`CapacityWorkload` (chosen by the section it has)."""

_WORKLOAD_ADAPTER: TypeAdapter[WorkloadSpec] = TypeAdapter(WorkloadSpec)


def workload_spec(**fields: Any) -> WorkloadSpec:
    """A workload from its fields, of the kind they make (as a sweep file's
    ``workloads`` entry); raises ``pydantic.ValidationError``."""
    return _WORKLOAD_ADAPTER.validate_python(fields)


class Objective(_Frozen):
    """What "best" means: maximize or minimize one metric, ``WORKLOAD.LEVEL.METRIC``
    written out or split into parts."""

    maximize: str | None = None
    minimize: str | None = None
    workload: str | None = None
    concurrency: int | None = None
    rate: float | None = None

    @model_validator(mode="after")
    def _one_direction(self) -> Objective:
        if (self.maximize is None) == (self.minimize is None):
            raise ValueError("give exactly one of 'maximize' or 'minimize'")
        return self

    @property
    def metric(self) -> str:
        return self.maximize or self.minimize or ""

    @property
    def direction(self) -> Literal["max", "min"]:
        return "max" if self.maximize else "min"


def _one_or_many(value: Any) -> str:
    return "~list" if isinstance(value, list) else "~one"


Objectives = Annotated[
    Annotated[Objective, Tag("~one")]
    | Annotated[list[Objective], Tag("~list"), Field(min_length=1)],
    Discriminator(_one_or_many),
]
"""One objective, or a list of them (a Pareto search; the first one ranks)."""


class ExecutorSpec(_Frozen):
    """Where the trials run: this machine (``local``), or the nodes of a Ray cluster
    (``ray``; docs/distributed.md). ``servesweep run --ray [ADDRESS]`` chooses Ray too."""

    kind: Literal["local", "ray"] = "local"
    address: str | None = None
    """The Ray cluster's head, ``HOST:PORT``; default: ``RAY_ADDRESS``, else the cluster
    running on this machine."""
    bench_from: Literal["node", "driver"] = "node"
    """Where the load generator runs: on the server's node (default), or on the node of
    ``servesweep run`` — every latency then includes the network, and the results say so."""

    @model_validator(mode="after")
    def _ray_only(self) -> ExecutorSpec:
        if self.kind == "local" and self.address is not None:
            raise ValueError("'address' is the address of a Ray cluster: set 'kind: ray'")
        if self.kind == "local" and self.bench_from != "node":
            raise ValueError("'bench_from' applies to a Ray cluster: set 'kind: ray'")
        return self


def _fraction(value: Any) -> Any:
    """``"1%"`` as 0.01; a number as it is."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return float(value.strip()[:-1]) / 100.0
        except ValueError:
            return value
    return value


def _default_prefer() -> list[CostName]:
    return ["gpus", "memory", "latency"]


Fraction = Annotated[float, BeforeValidator(_fraction), Field(ge=0.0, lt=1.0)]
"""A fraction: ``0.01`` or ``"1%"``."""


CostName = Literal["gpus", "memory", "latency"]


class DecisionSpec(_Frozen):
    """How ``best`` decides between configurations (docs/reports.md)."""

    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """The confidence of the intervals a decision uses."""
    threshold: Fraction = 0.01
    """The smallest relative lead that makes a winner (0.01 or ``1%``)."""
    prefer: list[CostName] = Field(default_factory=_default_prefer, min_length=1)
    """Among tied configurations, what makes one cheaper, most important first."""
    launch_sd: Fraction = 0.02
    """Relative standard deviation between launches of one configuration assumed until
    the sweep's relaunches measure it (0.02 or ``2%``)."""


class CostSpec(_Frozen):
    """What a GPU costs: each load level gets its ``cost_per_mtok`` and
    ``tokens_per_dollar`` from its output throughput and the trial's GPU count."""

    gpu_hour: float = Field(gt=0, allow_inf_nan=False)
    """The price of one GPU for one hour."""
    currency: str = Field(default="USD", pattern=r"^[A-Za-z$€£¥]{1,8}$")
    """Shown beside the figures (``USD``, ``EUR``...); no conversion is made."""


class ConfirmBudget(_Frozen):
    """What the confirm phase may spend: extra launches, wall time, or both (the
    first reached ends it)."""

    launches: int | None = Field(default=None, ge=1)
    time: Duration | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        """``budget: 8`` is 8 extra launches; ``budget: 30m`` is 30 minutes."""
        if isinstance(data, bool):
            raise ValueError("budget: give a number of launches (8) or a duration (30m)")
        if isinstance(data, int):
            return {"launches": data}
        if isinstance(data, (str, float)):
            try:
                parse_duration(data)
            except ValueError:
                raise ValueError(
                    f"not a number of launches or a duration: {data!r} (write e.g. budget: 8, "
                    "budget: 30m or budget: {launches: 8, time: 30m})"
                ) from None
            return {"time": data}
        return data


class ConfirmSpec(_Frozen):
    """The confirm phase (docs/sweep-file.md): after the grid or the search, the
    leading candidates still tied with the leader are launched again until they
    separate or the budget is spent."""

    top: int = Field(default=3, ge=2)
    """At most this many tied candidates (the leader among them) are confirmed."""
    launches: int = Field(default=2, ge=1)
    """Extra launches of each candidate per round."""
    budget: ConfirmBudget | None = None
    """Default: two full rounds (``2 × top × launches`` extra launches)."""

    @property
    def max_launches(self) -> int:
        """The extra launches the whole phase may spend."""
        if self.budget is not None and self.budget.launches is not None:
            return self.budget.launches
        if self.budget is not None and self.budget.time is not None:
            return 10**9  # the time limit alone
        return 2 * self.top * self.launches

    @property
    def max_seconds(self) -> float | None:
        return None if self.budget is None else self.budget.time


def _screen_requests(value: Any) -> Any:
    """``"25%"`` as 0.25; a whole number as a count; a number as it is."""
    if isinstance(value, bool):
        raise ValueError("give a number of requests (16) or a fraction (0.25 or 25%)")
    value = _fraction(value)
    if isinstance(value, float) and value >= 1 and value.is_integer():
        return int(value)
    return value


class ScreeningSpec(_Frozen):
    """The screening pass (docs/sweep-file.md): every configuration is first measured
    with short levels; only those that can still win are measured in full."""

    requests: Annotated[int | float, BeforeValidator(_screen_requests)] = 0.25
    """Requests of a screening level: a count (``16``, at most the workload's own) or a
    fraction of the workload's ``requests`` (or ``duration``): ``0.25`` or ``25%``."""
    threshold: Fraction = 0.05
    """The relative gap, beyond both intervals, under which a screening result cannot
    win. Larger than ``decision.threshold`` by default: screening compares levels of
    different launches, and one launch's interval does not hold the launch-to-launch
    variation (about 2 % measured on an H200; docs/benchmarks.md)."""

    @model_validator(mode="after")
    def _requests_shape(self) -> ScreeningSpec:
        value = self.requests
        if isinstance(value, int):
            if value < 1:
                raise ValueError("screening.requests: at least 1 request")
        elif not 0 < value < 1:
            raise ValueError(
                "screening.requests: a whole number of requests (16) or a fraction "
                f"between 0 and 1 (0.25 or 25%), got {value:g}"
            )
        return self


class SweepSpec(_Frozen):
    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    description: str = ""
    server: ServerSpec
    params: ParamsSpec = Field(default_factory=ParamsSpec)
    workloads: list[WorkloadSpec] = Field(min_length=1)
    objective: Objectives | None = None
    """Use :attr:`objectives` to read it (always a tuple)."""
    constraints: StrList = Field(default_factory=list)
    include_unreliable: bool = False
    """Let levels the load generator could not time (``unreliable``, see
    docs/metrics.md) count for ``best``, constraints and pruning; default: left out."""
    search: SearchSpec = Field(default_factory=SearchSpec)
    parallel: int | None = Field(default=None, ge=1)
    """How many trials may run at the same time on one machine (default: as many as
    fit in the GPU pool); ``servesweep run --slots N`` overrides it."""
    store: str | None = None
    """Path of the results database; default ``servesweep.db`` beside the sweep file."""
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    """Where the trials run (this machine by default)."""
    decision: DecisionSpec = Field(default_factory=DecisionSpec)
    """How ``best`` tells a winner from a tie."""
    cost: CostSpec | None = None
    """The price of a GPU-hour: gives each load level its cost per million output
    tokens (None: no cost figures)."""
    launches: int = Field(default=1, ge=1)
    """Separate launches of the server every configuration is measured in (a
    workload's own ``launches`` overrides it)."""
    confirm: ConfirmSpec | bool | None = None
    """The confirm phase: ``true`` or a mapping turns it on, ``false`` off; unset, it
    is on for a search and off for a grid. Read it with :attr:`confirm_phase`."""

    screening: ScreeningSpec | bool | None = None
    """A first pass with short levels, full measurement only for the configurations
    that can still win: ``true`` or a mapping turns it on; off by default. Read it
    with :attr:`screening_pass`."""

    @property
    def screening_pass(self) -> ScreeningSpec | None:
        """The screening pass this sweep runs (None: none)."""
        if isinstance(self.screening, ScreeningSpec):
            return self.screening
        return ScreeningSpec() if self.screening else None

    @property
    def confirm_phase(self) -> ConfirmSpec | None:
        """The confirm phase this sweep runs (None: none)."""
        if isinstance(self.confirm, ConfirmSpec):
            return self.confirm
        if self.confirm is None:
            capped = self.search.trials is not None or self.search.budget is not None
            return ConfirmSpec() if (self.search.samples or capped) else None
        return ConfirmSpec() if self.confirm else None

    def launches_of(self, workload: WorkloadSpec) -> int:
        """How many launches measure ``workload`` (a capacity search: one)."""
        if isinstance(workload, CapacityWorkload):
            return 1
        return workload.launches if workload.launches is not None else self.launches

    @property
    def max_launches(self) -> int:
        """The launches of one trial: the most any workload needs."""
        return max(self.launches_of(w) for w in self.workloads)

    @property
    def objectives(self) -> tuple[Objective, ...]:
        """The objectives as written (empty when the file has none); the first ranks."""
        if self.objective is None:
            return ()
        if isinstance(self.objective, Objective):
            return (self.objective,)
        return tuple(self.objective)
