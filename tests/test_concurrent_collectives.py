"""Two collectives in flight together on the round path (``lockstep``), held to the message path.

hybrid_parallel's two pipeline stages each run a ring all-reduce across the nodes through every
node's one NIC; on a slow network the last stage's all-reduce is still running when the first
stage's enters, so the two share every NIC link for a while.
"""

import dataclasses

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.training_algorithm import make_options
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.engine.collective_engine import ContentionDetected, VectorisedExecutor
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec
from ddlsim.simulator.engine.lockstep import LockstepRound, lockstep_exits
from ddlsim.simulator.executor.des import run_des
from ddlsim.simulator.scenario import Scenario

SKYLAKE = Scenario(
    workload="alexnet", device="xeon_8160", devices_per_node=2, intra_node="upi", network="eth_25g",
    algorithm="hybrid_parallel", options=make_options("hybrid_parallel", {}), nodes=(4,), updates=3,
)  # fmt: skip


def test_lockstep_shares_a_link_while_both_flow():
    """A: 10 bytes from t=0; B: 4 bytes from t=2, after an overhead of 1. Alone each flow gets 1 B/s,
    together 0.5 each: A drains 3 bytes alone until B's flow starts at 3, then both run at 0.5
    until B's 4 bytes are done at 11 (A has 3 left), then A alone again until 14, plus 1 s of latency."""
    a = [LockstepRound(flows=1, overhead_s=0.0, latency_s=1.0, nbytes=10.0, reduce_s=0.0)]
    b = [LockstepRound(flows=2, overhead_s=1.0, latency_s=0.0, nbytes=4.0, reduce_s=0.0)]

    def rates(key):
        together = all(k is not None for k in key)
        return tuple(0.5 if together else 1.0 for _ in key)

    (a_exit, a_end), (b_exit, b_end) = lockstep_exits([a, b], [0.0, 2.0], rates)
    assert (b_end, b_exit) == pytest.approx((11.0, 11.0))
    assert (a_end, a_exit) == pytest.approx((14.0, 15.0))


def test_lockstep_repeats_rounds_and_adds_reductions():
    rounds = [LockstepRound(flows=1, overhead_s=0.5, latency_s=0.25, nbytes=2.0, reduce_s=0.25, count=3)]
    ((exit_s, last_end),) = lockstep_exits([rounds], [1.0], lambda key: (2.0,))
    assert last_end == pytest.approx(1.0 + 2 * 2.0 + 0.5 + 1.0)
    assert exit_s == pytest.approx(1.0 + 3 * 2.0)


def _spy(monkeypatch) -> list[int]:
    """Count the calls of the joint path (so a test knows it ran, not just that times agree)."""
    calls: list[int] = []
    original = VectorisedExecutor.run_concurrently

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(VectorisedExecutor, "run_concurrently", counted)
    return calls


def _assert_same_run(fast, exact):
    assert fast.finish_s == pytest.approx(exact.finish_s, rel=1e-9)
    assert fast.result.time_s == pytest.approx(exact.result.time_s, rel=1e-9)
    assert fast.result.comm_s == pytest.approx(exact.result.comm_s, rel=1e-9)


@pytest.mark.parametrize("nodes", [2, 4, 8, 16])
def test_stage_all_reduces_in_flight_together_on_a_switch(monkeypatch, nodes):
    calls = _spy(monkeypatch)
    scenario = dataclasses.replace(SKYLAKE, nodes=(nodes,))
    fast = run_des(scenario, nodes)
    assert fast.result.path == "vectorised"
    assert len(calls) >= scenario.updates  # every step's two all-reduces met
    _assert_same_run(fast, run_des(scenario, nodes, mode="message"))


def test_stage_all_reduces_that_do_not_meet_need_no_joint_timing(monkeypatch):
    """On Omni-Path the last stage's all-reduce of 16 nodes is over before the first stage's enters."""
    calls = _spy(monkeypatch)
    scenario = dataclasses.replace(SKYLAKE, network="opa_100", nodes=(16,))
    fast = run_des(scenario, 16)
    assert fast.result.path == "vectorised" and not calls
    _assert_same_run(fast, run_des(scenario, 16, mode="message"))


@pytest.mark.parametrize(
    "change",
    [
        {"topology": "fat_tree", "nodes_per_leaf": 4},  # ring hops across leaves take longer routes
        {"stragglers": "lognormal:0.2"},  # the stages enter their all-reduces at different times
    ],
)
def test_stage_all_reduces_not_in_lockstep_are_timed_as_the_message_path(change):
    scenario = dataclasses.replace(SKYLAKE, nodes=(8,), **change)
    fast = run_des(scenario, 8)
    _assert_same_run(fast, run_des(scenario, 8, mode="message"))



def _two_socket_rings():
    fabric = Fabric(FabricSpec(nodes=4, devices_per_node=2, peer_link=load_link("upi"), network=load_link("eth_25g")))
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 4)
    return VectorisedExecutor(fabric), schedule, np.array([0, 2, 4, 6]), np.array([1, 3, 5, 7])


def test_a_checkpoint_is_not_restored_over_another_operation():
    """Undoing a collective and the one that met it would also undo a message sent in between."""
    executor, schedule, first, second = _two_socket_rings()
    checkpoint = executor.checkpoint()
    executor.run(schedule, 1e6, 0.0, members=first)
    executor.transfer(1, 3, 1e3, 100.0)  # long after the ring: it meets nothing
    with pytest.raises(ContentionDetected):
        executor.run(schedule, 1e6, 0.0, members=second)
    with pytest.raises(ContentionDetected, match="another operation"):
        executor.restore(checkpoint, calls=2)


def test_members_entering_apart_are_not_in_lockstep():
    executor, schedule, first, second = _two_socket_rings()
    apart = np.array([0.0, 0.0, 1e-6, 0.0])
    with pytest.raises(ContentionDetected, match="different times"):
        executor.run_concurrently([(schedule, 1e6, np.zeros(4), first), (schedule, 1e6, apart, second)])
