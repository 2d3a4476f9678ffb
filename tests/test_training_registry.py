"""Every registered training algorithm through every executor that applies, from its one file.

Picked up from the registry: a new ``<name>_training.py`` is run here without touching this file.
The real harness runs every algorithm too (tests/test_algorithms_mpi.py, under mpiexec).
"""

from __future__ import annotations

import dataclasses

import pytest

from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, make_options
from ddlsim.simulator.closed_form.training import closed_form_result
from ddlsim.simulator.executor.des import run_des
from ddlsim.simulator.scenario import Scenario, ScenarioError

# Two nodes of two Skylake sockets (UPI between them): every algorithm can place its roles, and
# one NIC per device keeps the devices of a node from sharing a port (no contention where none is meant).
BASE = Scenario(
    workload="lenet", device="xeon_8160", devices_per_node=2, intra_node="upi", network="opa_100",
    nics_per_node=2, nodes=(2,), updates=4,
)  # fmt: skip
NAMES = TRAINING_ALGORITHMS.names()


# a transformer layout: GPT-2 on 2 nodes of 2 A100, tensor parallel inside a node, pipeline across
LAYOUT = Scenario(
    workload="gpt2", device="a100_sxm4", devices_per_node=2, intra_node="nvswitch2", network="ib_hdr",
    nics_per_node=2, nodes=(2,), precision="bf16", algorithm="megatron",
    options=make_options("megatron", {"layout": {"tp": 2, "pp": 2, "micro_batch": 2, "global_batch": 8}}),
)  # fmt: skip


def scenario_for(name: str) -> Scenario:
    if name == "megatron":
        return LAYOUT
    options = {"tau": 2} if "tau" in TRAINING_ALGORITHMS.get(name).options else {}
    return dataclasses.replace(BASE, algorithm=name, options=make_options(name, options))


@pytest.mark.parametrize("name", NAMES)
def test_both_event_paths_agree(name):
    """The round-at-a-time path (where it can prove its times) and the message path give one timeline."""
    scenario = scenario_for(name)
    auto = run_des(scenario, 2).result
    exact = run_des(scenario, 2, mode="message").result
    assert auto.time_s == pytest.approx(exact.time_s, rel=1e-9)
    assert auto.comm_share == pytest.approx(exact.comm_share, rel=1e-9)
    assert auto.workers + auto.servers <= 4


@pytest.mark.parametrize("name", NAMES)
def test_the_closed_form_equals_the_event_simulation_where_it_exists(name):
    scenario = scenario_for(name)
    if not TRAINING_ALGORITHMS.get(name).has_closed_form:
        with pytest.raises(ScenarioError, match="has no closed form"):
            closed_form_result(scenario, 2)
        return
    des = run_des(scenario, 2).result
    closed = closed_form_result(scenario, 2)
    assert closed.time_s == pytest.approx(des.time_s, rel=1e-9)
    if name not in ("megatron", "hybrid_parallel"):
        # pipelines' messages wait on their receivers: their closed forms count collectives only
        assert closed.comm_s == pytest.approx(des.comm_s, rel=1e-9)


def test_algorithms_with_a_closed_form():
    """The synchronous all-reduce algorithms have one; the others depend on the order of events."""
    names = {name for name in NAMES if TRAINING_ALGORITHMS.get(name).has_closed_form}
    assert names == {"sync_sgd", "sync_easgd", "megatron", "hybrid_parallel"}


@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_plans_exactly_the_ranks_a_real_run_has(name):
    algorithm = TRAINING_ALGORITHMS.get(name)
    options = make_options(name, {"stages": 2} if "stages" in algorithm.options else {})
    if name == "megatron":
        options = LAYOUT.options
    plan = algorithm.plan_exactly(4, 3, options)
    assert plan.ranks == 4 and len(plan.workers) + len(plan.servers) + len(plan.helpers) == 4
