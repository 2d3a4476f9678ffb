"""The training-algorithm extension point: one role-program definition per algorithm, run by every executor.

A training algorithm is a set of role programs (worker, server or master) over the ``Comm`` seam of
``algorithms.comm``. Each program talks to its model state only through a ``Trainer`` (the executor
supplies one per rank: the simulator's has durations and size-only payloads, the MPI harness's runs
torch), so the same generator drives a SimPy run and a real run.

Register one algorithm per file named ``<token>_training.py``::

    sync_sgd  sync_sgd_ps  async_sgd  async_msgd  hogwild_sgd
    easgd  async_easgd  async_measgd  hogwild_easgd  sync_easgd  hybrid_parallel

Ranks and roles (``Plan``): parameter servers or the EASGD master take ranks ``0..servers-1``, the
workers the rest; all-reduce algorithms have workers only, plus helper ranks when their collective
needs relays of its own (a parameter-server collective with dedicated servers). ``hybrid_parallel``
puts ``stages`` consecutive ranks on one node (one pipeline of model parallelism) and one pipeline
per node. Where a closed form exists (``TrainingAlgorithm.closed_form``) it sits in the algorithm's
file beside its program, as a collective's closed form sits beside its schedule.

Units: ``steps`` counts minibatch gradient steps per worker (a Hogwild worker's threads together
count as one worker); bytes are wire bytes of the payloads the trainer hands out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ddlsim.algorithms.collective import collective_tokens, is_collective_token
from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.gradient_buckets import StepProfile
from ddlsim.algorithms.parallel_layout import ParallelLayout
from ddlsim.algorithms.schedule import ScheduleError
from ddlsim.registry import Registry

# Message tags, one per kind of message, shared by every algorithm.
TAG_PUSH = 11  # worker -> server: gradient, weight delta or worker weights (EASGD)
TAG_PULL = 12  # server -> worker: weights or the center variable
TAG_ACTIVATION = 13  # hybrid: stage s -> s+1 forward activations
TAG_ACTIVATION_GRADIENT = 14  # hybrid: stage s+1 -> s gradient of those activations


class TrainingAlgorithmError(ScheduleError):
    """Options or a placement that an algorithm cannot run with (the message says what is allowed).

    A ``ScheduleError`` (hence a ``ValueError``), so the CLI reports it as bad input with exit code 2.
    """


class Trainer(Protocol):
    """A rank's model state and the work on it. Methods returning work hand back a ``Work``
    (see ``algorithms.comm``) whose result is the payload described; payloads have ``.nbytes``."""

    def gradient(self) -> Any:
        """Forward and backward of the next minibatch at the local weights -> gradient payload."""

    # --- the same step in gradient buckets (``algorithms.gradient_buckets``) ---------------------
    def buckets(self) -> int:
        """How many gradient buckets a backward pass fills (no work)."""

    def backward_bucket(self, bucket: int) -> Any:
        """Backward until bucket ``bucket`` is complete (bucket 0 starts the pass, after ``forward(None)``)
        -> that bucket's gradient payload."""

    def empty_bucket(self, bucket: int) -> Any:
        """A zero payload of bucket ``bucket``'s size, for a helper rank's share of its all-reduce (no work)."""

    def hogwild(self, threads: int) -> Any:
        """``threads`` lock-free SGD steps sharing the local weights (one minibatch each) -> None."""

    def step(self, gradient: Any, scale: float = 1.0) -> Any:
        """Local optimizer step with ``scale * gradient`` (momentum if the trainer has it) -> None.
        ``gradient`` is one payload, or the list of reduced buckets from ``backward_with_allreduce``."""

    def weights(self) -> Any:
        """A snapshot payload of the local weights (no work)."""

    def assign(self, weights: Any) -> Any:
        """Set the local weights (and the Hogwild anchor) to ``weights`` -> None."""

    def delta(self) -> Any:
        """Local weights minus the anchor set by the last ``assign`` -> payload."""

    def add(self, delta: Any) -> Any:
        """Server: weights += delta -> None."""

    def accumulate(self, gradient: Any) -> Any:
        """Server: gradient sum += gradient -> None."""

    def apply_accumulated(self, count: int) -> Any:
        """Server: optimizer step with the mean of the ``count`` accumulated gradients, reset -> None."""

    def elastic_center(self, worker_weights: Any, alpha: float) -> Any:
        """Master: center += alpha (x - center) -> payload of the center before the update."""

    def elastic_worker(self, center: Any, alpha: float) -> Any:
        """Worker: x -= alpha (x - center) -> None."""

    def elastic_sync(self, total: Any, workers: int, alpha: float) -> Any:
        """Sync EASGD on every worker: x -= alpha (x - c); c += alpha (total - workers c) -> None."""

    def part(self, payload: Any, index: int, count: int) -> Any:
        """Shard ``index`` of ``count`` of a full-model payload (no work)."""

    def assign_part(self, payload: Any, index: int, count: int) -> Any:
        """Set shard ``index`` of ``count`` of the local weights -> None."""

    def like(self, index: int = 0, count: int = 1) -> Any:
        """A receive buffer for a model shard (None where the executor needs none)."""

    # --- hybrid parallel (one pipeline stage per rank); ``forward(None)`` is also the whole model's ----
    def forward(self, activation: Any) -> Any:
        """Stage forward on the activation from the previous stage (None on the first, or for the whole
        model) -> output payload (None on the last stage: the loss stays with the trainer)."""

    def backward(self, output_gradient: Any) -> Any:
        """Stage backward (None on the last: the loss) -> gradient of the stage input (None on the first)."""

    def activation_like(self, incoming: bool) -> Any:
        """Receive buffer for the activation (incoming) or for its gradient (not incoming)."""

    def stage_gradient(self) -> Any:
        """Payload of this stage's weight gradients from the last backward (no work)."""

    # --- megatron (one pipeline stage of a tensor/pipeline/data-parallel layout per rank) -----------
    def stage_forward(self, micro_batch: int, chunk: int, activation: Any) -> Any:
        """Forward of model chunk ``chunk`` on ``micro_batch`` (tensor-parallel collectives inside)
        -> the output activation (None after the last layer)."""

    def stage_backward(self, micro_batch: int, chunk: int, gradient: Any) -> Any:
        """Backward of that chunk (recomputation included) -> the input gradient (None before the first layer)."""

    def chunk_gradients(self, chunk: int) -> list[tuple[Any, str, str]]:
        """(payload, collective, "dense" or "expert") of each gradient reduction of ``chunk`` (no work)."""

    def parameter_shard(self, chunk: int) -> Any:
        """The updated weights of ``chunk`` this rank gathers from the others (ZeRO 1-2; no work)."""

    def assign_gathered(self, gathered: list[Any]) -> Any:
        """Set each chunk's weights from its gathered payload (ZeRO 1-2, after the step) -> None."""

    def chunk_buckets(self, chunk: int, bucket_bytes: float) -> int:
        """How many gradient buckets of about ``bucket_bytes`` ``chunk``'s gradients fill (no work)."""

    def stage_forward_bucket(self, micro_batch: int, chunk: int, activation: Any, bucket: int, buckets: int) -> Any:
        """``stage_forward`` through the layers of bucket ``bucket`` of ``buckets`` (in forward order)
        -> the output activation after the last bucket, else None."""

    def stage_backward_bucket(self, micro_batch: int, chunk: int, gradient: Any, bucket: int, buckets: int) -> Any:
        """``stage_backward`` until bucket ``bucket`` of ``buckets`` is complete (in backward order)
        -> the input gradient after the last bucket, else None."""

    def bucket_gradients(self, chunk: int, bucket: int, buckets: int) -> list[tuple[Any, str, str]]:
        """``chunk_gradients`` of bucket ``bucket`` of ``buckets`` (no work)."""

    def parameter_bucket(self, chunk: int, bucket: int, buckets: int) -> Any:
        """``parameter_shard`` of bucket ``bucket`` of ``buckets`` (no work)."""


@dataclass(frozen=True)
class AlgorithmOptions:
    """Every training-algorithm option; an algorithm lists the ones it reads in ``TrainingAlgorithm.options``.

    tau: communication period in local steps (EASGD family), >= 1.
    alpha: elastic coefficient in (0, 1) (EASGD family; Zhang et al. 2015 use beta = p alpha).
    servers: parameter servers sharding the model (parameter-server algorithms), >= 1.
    collective: all-reduce algorithm token or library selector (algorithms with an all-reduce).
    collective_options: options of that collective algorithm (e.g. ``servers`` of ``parameter_server``).
    bucket_bytes: gradient fusion bucket size in wire bytes (bucketed sync SGD), > 0.
    overlap: start each bucket's all-reduce during backward (bucketed sync SGD).
    threads: Hogwild threads per worker (one node), >= 1.
    split: hybrid: layers per pipeline stage, in order (None: chosen by the caller).
    stages: hybrid: pipeline stages per node (the devices or NUMA domains of one node), >= 1.
    staleness: async_sgd: artificial extra staleness, in pulls (real-run statistical check), >= 0.
    layout: megatron: the tensor/pipeline/data/context/expert split, micro-batches, ZeRO stage,
        recomputation (``algorithms.parallel_layout.ParallelLayout``; dp 0 = whatever the ranks leave).
    overlap_grad_reduce: megatron: reduce a model chunk's gradients bucket by bucket (``bucket_bytes``) as
        its last backward fills them (Megatron's ``--overlap-grad-reduce``).
    overlap_param_gather: megatron, ZeRO 1-2: gather the updated weights bucket by bucket while the next
        iteration's first forward runs, each bucket before its layers (``--overlap-param-gather``).
    """

    tau: int = 1
    alpha: float = 0.5
    servers: int = 1
    collective: str = "ring"
    collective_options: dict[str, Any] = field(default_factory=dict)
    bucket_bytes: float = 25e6
    overlap: bool = True
    threads: int = 4
    split: tuple[int, ...] | None = None
    stages: int = 2
    staleness: int = 0
    layout: ParallelLayout = field(default_factory=lambda: ParallelLayout(dp=0))
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False

    def validate(self) -> None:
        def positive_int(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TrainingAlgorithmError(f"{name} must be an integer >= 1, got {value!r}")

        for name in ("tau", "servers", "threads", "stages"):
            positive_int(name)
        if not (isinstance(self.alpha, int | float) and 0.0 < self.alpha < 1.0):
            raise TrainingAlgorithmError(f"alpha must lie in the open interval (0, 1), got {self.alpha!r}")
        if isinstance(self.staleness, bool) or not isinstance(self.staleness, int) or self.staleness < 0:
            raise TrainingAlgorithmError(f"staleness must be an integer >= 0, got {self.staleness!r}")
        if not (isinstance(self.bucket_bytes, int | float) and 0 < self.bucket_bytes < math.inf):
            raise TrainingAlgorithmError(f"bucket bytes must be a finite size > 0, got {self.bucket_bytes!r}")
        if not is_collective_token(self.collective):
            raise TrainingAlgorithmError(
                f"unknown collective algorithm {self.collective!r}; valid: {', '.join(collective_tokens())}"
            )
        if self.split is not None:
            empty = [i for i, count in enumerate(self.split) if count < 1]
            if empty:
                raise TrainingAlgorithmError(
                    f"hybrid split {','.join(map(str, self.split))} leaves device {empty[0]} of the node "
                    "with no layers; every device needs at least one layer"
                )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["split"] = list(self.split) if self.split is not None else None
        return data

    @staticmethod
    def from_dict(values: dict[str, Any]) -> AlgorithmOptions:
        """Options from ``to_dict``'s form (a layout as a table, a split as a list); unknown keys refused."""
        values = dict(values)
        unknown = sorted(set(values) - set(OPTION_FIELDS))
        if unknown:
            raise TrainingAlgorithmError(f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(OPTION_FIELDS)}")
        if "split" in values:
            values["split"] = parse_split(values["split"])
        if isinstance(values.get("layout"), dict):
            values["layout"] = parse_layout(values["layout"])
        return replace(AlgorithmOptions(), **values)


OPTION_FIELDS = tuple(option.name for option in dataclasses.fields(AlgorithmOptions))


def parse_split(text: str | tuple[int, ...] | list[int] | None) -> tuple[int, ...] | None:
    """``"3,5"`` -> (3, 5): layers per pipeline stage."""
    if text is None or isinstance(text, tuple):
        return text
    if isinstance(text, list):
        return tuple(text)
    try:
        return tuple(int(item) for item in str(text).split(","))
    except ValueError:
        raise TrainingAlgorithmError(f"split: expected layer counts like 10,12, got {text!r}") from None


def parse_layout(values: dict[str, Any] | ParallelLayout) -> ParallelLayout:
    """A layout from a table of its fields (unknown fields refused)."""
    if isinstance(values, ParallelLayout):
        return values
    known = {item.name for item in dataclasses.fields(ParallelLayout)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TrainingAlgorithmError(f"unknown layout field(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    return replace(ParallelLayout(dp=0), **values)


def make_options(algorithm: str, values: dict[str, Any]) -> AlgorithmOptions:
    """Options for ``algorithm`` from a dict; options the algorithm does not read are rejected."""
    spec = TRAINING_ALGORITHMS.get(algorithm)
    unknown = sorted(set(values) - set(OPTION_FIELDS))
    unused = sorted(set(values) & set(OPTION_FIELDS) - set(spec.options))
    if unknown or unused:
        bad = ", ".join(unknown + unused)
        valid = ", ".join(spec.options) if spec.options else "none"
        raise TrainingAlgorithmError(f"algorithm {algorithm!r}: option(s) {bad} do not apply; valid: {valid}")
    options = AlgorithmOptions.from_dict(values)
    options.validate()
    return options


@dataclass(frozen=True)
class Plan:
    """Who does what: ``servers`` ranks first (parameter server or EASGD master), then ``workers``, then
    ``helpers`` (ranks that only relay a collective: a parameter-server collective's dedicated
    servers); ``steps`` gradient steps per worker."""

    algorithm: str
    ranks: int
    servers: range
    workers: range  # ranges, not lists: a plan of a million ranks costs nothing to hold
    steps: int
    options: AlgorithmOptions = field(default_factory=AlgorithmOptions)
    helpers: range = range(0)

    def is_server(self, rank: int) -> bool:
        return rank < len(self.servers)

    def is_helper(self, rank: int) -> bool:
        return rank in self.helpers

    @property
    def exchanges(self) -> int:
        """Worker-server exchanges per worker for periodic algorithms: one after every ``tau`` steps."""
        return self.steps // self.options.tau


ProgramFactory = Callable[[Any, Trainer, Plan], RoleProgram]


class TrainingCosts(Protocol):
    """What a closed form may ask of the modeled hardware (seconds, wire bytes); the closed-form
    executor (``simulator.closed_form``) supplies it, as the fabric supplies ``FabricCosts`` to a
    collective's closed form."""

    @property
    def step(self) -> StepProfile:
        """A worker's step over the whole model: forward, backward in gradient buckets, update."""
        ...

    @property
    def worker(self) -> Any:
        """A worker's trainer (the ``Trainer`` methods its algorithm uses) whose work items carry the
        modeled seconds (``duration_s``) and payload sizes, without noise: the same cost model the
        event simulation runs."""
        ...

    def collective_s(
        self,
        collective: str,
        algorithm: str,
        ranks: int,
        nbytes: float,
        options: dict[str, Any],
        group: tuple[int, ...] | None = None,
        beside: int = 1,
    ) -> float:
        """Seconds of one collective of ``nbytes`` over ``ranks`` worker ranks (the ranks of ``group``,
        or the first ``ranks`` of the run), uncontended but for ``beside`` alike groups on the same
        nodes running it at the same time (they share the nodes' NICs)."""
        ...

    def trainer(self, rank: int) -> Any:
        """Rank ``rank``'s trainer (``worker`` for algorithms whose workers are alike)."""
        ...

    def message_s(self, src: int, dst: int, nbytes: float, block: int = 1) -> float:
        """Seconds of one message from rank ``src`` to rank ``dst``, one of ``block`` alike that
        consecutive ranks send at once, each to its counterpart (sharing their nodes' NICs)."""
        ...


class TrainingAlgorithm:
    """Base of every registered training algorithm.

    Subclasses set ``name``, ``family`` (``synchronous``, ``asynchronous`` or ``elastic``, used by the
    statistical-efficiency model), ``options`` (the option names they read), ``uses_servers``, and
    implement ``program``; ``closed_form`` where one exists.
    """

    name = ""
    family = "synchronous"
    options: tuple[str, ...] = ()
    uses_servers = False
    hogwild = False  # workers run Hogwild threads (trainers need ``hogwild``)
    momentum = False  # the updating trainers (servers or local steps) keep a momentum buffer
    summary = ""
    # gradient steps per worker simulated when the caller does not say: one step of a synchronous
    # algorithm is its steady state; asynchronous and elastic ones need many to show queues and staleness
    default_updates = 20

    def plan(
        self, ranks: int, steps: int, options: AlgorithmOptions | None = None, devices_per_node: int = 1
    ) -> Plan:
        """The roles of ``ranks`` ranks running ``steps`` steps per worker (raises on impossible input)."""
        options = options or AlgorithmOptions()
        options.validate()
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise TrainingAlgorithmError(f"steps (updates per worker) must be an integer >= 1, got {steps!r}")
        servers = options.servers if self.uses_servers else 0
        if servers >= ranks:
            raise TrainingAlgorithmError(
                f"{self.name}: {servers} server(s) leave no worker among {ranks} rank(s); "
                f"use fewer servers or more ranks"
            )
        return Plan(self.name, ranks, range(servers), range(servers, ranks), steps, options)

    def plan_exactly(self, ranks: int, steps: int, options: AlgorithmOptions | None = None) -> Plan:
        """A plan of exactly ``ranks`` ranks (a real run's world): when the collective adds helper ranks,
        fewer workers leave room for them."""
        plan = self.plan(ranks, steps, options)
        helpers = plan.ranks - ranks
        if helpers > 0:
            if ranks - helpers < 1:
                raise TrainingAlgorithmError(f"{self.name}: {helpers} helper rank(s) leave no worker among {ranks}")
            plan = self.plan(ranks - helpers, steps, options)
        if plan.ranks != ranks:
            raise TrainingAlgorithmError(f"{self.name}: no plan spans exactly {ranks} ranks")
        return plan

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        """The role program of ``comm.rank``."""
        raise NotImplementedError

    def closed_form(self, costs: TrainingCosts, plan: Plan) -> tuple[float, float] | None:
        """(seconds for ``plan.steps`` steps of the slowest worker, summed collective seconds of one
        worker) on an uncontended fabric; None where the algorithm has no closed form."""
        return None

    @property
    def has_closed_form(self) -> bool:
        return type(self).closed_form is not TrainingAlgorithm.closed_form

    def samples_per_step(self, plan: Plan, per_device_batch: int) -> int:
        """Samples the whole run consumes per step of every worker."""
        return len(plan.workers) * per_device_batch

    def peers(self, plan: Plan) -> list[tuple[int, int]]:
        """(sender, receiver) of the point-to-point messages the program sends, where it knows them
        ahead (an executor may route them in one batch); none by default."""
        return []


TRAINING_ALGORITHMS: Registry[TrainingAlgorithm] = Registry(
    "training algorithm", package="ddlsim.algorithms", suffix="_training"
)


def check_server_placement(algorithm: TrainingAlgorithm, options: AlgorithmOptions, nodes: int) -> None:
    """Servers live one per node (on the node's first device): more servers than nodes is an error."""
    if algorithm.uses_servers and options.servers > nodes:
        raise TrainingAlgorithmError(
            f"{algorithm.name}: {options.servers} servers but only {nodes} node(s); "
            "servers are placed one per node, so use at most as many servers as nodes"
        )
