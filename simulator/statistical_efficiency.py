"""Statistical efficiency: how many updates a training algorithm needs to reach a target accuracy.

Throughput says how fast updates happen; this model says how many are needed. Time to accuracy is
their product: ``time_to_accuracy_s = steps_to_target x seconds_per_step``.

Form (every factor >= 1, each from a published observation)::

    steps_to_target = S_min(target) x (1 + B_crit / B) x (1 + c_stale x s) x (1 + c_period x (tau - 1))

* ``S_min(target) = -T ln(1 - target / a_max)``: the accuracy curve approaches its ceiling a_max
  exponentially with time constant T (in steps at a very large batch). Targets at or above a_max
  are unreachable (an error).
* ``1 + B_crit / B``: steps fall with the batch B per update until about the critical batch
  B_crit, then stop falling: McCandlish, Kaplan, Amodei et al., "An empirical model of large-batch
  training" (2018), eq. 2.11, S = S_min (1 + B_noise / B), with B_crit ~ B_noise; it is the
  large-batch penalty Goyal et al. ("Accurate, large minibatch SGD", 2017) meet beyond about 8k
  images for ResNet-50 on ImageNet.
* ``1 + c_stale x s``: asynchronous updates computed on weights s updates old need more steps,
  roughly linearly in the mean staleness s: Dai, Zhou, Dai, Xing et al., "Toward understanding the
  impact of staleness in distributed machine learning" (ICLR 2019, arXiv 2018), Fig. 1-2; Zhang,
  Gupta, Lian, Liu, "Staleness-aware async-SGD" (IJCAI 2016), who divide the learning rate by s to
  keep convergence and so pay about a factor s on the stale part of the progress.
* ``1 + c_period x (tau - 1)``: elastic averaging with communication period tau drifts the workers
  apart between exchanges (Zhang, Choromanska, LeCun 2015, Fig. 3-4: tau up to 10 costs little).

Units of a step: the update the algorithm applies. ``synchronous`` and ``elastic`` families: one
step of every worker together, batch B = workers x per-worker batch; ``asynchronous``: one
gradient applied by a server, B = the per-worker batch.

The constants are defaults to be calibrated (``calibrate`` issue); the real-run check in
``tests/mpi`` confirms the direction on the digits task: steps to a target loss grow with staleness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddlsim.simulator.scenario import ScenarioError

FAMILIES = ("synchronous", "asynchronous", "elastic")


class StatisticalModelError(ScenarioError):
    """Impossible statistical-model input (an unreachable target, a negative staleness...)."""


@dataclass(frozen=True)
class ConvergenceProfile:
    """How one workload converges: ceiling ``max_accuracy``, time constant ``steps_scale`` (steps at a
    very large batch), critical batch ``critical_batch`` (samples), staleness and period costs."""

    max_accuracy: float
    steps_scale: float
    critical_batch: float
    staleness_cost: float = 0.05
    period_cost: float = 0.02
    source: str = ""


# Rough defaults. ImageNet models: top-1 ceilings of the torchvision references; steps_scale chosen
# so that 90 epochs at batch 256 (450k steps) reach about 99% of the ceiling with B_crit ~ 8k
# (Goyal et al. 2017; McCandlish et al. 2018 estimate B_noise ~ 1e4 late in ImageNet training).
# digits: fitted to the real runs of real_runs/algorithm_runs.py (sklearn digits, small MLP).
PROFILES: dict[str, ConvergenceProfile] = {
    "resnet50": ConvergenceProfile(0.761, 3000.0, 8192.0, source="torchvision top-1; Goyal 2017; McCandlish 2018"),
    "resnet101": ConvergenceProfile(0.774, 3000.0, 8192.0, source="torchvision top-1; as resnet50"),
    "resnet152": ConvergenceProfile(0.783, 3000.0, 8192.0, source="torchvision top-1; as resnet50"),
    "alexnet": ConvergenceProfile(0.565, 2000.0, 4096.0, source="torchvision top-1; You et al. 2017 (LARS)"),
    "googlenet": ConvergenceProfile(0.698, 2500.0, 4096.0, source="torchvision top-1"),
    "inception_v3": ConvergenceProfile(0.773, 3000.0, 8192.0, source="torchvision top-1"),
    "vgg16": ConvergenceProfile(0.716, 2500.0, 4096.0, source="torchvision top-1"),
    "lenet": ConvergenceProfile(0.99, 300.0, 512.0, source="MNIST; rough"),
    "transformer_base": ConvergenceProfile(0.95, 5000.0, 16384.0, source="rough; accuracy as a proxy"),
    "digits": ConvergenceProfile(0.97, 10.0, 64.0, 0.05, 0.02, source="real runs on sklearn digits"),
}
GENERIC = ConvergenceProfile(0.9, 1000.0, 4096.0, source="generic default")


def profile_for(workload: str) -> ConvergenceProfile:
    return PROFILES.get(workload, GENERIC)


def steps_to_target(
    target_accuracy: float,
    batch: float,
    staleness: float = 0.0,
    tau: int = 1,
    profile: ConvergenceProfile = GENERIC,
) -> float:
    """Updates of batch ``batch`` to reach ``target_accuracy`` with mean staleness ``staleness``.

    Example (calculator): a_max 0.9, T 1000, B_crit 4096, target 0.6, B 4096, s 0, tau 1:
    S_min = -1000 ln(1 - 0.6/0.9) = 1098.6; x (1 + 1) = 2197.2 steps.
    """
    if not 0.0 < target_accuracy < profile.max_accuracy:
        raise StatisticalModelError(
            f"--target-accuracy {target_accuracy!r} is not reachable: it must lie in (0, {profile.max_accuracy}) "
            "for this workload"
        )
    if not batch > 0:
        raise StatisticalModelError(f"batch must be > 0, got {batch!r}")
    if not staleness >= 0:
        raise StatisticalModelError(f"staleness must be >= 0, got {staleness!r}")
    if tau < 1:
        raise StatisticalModelError(f"tau must be >= 1, got {tau!r}")
    minimum = -profile.steps_scale * math.log(1.0 - target_accuracy / profile.max_accuracy)
    return (
        minimum
        * (1.0 + profile.critical_batch / batch)
        * (1.0 + profile.staleness_cost * staleness)
        * (1.0 + profile.period_cost * (tau - 1))
    )


@dataclass(frozen=True)
class TimeToAccuracy:
    steps_to_target: float
    seconds_per_step: float
    batch_per_step: float

    @property
    def time_to_accuracy_s(self) -> float:
        return self.steps_to_target * self.seconds_per_step


def time_to_accuracy(
    family: str,
    target_accuracy: float,
    time_s: float,
    workers: int,
    updates_per_worker: int,
    per_worker_batch: int,
    staleness: float = 0.0,
    tau: int = 1,
    profile: ConvergenceProfile = GENERIC,
) -> TimeToAccuracy:
    """Time to ``target_accuracy`` from a simulated run that took ``time_s`` for ``updates_per_worker``
    steps on each of ``workers`` workers (see the module docstring for what a step is per family)."""
    if family not in FAMILIES:
        raise StatisticalModelError(f"unknown algorithm family {family!r}; valid: {', '.join(FAMILIES)}")
    if family == "asynchronous":
        steps_run = workers * updates_per_worker
        batch = float(per_worker_batch)
    else:
        steps_run = updates_per_worker
        batch = float(workers * per_worker_batch)
    steps = steps_to_target(target_accuracy, batch, staleness, tau, profile)
    return TimeToAccuracy(steps, time_s / steps_run, batch)


def fit_staleness_cost(staleness: list[float], steps: list[float]) -> tuple[float, float]:
    """Least-squares fit of steps = s0 (1 + c s): returns (s0, c). Used by the real-run check."""
    n = len(staleness)
    if n < 2 or n != len(steps):
        raise StatisticalModelError("need at least two (staleness, steps) points of equal length")
    mean_x = sum(staleness) / n
    mean_y = sum(steps) / n
    sxx = sum((x - mean_x) ** 2 for x in staleness)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(staleness, steps, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    return intercept, slope / intercept
