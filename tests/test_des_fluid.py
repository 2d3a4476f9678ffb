"""A training collective whose own flows contend, timed by the fluid path inside the DES, held to the
message path; and where that is not exact (a flow from before, LogGP), the fallback.

NCCL's pipelined double binary tree (``chunks``) sends each chunk up and down two trees: a rank's
flows of consecutive chunks meet on its ports, and flows of three rounds share a link, which the
round path cannot prove. Before, the whole point then went message by message.
"""

import dataclasses

import numpy as np
import pytest

from ddlsim.algorithms.training_algorithm import make_options
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.engine.collective_engine import ContentionDetected
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec
from ddlsim.simulator.engine.fluid_executor import FluidExecutor
from ddlsim.simulator.engine.link_state import LinkState
from ddlsim.simulator.executor.des import run_des
from ddlsim.simulator.executor.role_executor import FluidMayApply, RoleExecutor
from ddlsim.simulator.scenario import Scenario
from tests.test_collective_engine import schedule_of_rounds

IB = load_link("ib_edr")
TREE = Scenario(
    devices_per_node=1,
    algorithm="sync_sgd",
    options=make_options("sync_sgd", {"collective": "double_binary_tree", "collective_options": {"chunks": 16}}),
    nodes=(16,),
)


def _timed_apart(monkeypatch) -> list[str]:
    """The collectives the fluid path timed ('ok') or declined (its reason), in order."""
    seen: list[str] = []
    original = RoleExecutor._run_fluid

    def spied(self, *args):
        try:
            finish = original(self, *args)
        except ContentionDetected as detected:
            seen.append(str(detected.__cause__))
            raise
        seen.append("ok")
        return finish

    monkeypatch.setattr(RoleExecutor, "_run_fluid", spied)
    return seen


def _assert_same_run(fast, exact):
    np.testing.assert_allclose(fast.finish_s, exact.finish_s, rtol=1e-9)
    assert fast.result.time_s == pytest.approx(exact.result.time_s, rel=1e-9)
    assert fast.result.comm_s == pytest.approx(exact.result.comm_s, rel=1e-9)
    assert fast.result.transfers == exact.result.transfers


@pytest.mark.parametrize(
    ("nodes", "change"),
    [
        (16, {}),
        (32, {"updates": 2}),
        (16, {"devices_per_node": 2, "intra_node": "nvlink1"}),  # two devices a node: groups over NVLink too
        (16, {"topology": "fat_tree", "nodes_per_leaf": 4}),
        (16, {"stragglers": "lognormal:0.2"}),  # the ranks enter each bucket's all-reduce apart
    ],
)
def test_pipelined_trees_go_the_fluid_path_with_the_message_paths_times(monkeypatch, nodes, change):
    timed = _timed_apart(monkeypatch)
    scenario = dataclasses.replace(TREE, nodes=(nodes,), **change)
    fast = run_des(scenario, nodes)
    assert fast.result.path == "vectorised+fluid" and "ok" in timed
    _assert_same_run(fast, run_des(scenario, nodes, mode="message"))


def test_a_run_takes_checkpoints_only_once_it_met_such_a_collective(monkeypatch):
    """The first attempt keeps no link-state copies; the collective raises ``FluidMayApply`` and the
    point runs again with them (``fluid``). A point without one never pays for them."""
    made: list[bool] = []
    original = RoleExecutor.__init__

    def spied(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self.fluid)

    monkeypatch.setattr(RoleExecutor, "__init__", spied)
    assert run_des(TREE, 16).result.path == "vectorised+fluid"
    assert made == [False, True]
    made.clear()
    ring = dataclasses.replace(TREE, options=make_options("sync_sgd", {"collective": "ring"}))
    assert run_des(ring, 16).result.path == "vectorised" and made == [False]


def _log_rows(log) -> np.ndarray:
    """The log's transfers as rows (sender, receiver, bytes, start, end), sorted."""
    columns = (log.src, log.dst, log.nbytes, log.start_s, log.end_s)
    rows = np.column_stack([np.concatenate(column) for column in columns])
    return rows[np.lexsort(rows.T[::-1])]


@pytest.mark.parametrize("traced", [5, 64])
def test_a_transfer_log_holds_the_fluid_paths_transfers_as_the_message_path_has_them(monkeypatch, traced):
    """The fluid path logs each transfer from its sender's round entry to its arrival; what the round
    path logged in its attempt at the collective is dropped first."""
    timed = _timed_apart(monkeypatch)
    logged = run_des(TREE, 16, log_transfers=True, traced_senders=traced)
    exact = run_des(TREE, 16, mode="message", log_transfers=True, traced_senders=traced)
    assert logged.result.path == "vectorised+fluid" and "ok" in timed
    _assert_same_run(logged, exact)
    assert logged.transfer_log is not None and exact.transfer_log is not None
    assert logged.transfer_log.total == exact.transfer_log.total == exact.result.transfers
    ours, theirs = _log_rows(logged.transfer_log), _log_rows(exact.transfer_log)
    assert ours.shape == theirs.shape and ours[:, 0].max() < traced
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)


def test_loggp_still_goes_message_by_message():
    loggp = Fabric(FabricSpec(nodes=4, devices_per_node=1, network=IB, loggp=True))
    assert not RoleExecutor(loggp, range(4), "vectorised", fluid=True).fluid
    point = run_des(dataclasses.replace(TREE, loggp=True), 16, note=lambda *_: None).result
    assert point.path == "message"


# --- a group of some ranks, by hand ----------------------------------------------------------------
class _Wait:
    def __init__(self, seconds: float) -> None:
        self.name, self.duration_s = "wait", seconds

    def run(self) -> None:
        return None


class _Payload:
    def __init__(self, nbytes: float) -> None:
        self.nbytes = nbytes


GROUP = tuple(rank for rank in range(20) if rank not in (0, 4, 10, 19))  # members with gaps: 16 of 20


def _fabric(topology: str) -> Fabric:
    tree = {"topology": "fat_tree", "nodes_per_leaf": 4, "oversubscription": 4} if topology == "fat_tree" else {}
    return Fabric(FabricSpec(nodes=20, devices_per_node=1, network=IB, **tree))


def _program(send_at: float | None, dst: int):
    """The group's pipelined tree, then a ring all-reduce; rank 0 (no member) sends 100 MB to ``dst``
    at ``send_at`` (None: no message)."""

    def program(comm):
        if comm.rank in GROUP:
            yield comm.allreduce(_Payload(2.5e7), "double_binary_tree", GROUP, chunks=16)
            yield comm.allreduce(_Payload(1e6), "ring", GROUP)
            if comm.rank == dst and send_at is not None:
                yield comm.recv(0)
        elif comm.rank == 0 and send_at is not None:
            yield comm.compute(_Wait(send_at))
            yield comm.send(dst, _Payload(1e8))

    return program


def _run(topology: str, mode: str, send_at: float | None = None, dst: int = 19, fluid: bool = True) -> RoleExecutor:
    executor = RoleExecutor(_fabric(topology), np.arange(20), mode, fluid=fluid)
    executor.run(_program(send_at, dst))
    return executor


@pytest.mark.parametrize(("send_at", "dst"), [(None, 19), (0.0, 19), (1.0, 2)])
def test_a_group_of_some_ranks_is_timed_on_its_own_fabric_ranks(monkeypatch, send_at, dst):
    """Schedule rank i on the group's i-th rank: the tree goes the fluid path, the ring after it the
    round path (checked against the tree's flows), a message outside the group or long after it
    meets neither; all as the message path has them."""
    timed = _timed_apart(monkeypatch)
    with pytest.raises(FluidMayApply):
        _run("switch", "vectorised", send_at, dst, fluid=False)
    fast = _run("switch", "vectorised", send_at, dst)
    exact = _run("switch", "message", send_at, dst)
    assert fast.fluid_collectives == 1 and timed == ["ok"]
    np.testing.assert_allclose(fast.finish_s, exact.finish_s, rtol=1e-9)
    assert fast.transfers == exact.transfers


def test_a_tree_that_meets_a_message_from_before_is_not_timed_on_its_own(monkeypatch):
    """Rank 0's message into member 2's port is still streaming when the tree starts: its times
    alone would be wrong, so the fallback stands."""
    timed = _timed_apart(monkeypatch)
    with pytest.raises(ContentionDetected):
        _run("switch", "vectorised", send_at=0.0, dst=2)
    assert timed == ["a collective timed on its own would meet a flow already on a link"]
    alone = _run("switch", "message", send_at=None)
    assert _run("switch", "message", send_at=0.0, dst=2).finish_s[GROUP[0]] > alone.finish_s[GROUP[0]]


def test_a_collective_that_meets_the_tail_of_one_timed_apart_is_not_timed_on_its_own(monkeypatch):
    """On an oversubscribed fat tree the first members out of the tree start the ring while others'
    tree flows still share leaf uplinks with it: the tree went the fluid path and its flows stay in
    the link state, so the ring is checked against them and refused (on both paths)."""
    timed = _timed_apart(monkeypatch)
    with pytest.raises(ContentionDetected):
        _run("fat_tree", "vectorised")
    assert timed == ["ok", "a collective timed on its own would meet a flow already on a link"]
    _run("fat_tree", "message")


def test_a_refused_placement_changes_nothing():
    links = LinkState(4, 2)
    links.send(0, (1, 2), 0.0, 0.0, 1.0)  # a message over links 1 and 2 until t = 1
    before = links.copy()
    with pytest.raises(ContentionDetected):
        links.place_apart(np.array([2, 3]), np.array([1, 1]), np.array([1, 1]), np.array([0.5, 0.5]), np.array([2, 2]))
    for name in LinkState._SAVED:
        np.testing.assert_array_equal(getattr(links, name), getattr(before, name))
    links.place_apart(np.array([2, 3]), np.array([1, 1]), np.array([1, 1]), np.array([1.0, 0.5]), np.array([2, 3]))
    assert links.busy_until[2] == 2.0 and links.link_sender[2] == -2  # checked from then on
    assert links.link_sender[3] == 1  # one sender: its clock bounds it


def test_link_use_of_two_flows_sharing_a_port_by_hand():
    """Rank 0 sends to rank 2 from t = 0 (its flow from the overhead o), rank 1 from t = d: rank 2's
    port carries flows of senders 0 and 1 from o until the later one ends, each sender's own port
    only its own flow."""
    fabric = Fabric(FabricSpec(nodes=3, devices_per_node=1, network=IB))
    schedule = schedule_of_rounds([(0, 2), (1, 2)], ranks=3, reduce=False)
    fluid = FluidExecutor(fabric)
    finish = fluid.run(schedule, 1e6, np.array([0.0, 20e-6, 0.0]), link_use=True)
    use = fluid.link_use
    assert use is not None
    routes = fabric.routes(np.array([0, 1]), np.array([2, 2]))
    port = np.intersect1d(routes[0], routes[1])
    assert port.size == 1
    at = int(np.flatnonzero(use.links == port[0])[0])
    latency = fabric.hop_cost(0, 2).alpha_s - IB.per_message_overhead_s
    assert (use.low[at], use.high[at]) == (0, 1)
    assert use.first_s[at] == pytest.approx(IB.per_message_overhead_s)
    assert use.last_s[at] == pytest.approx(finish.max() - latency)
    assert use.links.size == np.unique(routes[routes >= 0]).size  # every link crossed, once
    assert FluidExecutor(fabric).run(schedule, 1e6, np.array([0.0, 20e-6, 0.0])) == pytest.approx(finish)
