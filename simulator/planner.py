"""The layout planner behind ``ddlsim plan``: every valid layout of a transformer on N GPUs, ranked.

A search is three steps:

1. ``candidate_layouts`` enumerates TP x PP x DP x CP x EP, micro-batch, virtual stages, ZeRO stage
   and recomputation under the layout rules (``algorithms.parallel_layout.check_layout``) and
   Megatron's own: TP inside a node's NVLink domain (at most its devices per node), sequence
   parallelism whenever TP > 1, interleaving only with PP > 1 and micro-batches a multiple of PP,
   a global batch that divides into micro-batches x DP. ``fixed`` pins any field the user gives.
2. ``screen`` keeps the layouts whose fullest pipeline rank fits the device
   (``simulator.workloads.transformer_memory.peak_memory``, about 1 ms a layout); the others are
   kept with their reason.
3. ``evaluate`` runs the ``megatron`` closed form (``simulator.closed_form.training``, about 10 ms
   a layout: the pipeline recurrence over one pipeline's tasks with the collectives' closed forms)
   for every layout that fits, over the pools sweeps use when asked (``simulator.sweep.run_tasks``:
   local processes, or ``mpi4py.futures`` under mpiexec for a search too big for one machine), and
   ranks by tokens/s.

``branch_and_bound`` does steps 2 and 3 only where they can matter: it bounds every layout's
iteration from below (``planner_bounds``: microseconds a layout), walks them by increasing bound,
and stops when the bound reaches the K-th best time found. Its top K are the exhaustive search's.

``recheck`` runs the event simulation of the best few (contention the closed form does not see),
one layout a task over the same pools.
All figures are the closed form's; the DES of the same layout equals it where nothing contends.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddlsim.algorithms.parallel_layout import LayoutError, ParallelLayout, check_layout, default_grad_reduce_in_fp32
from ddlsim.hardware_models.catalog import load_device
from ddlsim.simulator.parsing import InputError
from ddlsim.simulator.scenario import Scenario
from ddlsim.simulator.workloads.transformer import TransformerConfig, load_transformer

MICRO_BATCHES = (1, 2, 4, 8)
VIRTUAL_STAGES = (1, 2, 3, 4, 6, 8)
CONTEXT_PARALLEL = (1, 2, 4, 8)
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
SEARCHED = ("tp", "pp", "cp", "ep", "micro_batch", "virtual_stages", "zero_stage", "recompute")


@dataclass(frozen=True)
class Cluster:
    """What the layouts run on: ``gpus`` devices, ``devices_per_node`` to a node, its links."""

    device: str
    gpus: int
    devices_per_node: int
    intra_node: str | None
    network: str
    nics_per_node: int
    precision: str = "bf16"
    # the software stack every layout runs with: megatron options and layout switches that are not
    # searched (overlap_grad_reduce, overlap_param_gather, bucket_bytes, collective, tp_comm_overlap,
    # grad_reduce_in_fp32, frozen_weights for LoRA-style fine-tuning), as (name, value) pairs
    stack: tuple[tuple[str, Any], ...] = ()

    @property
    def nodes(self) -> int:
        return self.gpus // self.devices_per_node

    def stack_value(self, name: str, default: Any) -> Any:
        return dict(self.stack).get(name, default)

    @property
    def collective(self) -> str:
        """The data-parallel collectives' algorithm: the stack's, or the device's default."""
        return str(self.stack_value("collective", default_collective(self.device)))

    @classmethod
    def of(cls, device: str, gpus: int, precision: str = "bf16", stack: tuple[tuple[str, Any], ...] = ()) -> Cluster:
        """``gpus`` of ``device`` in its catalog node (DGX-like: devices per node, NVLink, NICs)."""
        spec = load_device(device)
        if spec.system is None:
            raise InputError(f"device {device!r} has no node in the catalog ([system]); plan needs one")
        system = spec.system
        if isinstance(gpus, bool) or gpus < 1 or gpus % system.devices_per_node:
            raise InputError(
                f"--gpus must be a positive multiple of {device}'s {system.devices_per_node} devices per node, "
                f"got {gpus}"
            )
        return cls(device, gpus, system.devices_per_node, system.intra_node_link, system.network,
                   system.nics_per_node, precision, stack)  # fmt: skip


PRUNED = "pruned"  # the reason's first word for a layout the bound showed cannot make the top


@dataclass
class Candidate:
    """One layout and what the search learnt of it (``reason`` says why it was dropped)."""

    layout: ParallelLayout
    memory_bytes: float = 0.0
    reason: str = ""
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def pruned(self) -> bool:
        return self.reason.startswith(PRUNED)

    def row(self) -> dict[str, Any]:
        layout = self.layout
        row: dict[str, Any] = {name: getattr(layout, name) for name in (*SEARCHED[:2], "dp", *SEARCHED[2:])}
        row["sequence_parallel"] = layout.sequence_parallel
        row["memory_GB"] = self.memory_bytes / 1e9
        row.update(self.figures)
        row["reason"] = self.reason
        return row


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(
    config: TransformerConfig, cluster: Cluster, global_batch: int, fixed: Mapping[str, Any] | None = None
) -> Iterator[ParallelLayout]:
    """Every layout of ``config`` on the cluster that the layout rules accept (see the module docstring)."""
    fixed = dict(fixed or {})
    choices: dict[str, Iterable[Any]] = {
        "tp": _divisors(cluster.devices_per_node),
        "pp": _divisors(config.total_layers),
        "cp": CONTEXT_PARALLEL,
        "ep": _divisors(config.moe.experts) if config.moe is not None else (1,),
        "micro_batch": MICRO_BATCHES,
        "virtual_stages": VIRTUAL_STAGES,
        "zero_stage": ZERO_STAGES,
        "recompute": RECOMPUTE,
    }
    for name, value in fixed.items():
        choices[name] = (value,)
    frozen = bool(cluster.stack_value("frozen_weights", False))
    for values in itertools.product(*(choices[name] for name in SEARCHED)):
        chosen = dict(zip(SEARCHED, values, strict=True))
        tp, pp, cp, ep, micro = chosen["tp"], chosen["pp"], chosen["cp"], chosen["ep"], chosen["micro_batch"]
        if cluster.gpus % (tp * pp * cp):
            continue
        dp = cluster.gpus // (tp * pp * cp)
        if "dp" in fixed and fixed["dp"] != dp:
            continue
        if global_batch % (micro * dp) or (dp * cp) % ep:
            continue
        micro_batches = global_batch // (micro * dp)
        virtual = chosen["virtual_stages"]
        if virtual > 1 and (pp == 1 or micro_batches % pp):
            continue
        if dp == 1 and chosen["zero_stage"] > 0 and "zero_stage" not in fixed:
            continue  # nothing to shard over one replica: ZeRO 0 is the same layout
        if frozen and chosen["zero_stage"] in (1, 2) and "zero_stage" not in fixed:
            continue  # frozen weights have no gradients or optimizer states to shard: ZeRO 0 again
        precision = cluster.precision
        layout = ParallelLayout(
            tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, micro_batch=micro, global_batch=global_batch,
            virtual_stages=virtual, sequence_parallel=tp > 1, zero_stage=chosen["zero_stage"],
            recompute=chosen["recompute"], precision=precision,
            grad_reduce_in_fp32=cluster.stack_value("grad_reduce_in_fp32", default_grad_reduce_in_fp32(precision)),
            tp_comm_overlap=tp > 1 and cluster.stack_value("tp_comm_overlap", False),
            fp8_attention_and_logits=cluster.stack_value("fp8_attention_and_logits", False),
            frozen_weights=frozen,
        )  # fmt: skip
        try:
            check_layout(layout, config, cluster.gpus)
        except LayoutError:
            continue
        yield layout


def screen(config: TransformerConfig, cluster: Cluster, layouts: Iterable[ParallelLayout]) -> list[Candidate]:
    """Each layout with its fullest rank's bytes; ``reason`` set where it does not fit."""
    capacity = load_device(cluster.device).memory_capacity_bytes
    return [_screened(config, layout, capacity) for layout in layouts]


def _screened(config: TransformerConfig, layout: ParallelLayout, capacity: float) -> Candidate:
    """``layout`` with its fullest rank's bytes, and the reason if they exceed ``capacity``."""
    from ddlsim.simulator.workloads.transformer_memory import peak_memory

    peak = peak_memory(config, layout)
    reason = "" if peak.fits(capacity) else f"needs {peak.total / 1e9:.1f} GB of {capacity / 1e9:.1f} GB"
    return Candidate(layout, peak.total, reason)


def scenario_of(
    model: str, cluster: Cluster, layout: ParallelLayout, changes: tuple[tuple[str, int], ...] = ()
) -> Scenario:
    """The ``megatron`` scenario of one layout (memory already screened); ``changes`` as a published
    run makes them to the catalog model (``Scenario.transformer_changes``)."""
    from ddlsim.algorithms.training_algorithm import make_options

    options = {name: value for name, value in cluster.stack if name in STACK_OPTIONS}
    options["collective"] = cluster.collective
    return Scenario(
        workload=model, algorithm="megatron", device=cluster.device, devices_per_node=cluster.devices_per_node,
        intra_node=cluster.intra_node, network=cluster.network, nics_per_node=cluster.nics_per_node,
        precision=cluster.precision, nodes=(cluster.nodes,), enforce_memory=False, transformer_changes=changes,
        options=make_options("megatron", {"layout": layout, **options}),
    )  # fmt: skip


def default_collective(device: str) -> str:
    """The data-parallel collectives' algorithm of a layout's stack: NCCL on GPUs (Megatron-LM, NeMo and
    DeepSpeed all reduce through it), its channels spread over every NIC beside the group's GPUs; a
    plain ring on other accelerators."""
    return "nccl" if load_device(device).kind == "gpu" else "ring"


STACK_OPTIONS = ("overlap_grad_reduce", "overlap_param_gather", "bucket_bytes", "collective")  # megatron's options


FIGURES = ("iteration_s", "tokens_per_s", "tflops_per_gpu", "mfu", "compute_s", "tp_s", "cp_s", "ep_s", "zero3_s",
           "pipeline_wait_s", "dp_wait_s")  # fmt: skip


def closed_form_figures(task: tuple) -> dict[str, float]:
    """One layout's closed-form figures (a top-level function: process pools pickle it). ``task`` is
    (model, cluster, layout) or (model, cluster, layout, transformer changes)."""
    from ddlsim.simulator.closed_form.training import closed_form_result

    model, cluster, layout, *changes = task
    row = closed_form_result(scenario_of(model, cluster, layout, *changes), cluster.nodes).row(1)
    return {name: float(row[name]) for name in FIGURES if row.get(name) not in (None, "")}


def closed_form_block(tasks: list[tuple[str, Cluster, ParallelLayout]]) -> list[dict[str, float]]:
    """``closed_form_figures`` of a block of layouts: a pool's task (one layout each would cost
    more in messages than in work)."""
    return [closed_form_figures(task) for task in tasks]


def evaluate(
    model: str,
    cluster: Cluster,
    candidates: list[Candidate],
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    pool: str = "auto",
) -> list[Candidate]:
    """The candidates that fit, with their closed-form figures, fastest (most tokens/s) first; over
    ``workers`` processes of ``pool`` (``simulator.sweep.run_tasks``: serial, a process pool, or
    ``mpi4py.futures`` under mpiexec) in blocks of layouts."""
    from ddlsim.simulator.sweep import run_tasks

    fitting = [candidate for candidate in candidates if not candidate.reason]
    tasks = [(model, cluster, candidate.layout) for candidate in fitting]
    size = max(1, min(256, len(tasks) // (workers * 16))) if workers > 1 else 1  # serial: progress per layout
    blocks = [tasks[index : index + size] for index in range(0, len(tasks), size)]
    done = 0

    def count(_index: int, figures: list[dict[str, float]]) -> None:
        nonlocal done
        done += len(figures)
        if progress is not None:
            progress(done, len(fitting))

    results = run_tasks(closed_form_block, blocks, workers, pool, on_result=count)
    for candidate, figures in zip(fitting, (row for block in results for row in block), strict=True):
        candidate.figures = figures
    return sorted(fitting, key=lambda candidate: -candidate.figures["tokens_per_s"])


def branch_and_bound(
    model: str,
    config: TransformerConfig,
    cluster: Cluster,
    layouts: list[ParallelLayout],
    keep: int,
    progress: Callable[[int, int], None] | None = None,
    tolerance: float = 0.0,
    changes: tuple[tuple[str, int], ...] = (),
) -> tuple[list[Candidate], list[Candidate]]:
    """The ``keep`` fastest layouts that fit, exactly as the exhaustive search ranks them, evaluating
    only layouts whose lower bound (``planner_bounds``) is below the ``keep``-th best time found.
    With ``tolerance`` t > 0 it also skips layouts that could be at most a fraction t faster than
    the ``keep``-th best: the layouts it returns are then each within t of the exhaustive search's.
    ``config`` may differ from the catalog's ``model`` by ``changes`` (a published run's sequence
    length, vocabulary or shape), which the timing applies too.

    Layouts are walked by decreasing ceiling (tokens per iteration / the bound); each is screened for
    memory and, if it fits, timed by the closed form. Once ``keep`` layouts are timed and the next
    ceiling is at most the slowest of them, no remaining layout can enter the top ``keep`` (its rate
    is at most its ceiling): they are kept with the reason ``pruned``. Returns (the timed layouts
    fastest first, every candidate).
    """
    import heapq

    from ddlsim.algorithms.megatron_training import micro_batches
    from ddlsim.simulator.planner_bounds import LowerBounds

    bounds = LowerBounds(model, config, cluster, changes)
    bound = bounds.bounds(layouts)
    tokens = bounds.blocks[-1].tokens  # per sequence, as the closed form's tokens/s counts them
    ceiling = [micro_batches(layout) * layout.micro_batch * layout.dp * tokens / seconds
               for layout, seconds in zip(layouts, bound, strict=True)]  # fmt: skip
    order = sorted(range(len(layouts)), key=lambda index: -ceiling[index])
    capacity = load_device(cluster.device).memory_capacity_bytes
    candidates: list[Candidate | None] = [None] * len(layouts)
    best: list[tuple[float, int]] = []  # min-heap of the kept tokens/s
    timed: list[Candidate] = []
    for walked, index in enumerate(order, start=1):
        layout = layouts[index]
        if len(best) >= keep and ceiling[index] <= best[0][0] * (1 + tolerance):
            for rest in order[walked - 1 :]:
                candidates[rest] = Candidate(
                    layouts[rest], float("nan"),
                    f"{PRUNED}: at most {ceiling[rest]:.4g} tokens/s (at least {bound[rest]:.4g} s per iteration), "
                    f"not faster than the best {keep}" + (f" by more than {tolerance:.1%}" if tolerance else ""),
                    {"iteration_lower_bound_s": bound[rest]},
                )  # fmt: skip
            break
        candidate = candidates[index] = _screened(config, layout, capacity)
        if not candidate.reason:
            candidate.figures = closed_form_figures((model, cluster, layout, changes))
            candidate.figures["iteration_lower_bound_s"] = bound[index]
            timed.append(candidate)
            heapq.heappush(best, (candidate.figures["tokens_per_s"], index))
            if len(best) > keep:
                heapq.heappop(best)
        if progress is not None:
            progress(walked, len(layouts))
    ranked = sorted(timed, key=lambda candidate: -candidate.figures["tokens_per_s"])
    return ranked, [candidate for candidate in candidates if candidate is not None]


def train_time(candidate: Candidate, tokens: float, gpus: int, price_per_gpu_hour: float) -> dict[str, float]:
    """Days and cost to train ``tokens`` at this layout's rate."""
    seconds = tokens / candidate.figures["tokens_per_s"]
    return {"train_days": seconds / 86400, "train_cost": seconds / 3600 * gpus * price_per_gpu_hour}


def event_simulated(task: tuple[str, Cluster, ParallelLayout]) -> dict[str, Any]:
    """One layout's event simulation: its iteration and the path it ran on (a pool's task)."""
    from ddlsim.simulator.executor.des import run_des

    model, cluster, layout = task
    result = run_des(scenario_of(model, cluster, layout), cluster.nodes).result
    return {"des_iteration_s": result.iteration_s, "path": result.path}


def recheck(
    model: str, cluster: Cluster, candidates: list[Candidate], workers: int = 1, pool: str = "auto"
) -> list[dict[str, Any]]:
    """The event simulation of each candidate against its closed form, over ``workers`` processes
    of ``pool`` (as ``evaluate``), one layout a task, the results in the candidates' order."""
    from ddlsim.simulator.sweep import run_tasks

    tasks = [(model, cluster, candidate.layout) for candidate in candidates]
    simulated = run_tasks(event_simulated, tasks, min(workers, max(1, len(tasks))), pool)
    return [{"des_iteration_s": row["des_iteration_s"], "closed_form_iteration_s": candidate.figures["iteration_s"],
             "path": row["path"]} for candidate, row in zip(candidates, simulated, strict=True)]  # fmt: skip


def load_model(model: str) -> TransformerConfig:
    """The catalog transformer ``model`` (an unknown name is one line naming the valid ones)."""
    return load_transformer(model)


def layout_text(layout: ParallelLayout) -> str:
    """``tp8 pp4 dp32 v3 mb1 zero1 sp`` and so on: the fields that differ from one GPU's layout."""
    parts = [f"tp{layout.tp}", f"pp{layout.pp}", f"dp{layout.dp}"]
    parts += [f"cp{layout.cp}"] * (layout.cp > 1) + [f"ep{layout.ep}"] * (layout.ep > 1)
    parts += [f"v{layout.virtual_stages}"] * (layout.virtual_stages > 1)
    parts += [f"mb{layout.micro_batch}", f"zero{layout.zero_stage}"]
    parts += ["sp"] * layout.sequence_parallel + [f"recompute-{layout.recompute}"] * (layout.recompute != "none")
    return " ".join(parts)


def same_layout(a: ParallelLayout, b: ParallelLayout) -> bool:
    """Equal in every searched field (precision and flags the search does not vary aside)."""
    keys = ("tp", "pp", "dp", "cp", "ep", "micro_batch", "virtual_stages", "zero_stage", "recompute")
    return all(getattr(a, key) == getattr(b, key) for key in keys)


__all__ = [
    "Candidate", "Cluster", "branch_and_bound", "candidate_layouts", "closed_form_block", "closed_form_figures",
    "evaluate", "event_simulated", "layout_text", "load_model", "recheck", "same_layout", "scenario_of", "screen",
    "train_time",
]  # fmt: skip
