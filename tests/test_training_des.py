"""The training DES against the closed form, and the directions scaling must take."""

import dataclasses
import gc

import numpy as np
import pytest

from ddlsim.algorithms.training_algorithm import AlgorithmOptions, make_options
from ddlsim.simulator.closed_form.training import closed_form_result
from ddlsim.simulator.executor.des import DES_GC_THRESHOLD, fewer_collections, run_des
from ddlsim.simulator.executor.role_executor import RoleExecutor
from ddlsim.simulator.parsing import parse_counts
from ddlsim.simulator.scenario import Scenario
from ddlsim.simulator.sweep import run_sweep, simulate_point
from ddlsim.simulator.training.trainers import layer_times, step_profile
from tests.test_training_algorithms import GPU_NODE

SMALL = Scenario(
    workload="resnet50",
    device="p100_sxm2",
    devices_per_node=4,
    intra_node="nvlink1",
    network="ib_edr",
    nodes=(1, 2, 4),
)


@pytest.mark.parametrize("nodes", [1, 2, 3, 8])
@pytest.mark.parametrize("overlap", [True, False])
def test_des_equals_closed_form_without_contention(nodes, overlap):
    scenario = dataclasses.replace(SMALL, options=AlgorithmOptions(overlap=overlap), updates=2)
    des = run_des(scenario, nodes).result
    closed = closed_form_result(scenario, nodes)
    assert des.iteration_s == pytest.approx(closed.iteration_s, rel=1e-6)


@pytest.mark.parametrize("nodes", [2, 4, 8])
@pytest.mark.parametrize(
    "collective_options",
    [{"placement": "per_node"}, {"inner": "parameter_server", "inner_options": {"placement": "colocated"}}],
)
def test_parameter_server_training_closed_form_is_the_des(nodes, collective_options):
    """Synchronous SGD through parameter servers on P100 hosts over 10 GbE, flat (one server per host,
    as distributed TensorFlow deploys them) and hierarchical (TensorFlow's distributed_replicated, as
    the published rows run): the closed form charges the servers' incast as the DES does. It charged
    one shard each way, so from 4 hosts up the two disagreed (the Horovod entry's parameter server on
    32 hosts: 99.9 % efficiency in the closed form, 92.6 % in the DES)."""
    collective = "hierarchical" if "inner" in collective_options else "parameter_server"
    options = dict(collective_options)
    if collective == "hierarchical":
        options["inner_options"] = {"placement": "colocated", "servers": nodes}
    scenario = Scenario(
        workload="vgg16", device="p100_pcie", devices_per_node=8, intra_node="pcie3_x16", network="eth_10g",
        nodes=(nodes,), options=AlgorithmOptions(collective=collective, collective_options=options),
    )  # fmt: skip
    des = run_des(scenario, nodes).result
    closed = closed_form_result(scenario, nodes)
    assert closed.iteration_s == pytest.approx(des.iteration_s, rel=1e-3)
    assert des.iteration_s > 1.05 * des.compute_s or nodes == 2  # the incast shows in the step


def test_message_level_des_equals_vectorised():
    scenario = dataclasses.replace(SMALL, devices_per_node=2, intra_node="nvlink1")
    fast = run_des(scenario, 3, mode="vectorised").result
    exact = run_des(scenario, 3, mode="message").result
    assert fast.iteration_s == pytest.approx(exact.iteration_s, rel=1e-9)


def test_the_simulation_collects_less_often_and_gives_the_thresholds_back(monkeypatch):
    """While the role programs run the collector uses DES_GC_THRESHOLD; the caller's come back after
    the run and after a run that raises."""
    seen = []
    real_run = RoleExecutor.run

    def watching(self, program):
        seen.append(gc.get_threshold())
        return real_run(self, program)

    monkeypatch.setattr(RoleExecutor, "run", watching)  # a spy: the real run still runs
    caller = (1234, 7, 9)
    before = gc.get_threshold()
    try:
        gc.set_threshold(*caller)
        plain = run_des(dataclasses.replace(SMALL, updates=2), 2).result
        assert seen == [DES_GC_THRESHOLD] and gc.get_threshold() == caller
        with pytest.raises(RuntimeError), fewer_collections():
            raise RuntimeError("a run that fails")
        assert gc.get_threshold() == caller
    finally:
        gc.set_threshold(*before)
    closed = closed_form_result(dataclasses.replace(SMALL, updates=2), 2)
    assert plain.iteration_s == pytest.approx(closed.iteration_s, rel=1e-6)


def test_single_device_has_no_communication():
    scenario = dataclasses.replace(SMALL, devices_per_node=1, intra_node=None)
    row = simulate_point(scenario, 1)
    assert row["scaling_efficiency"] == pytest.approx(1.0)
    assert row["exposed_comm_s"] == 0


def _efficiency(scenario, nodes):
    return simulate_point(scenario, nodes)["scaling_efficiency"]


def test_efficiency_falls_as_nodes_grow():
    values = [_efficiency(SMALL, n) for n in (1, 4, 16, 64)]
    assert values == sorted(values, reverse=True) and values[0] > values[-1]


def test_efficiency_rises_with_per_device_batch():
    values = [_efficiency(dataclasses.replace(SMALL, per_device_batch=b), 16) for b in (8, 32, 64)]
    assert values == sorted(values) and values[0] < values[-1]


def test_efficiency_rises_with_network_bandwidth():
    values = [
        _efficiency(dataclasses.replace(SMALL, network=net), 16) for net in ("eth_10g", "ib_fdr", "ib_edr")
    ]
    assert values == sorted(values) and values[0] < values[-1]


def test_overlap_hides_communication():
    on = simulate_point(SMALL, 8)["iteration_s"]
    off = simulate_point(dataclasses.replace(SMALL, options=AlgorithmOptions(overlap=False)), 8)["iteration_s"]
    assert on < off


def _profile(scenario):
    return step_profile(scenario, layer_times(scenario), momentum=True)


def test_buckets_cover_all_gradients():
    profile = _profile(SMALL)
    total = SMALL.workload_spec.parameter_bytes(4.0)
    assert sum(profile.bucket_bytes) == pytest.approx(total)
    assert (
        max(profile.bucket_bytes) < SMALL.options.bucket_bytes + 20e6
    )  # a bucket closes at the first layer past the size


def test_fp16_halves_gradient_bytes():
    fp32 = _profile(SMALL)
    fp16 = _profile(dataclasses.replace(SMALL, precision="fp16"))
    assert sum(fp16.bucket_bytes) == pytest.approx(sum(fp32.bucket_bytes) / 2)


def test_sweep_identical_across_pools():
    scenario = dataclasses.replace(SMALL, nodes=(1, 2, 4, 8))
    serial = run_sweep(scenario, pool="serial")
    pooled = run_sweep(scenario, pool="process", workers=2)
    assert serial == pooled


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,2,4,...,32", (1, 2, 4, 8, 16, 32)),
        ("1:16:x2", (1, 2, 4, 8, 16)),
        ("2:8:+3", (2, 5, 8)),
        ("3", (3,)),
        ("2,4,...,10", (2, 4, 6, 8, 10)),
    ],
)
def test_parse_counts(text, expected):
    assert parse_counts(text) == expected


def test_the_message_path_logs_a_groups_transfers_by_fabric_rank():
    """Two pipeline stages of 4 data-parallel ranks each: each stage's all-reduce runs over its own
    group, and the message path's log names the fabric ranks of that group (it named the members'
    indices 0..3 before, so both groups' rings were drawn on ranks 0-3)."""
    scenario = dataclasses.replace(
        GPU_NODE, nodes=(4,), algorithm="hybrid_parallel", options=make_options("hybrid_parallel", {"stages": 2})
    )
    run = run_des(scenario, 4, mode="message", log_transfers=True, note=lambda *_: None)
    placement = [int(device) for device in run.setup.placement()]
    stage_of = {device: rank % 2 for rank, device in enumerate(placement)}
    log = run.transfer_log
    assert log is not None
    src, dst = np.concatenate(log.src).astype(int), np.concatenate(log.dst).astype(int)
    pairs = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert {s for s, _ in pairs} == set(placement)  # every rank of both groups sends
    assert all(stage_of[s] == stage_of[d] for s, d in pairs)  # within its own stage's group
