"""The fluid path (``fluid_executor``): every flow of a collective in one fluid simulation, held to
the message path (its reference) on dragonflies, random rounds on random fabrics, and by hand."""

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.schedule import Schedule
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.engine import fluid_rates
from ddlsim.simulator.engine.collective_engine import (
    ContentionDetected,
    MessageExecutor,
    VectorisedExecutor,
    run_collective,
)
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec
from ddlsim.simulator.engine.fluid_executor import FluidExecutor
from ddlsim.simulator.engine.fluid_rates import LinkRates
from tests.test_collective_engine import random_schedule, schedule_of_rounds

IB = load_link("ib_edr")


def dragonfly(ranks, devices_per_node, nodes_per_router, routers_per_group, global_links=1):
    return Fabric(
        FabricSpec(
            nodes=-(-ranks // devices_per_node),
            devices_per_node=devices_per_node,
            peer_link=load_link("nvlink2") if devices_per_node > 1 else None,
            network=IB,
            topology="dragonfly",
            nodes_per_router=nodes_per_router,
            routers_per_group=routers_per_group,
            dragonfly_global_links=global_links,
        )
    )


# (algorithm, ranks, devices per node, nodes per router, routers per group, global links per group pair)
DRAGONFLY_CASES = [
    ("halving_doubling", 128, 1, 2, 4, 1),
    ("halving_doubling", 256, 1, 2, 4, 1),
    ("halving_doubling", 128, 4, 2, 4, 1),
    ("halving_doubling", 96, 1, 4, 4, 2),
    ("torus_2d", 64, 1, 4, 16, 1),
    ("torus_2d", 64, 1, 2, 4, 1),
    ("torus_2d", 64, 4, 2, 4, 1),
    ("ring", 32, 1, 2, 4, 1),
    ("ring", 32, 4, 2, 2, 1),
    ("hierarchical", 32, 1, 2, 4, 1),
    ("hierarchical", 64, 4, 2, 4, 1),
    ("recursive_doubling", 128, 1, 2, 4, 1),
    ("double_binary_tree", 64, 4, 2, 4, 1),
]


@pytest.mark.parametrize(("algorithm", "ranks", "dpn", "per_router", "per_group", "global_links"), DRAGONFLY_CASES)
@pytest.mark.parametrize("uneven", [False, True])
def test_dragonfly_collectives_equal_the_message_path(
    algorithm, ranks, dpn, per_router, per_group, global_links, uneven
):
    """On dragonflies of several shapes the fluid path, and whatever path ``auto`` takes, give the
    message path's per-rank finish times, with all ranks entering at once or at random times."""
    fabric = dragonfly(ranks, dpn, per_router, per_group, global_links)
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", ranks, devices_per_node=dpn)
    start = np.random.default_rng(ranks).uniform(0, 2e-6, schedule.ranks) if uneven else 0.0
    exact = MessageExecutor(fabric).run(schedule, 1e8, start)
    fluid = FluidExecutor(fabric).run(schedule, 1e8, start)
    auto, path = run_collective(schedule, fabric, 1e8, start)
    np.testing.assert_allclose(fluid, exact, rtol=1e-9)
    np.testing.assert_allclose(auto, exact, rtol=1e-9)
    assert path in ("vectorised", "fluid")


@pytest.mark.parametrize(
    ("algorithm", "ranks", "per_router", "per_group"),
    [("halving_doubling", 128, 2, 4), ("torus_2d", 128, 2, 4), ("torus_2d", 64, 4, 16)],
)
def test_rounds_the_round_path_cannot_prove_go_to_the_fluid_path(algorithm, ranks, per_router, per_group):
    """Halving doubling's far exchanges and torus_2d's column rings share global links, the ranks
    drift apart and flows of three and more rounds meet: the round path refuses, and ``auto`` takes
    the fluid path (not the message path), with the message path's times."""
    fabric = dragonfly(ranks, 1, per_router, per_group)
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", ranks)
    with pytest.raises(ContentionDetected):
        VectorisedExecutor(fabric).run(schedule, 1e8, 0.0)
    finish, path = run_collective(schedule, fabric, 1e8)
    assert path == "fluid"
    np.testing.assert_allclose(finish, MessageExecutor(fabric).run(schedule, 1e8, 0.0), rtol=1e-9)


HANDOVER_CASES = [
    ("halving_doubling", 128, 1),
    ("halving_doubling", 256, 4),
    ("recursive_doubling", 128, 1),
    ("torus_2d", 64, 1),
]


@pytest.mark.parametrize(("algorithm", "ranks", "dpn"), HANDOVER_CASES)
def test_the_round_path_hands_over_where_ranks_in_step_drift_apart(algorithm, ranks, dpn):
    """With ``handover`` the round path gives up once ranks that entered a round together drift apart
    within a round's contended flows, and names the last point where they were in step; the fluid
    path started there gives the times of one started at the first round (to rounding), and
    ``auto`` takes it."""
    fabric = dragonfly(ranks, dpn, 2, 4)
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", ranks, devices_per_node=dpn)
    executor = VectorisedExecutor(fabric, handover=True)
    with pytest.raises(ContentionDetected, match="drift apart"):
        executor.run(schedule, 1e8, 0.0)
    resume = executor.resume
    assert resume is not None and resume.rounds > 0
    assert np.all(resume.entry_s == resume.entry_s[0])
    resumed = FluidExecutor(fabric).run(schedule, 1e8, 0.0, resume)
    np.testing.assert_allclose(resumed, FluidExecutor(fabric).run(schedule, 1e8, 0.0), rtol=1e-12)
    np.testing.assert_allclose(resumed, MessageExecutor(fabric).run(schedule, 1e8, 0.0), rtol=1e-9)
    finish, path = run_collective(schedule, fabric, 1e8)
    assert path == "fluid"
    np.testing.assert_array_equal(finish, resumed)


@pytest.mark.parametrize(("algorithm", "ranks", "dpn"), HANDOVER_CASES)
def test_after_a_handover_the_fluid_path_takes_the_rounds_the_round_path_routed(algorithm, ranks, dpn):
    """The rounds the round path routed before it handed over (the one it gave up in, and the earlier
    ones a schedule hands out again, as halving doubling's all-gather) are not routed a second time:
    the fluid path takes their costs and binding hops from the round path's structures, and its
    times are those of a fluid run that routes every round itself, to the bit."""
    fabric = dragonfly(ranks, dpn, 2, 4)
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", ranks, devices_per_node=dpn)
    executor = VectorisedExecutor(fabric, handover=True)
    with pytest.raises(ContentionDetected):
        executor.run(schedule, 1e8, 0.0)
    runs = executor._runs.get(schedule)  # the round path's rounds: its structures are keyed by their arrays
    alone = FluidExecutor(fabric)
    expected = alone.run(schedule, 1e8, 0.0, executor.resume, runs=runs)
    taking = FluidExecutor(fabric, routed=executor._structures)
    np.testing.assert_array_equal(taking.run(schedule, 1e8, 0.0, executor.resume, runs=runs), expected)
    assert alone.taken_routes == 0
    assert taking.taken_routes >= 1  # at least the round it gave up in
    assert taking.instants == alone.instants


def test_path_costs_keep_the_latency_summed_link_by_link_unless_counted():
    """``Fabric.path_costs``: the summed latency is ``Fabric.latencies`` of the routes to the bit (what
    the fluid path sums itself), and None where a uniform torus counted its links instead."""
    fabric = dragonfly(64, 1, 2, 4)
    src = np.arange(64)
    dst = (src * 7 + 3) % 64
    costs = fabric.path_costs(src, dst)
    np.testing.assert_array_equal(costs.latency_s, fabric.latencies(costs.routes))
    routes, alpha, bottleneck = fabric.path_properties(src, dst)
    np.testing.assert_array_equal(routes, costs.routes)
    np.testing.assert_array_equal(alpha, costs.alpha_s)
    np.testing.assert_array_equal(bottleneck, costs.bottleneck_Bps)
    torus = Fabric(FabricSpec(nodes=64, devices_per_node=1, network=IB, topology="torus_2d"))  # 8 x 8
    everyone = np.arange(64)
    # a batch with at least as many hops as the torus has links (256): its torus hops counted
    assert torus.path_costs(everyone, (everyone + 36) % 64).latency_s is None
    fewer = torus.path_costs(everyone, (everyone + 8) % 64)  # one hop each, 192 entries: summed
    np.testing.assert_array_equal(fewer.latency_s, torus.latencies(fewer.routes))


@pytest.mark.parametrize(("algorithm", "ranks", "dpn"), HANDOVER_CASES)
def test_ranks_never_in_step_are_not_handed_over(algorithm, ranks, dpn):
    """Ranks that enter at different times are never in step: ``handover`` changes nothing, and the
    round path proves what it proved without it (or gives up where it gave up)."""
    fabric = dragonfly(ranks, dpn, 2, 4)
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", ranks, devices_per_node=dpn)
    start = np.random.default_rng(ranks).uniform(0, 2e-6, schedule.ranks)
    outcomes = []
    for handover in (False, True):
        executor = VectorisedExecutor(fabric, handover=handover)
        try:
            outcomes.append(executor.run(schedule, 1e8, start))
        except ContentionDetected as error:
            outcomes.append(str(error))
            assert executor.resume is None
    if isinstance(outcomes[0], str):
        assert outcomes[1] == outcomes[0]
    else:
        np.testing.assert_array_equal(outcomes[1], outcomes[0])


def test_a_flow_that_starts_later_on_a_shared_port_by_hand():
    """Rank 0 sends S to rank 2 at t = 0, rank 1 sends S to rank 2 from t = d (a switch: they share
    rank 2's port, B). Flow A streams alone from o until o + d, then both at B/2 until A is done,
    then B alone: A ends at o + d + 2 (S - B d) / B, B's flow (S - (that - o - d) B / 2 left) then
    alone. Each arrives a latency L after its flow ends."""
    fabric = Fabric(FabricSpec(nodes=3, devices_per_node=1, network=IB))
    schedule = schedule_of_rounds([(0, 2), (1, 2)], ranks=3, reduce=False)
    o, B = IB.per_message_overhead_s, IB.port_bandwidth_Bps
    L = fabric.hop_cost(0, 2).alpha_s - o
    S, d = 1e6, 20e-6
    a_end = o + d + 2 * (S - B * d) / B
    b_end = a_end + (S - (a_end - o - d) * B / 2) / B
    finish = FluidExecutor(fabric).run(schedule, S, np.array([0.0, d, 0.0]))
    assert finish[0] == pytest.approx(a_end + L, rel=1e-12)
    assert finish[1] == pytest.approx(b_end + L, rel=1e-12)
    assert finish[2] == pytest.approx(b_end + L, rel=1e-12)


def test_flows_of_three_rounds_meeting_on_a_port():
    """Round 1: 0 -> 2; round 2: 3 -> 4; round 3: 1 -> 2, sent at once by rank 1 while round 1's flow
    still streams into rank 2's port; the round path refuses (only the round just before is simulated
    with a round), the fluid path gives the message path's times."""
    fabric = Fabric(FabricSpec(nodes=5, devices_per_node=1, network=IB))
    schedule = schedule_of_rounds([(0, 2)], [(3, 4)], [(1, 2)], ranks=5)
    with pytest.raises(ContentionDetected):
        VectorisedExecutor(fabric).run(schedule, 1e6, 0.0)
    exact = MessageExecutor(fabric).run(schedule, 1e6, 0.0)
    np.testing.assert_allclose(FluidExecutor(fabric).run(schedule, 1e6, 0.0), exact, rtol=1e-12)
    assert exact[1] > fabric.hop_cost(1, 2).time(1e6)  # it did share the port


@pytest.mark.parametrize("seed", range(20))
def test_random_rounds_on_random_fabrics_equal_the_message_path(seed):
    """Random rounds (any sender to any receiver, several flows per rank, ranks idle in some rounds,
    empty transfers, random sizes) from random entry times, on a random fabric (dragonflies among
    them, and receivers that take time to add in what they receive): the fluid path's times are the
    message path's."""
    rng = np.random.default_rng(seed)
    devices_per_node = int(rng.choice([1, 2]))
    nodes = int(rng.integers(3, 13))
    ranks = nodes * devices_per_node
    topology = str(rng.choice(["switch", "fat_tree", "torus_2d", "dragonfly"]))
    fabric = Fabric(
        FabricSpec(
            nodes=nodes,
            devices_per_node=devices_per_node,
            peer_link=load_link("nvlink2") if devices_per_node > 1 else None,
            network=IB,
            topology=topology,
            nodes_per_leaf=2,
            oversubscription=float(rng.choice([1.0, 2.0])),
            nodes_per_router=2,
            routers_per_group=2,
            reduce_Bps=float(rng.choice([np.inf, 20e9])),
        )
    )
    schedule = random_schedule(rng, ranks, most_rounds=8, most_repeats=2, smallest=0)  # 0: empty transfers
    start = np.where(rng.random(ranks) < 0.5, rng.random(ranks) * 3e-4, 0.0)
    exact = MessageExecutor(fabric).run(schedule, 8e6, start)
    np.testing.assert_allclose(FluidExecutor(fabric).run(schedule, 8e6, start), exact, rtol=1e-9)


def _random_case(rng: np.random.Generator) -> tuple[Fabric, Schedule, np.ndarray]:
    """A random fabric of 4-12 single-device nodes (switch, fat tree or dragonfly), random rounds on
    it and random entry times (half the ranks at 0)."""
    nodes = int(rng.integers(4, 13))
    topology = str(rng.choice(["switch", "fat_tree", "dragonfly"]))
    fabric = Fabric(
        FabricSpec(
            nodes=nodes,
            devices_per_node=1,
            network=IB,
            topology=topology,
            nodes_per_leaf=2,
            oversubscription=2.0,
            nodes_per_router=2,
            routers_per_group=2,
        )
    )
    schedule = random_schedule(rng, nodes, most_rounds=8, most_repeats=2, smallest=0)
    start = np.where(rng.random(nodes) < 0.5, rng.random(nodes) * 3e-4, 0.0)
    return fabric, schedule, start


@pytest.mark.parametrize("seed", range(6))
def test_link_loads_kept_as_flows_start_and_end_equal_recomputed_ones(seed, monkeypatch):
    """The per-link sums of the bounds of the flows in flight, and their counts, kept as flows start
    and end (``LinkRates.load``, ``LinkRates.users``), equal those summed afresh over the flows in flight at every
    instant; they are exactly nothing once the run is over, and a second run on the same executor
    gives the message path's times again."""
    fabric, schedule, start = _random_case(np.random.default_rng(100 + seed))
    fluid = FluidExecutor(fabric, extrapolate=False)
    rerate = LinkRates.rerate
    checked = []

    def checking(self, cap, link, held, hop, hops, *rest):
        owner = np.repeat(np.arange(cap.size), hops)
        live = link != 0  # an ended flow's hops point at compact id 0, no link
        size = self.load.size
        np.testing.assert_allclose(
            self.load, np.bincount(link[live], weights=cap[owner[live]], minlength=size), rtol=1e-12, atol=0.0
        )
        np.testing.assert_array_equal(self.users, np.bincount(link[live], minlength=size))
        checked.append(int(live.sum()))
        return rerate(self, cap, link, held, hop, hops, *rest)

    monkeypatch.setattr(LinkRates, "rerate", checking)
    exact = MessageExecutor(fabric).run(schedule, 8e6, start)
    for _ in range(2):
        np.testing.assert_allclose(fluid.run(schedule, 8e6, start), exact, rtol=1e-9)
        assert not fluid.links.load.any() and not fluid.links.users.any()
    assert max(checked) > 0


def test_loggp_fabrics_go_message_by_message():
    """A LogGP fabric serialises a rank's message overheads, which the fluid path does not model: it
    refuses, and ``auto`` runs such a collective message by message."""
    fabric = Fabric(FabricSpec(nodes=3, devices_per_node=1, network=IB, loggp=True))
    schedule = schedule_of_rounds([(0, 1), (0, 2)], ranks=3)
    with pytest.raises(ContentionDetected):
        FluidExecutor(fabric)
    finish, path = run_collective(schedule, fabric, 1.0)
    assert path == "message"
    np.testing.assert_allclose(finish, MessageExecutor(fabric).run(schedule, 1.0, 0.0), rtol=1e-12)


def _checking_rerate(monkeypatch, calls):
    """``LinkRates.rerate`` compared, at every instant, with ``LinkRates.rates`` over every flow in
    flight, bit for bit; ``calls`` counts the re-ratings and those that rated every flow afresh."""
    rerate, afresh = LinkRates.rerate, LinkRates.afresh

    def checking(self, cap, link, held, hop, hops, crossing):
        rates = rerate(self, cap, link, held, hop, hops, crossing)
        calls["rerate"] += 1
        np.testing.assert_array_equal(rates, self.rates(cap, link, np.repeat(np.arange(cap.size), hops)))
        return rates

    def counting(self, *args):
        calls["afresh"] += 1
        return afresh(self, *args)

    monkeypatch.setattr(LinkRates, "rerate", checking)
    monkeypatch.setattr(LinkRates, "afresh", counting)
    monkeypatch.setattr(fluid_rates, "_FEW_FLOWS", 0)  # (these runs have few flows: held all the same)


def test_a_rate_held_while_another_port_re_rates_by_hand(monkeypatch):
    """Rank 0 sends S to rank 2 from t = 0, rank 1 sends S to rank 2 from t = d, and rank 3 sends S
    to rank 4 from t = 0 (a switch). Only the first re-rating rates every flow (and the last, with
    none left); when rank 1's flow
    starts, it and rank 0's (rank 2's port, B/2 each) are re-rated and 3 -> 4 keeps B; when 3 -> 4
    ends, no other flow shared a link with it and every rate is held; when rank 0's ends, rank 1's
    gets B. The times are the hand-worked ones of two flows on a port, and S / B for 3 -> 4."""
    calls = {"rerate": 0, "afresh": 0}
    _checking_rerate(monkeypatch, calls)
    monkeypatch.setattr(fluid_rates, "_FRESH", 1.0)  # (three flows: re-rating two is otherwise not worth it)
    fabric = Fabric(FabricSpec(nodes=5, devices_per_node=1, network=IB))
    schedule = schedule_of_rounds([(0, 2), (1, 2), (3, 4)], ranks=5, reduce=False)
    o, B = IB.per_message_overhead_s, IB.port_bandwidth_Bps
    L = fabric.hop_cost(0, 2).alpha_s - o
    S, d = 1e6, 20e-6
    a_end = o + d + 2 * (S - B * d) / B
    b_end = a_end + (S - (a_end - o - d) * B / 2) / B
    finish = FluidExecutor(fabric).run(schedule, S, np.array([0.0, d, 0.0, 0.0, 0.0]))
    assert finish[0] == pytest.approx(a_end + L, rel=1e-12)
    assert finish[1] == pytest.approx(b_end + L, rel=1e-12)
    assert finish[2] == pytest.approx(b_end + L, rel=1e-12)
    assert finish[3] == finish[4] == pytest.approx(o + S / B + L, rel=1e-12)
    assert calls == {"rerate": 5, "afresh": 2}  # the first, and the last with no flow left


@pytest.mark.parametrize(
    ("algorithm", "ranks", "dpn", "per_router", "per_group", "global_links"),
    [case for case in DRAGONFLY_CASES if case[0] in ("halving_doubling", "torus_2d", "ring")],
)
@pytest.mark.parametrize("uneven", [False, True])
def test_held_and_re_rated_rates_equal_rating_every_flow_afresh(
    algorithm, ranks, dpn, per_router, per_group, global_links, uneven, monkeypatch
):
    """At every instant of collectives on dragonflies (flows of several rounds sharing global links),
    the rates held for the components no start or end touched and re-rated for the rest are those of
    rating every flow in flight afresh, bit for bit; and some instants did hold rates."""
    calls = {"rerate": 0, "afresh": 0}
    _checking_rerate(monkeypatch, calls)
    fabric = dragonfly(ranks, dpn, per_router, per_group, global_links)
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", ranks, devices_per_node=dpn)
    start = np.random.default_rng(ranks).random(ranks) * 2e-5 if uneven else 0.0
    FluidExecutor(fabric, extrapolate=False).run(schedule, 8e6, start)
    assert calls["afresh"] < calls["rerate"]


@pytest.mark.parametrize("seed", range(12))
def test_held_and_re_rated_rates_on_random_fabrics(seed, monkeypatch):
    """The same on random rounds on random fabrics (as ``test_random_rounds_on_random_fabrics``)."""
    calls = {"rerate": 0, "afresh": 0}
    _checking_rerate(monkeypatch, calls)
    fabric, schedule, start = _random_case(np.random.default_rng(300 + seed))
    exact = MessageExecutor(fabric).run(schedule, 8e6, start)
    np.testing.assert_allclose(FluidExecutor(fabric, extrapolate=False).run(schedule, 8e6, start), exact, rtol=1e-9)
    assert calls["rerate"] > 0


def test_levels_too_close_together_are_not_certified():
    """Two flows on link a (bounds C: C/2 each); on link b, one bound x 2e-12 below C/2 and one bound
    C: x, then C - x. Rated together no pass joins two links or bounds (the tolerance is 1e-12), but
    levels that close could be joined where the components are rated apart, so those rates are not
    certified to be held; with x well below C/2, they are."""
    fabric = Fabric(FabricSpec(nodes=4, devices_per_node=1, network=IB))
    links = LinkRates(fabric.capacity_Bps)
    np.testing.assert_array_equal(links.ids(np.array([0, 1])), [1, 2])  # compact ids 1 and 2
    C = links.capacity[1]
    link, hops = np.array([1, 1, 2, 2]), np.ones(4, dtype=np.int64)
    for below, certified in ((2e-12, False), (0.25, True)):
        x = C / 2 * (1 - below)
        cap = np.array([C, C, x, C])
        links.load[1:3] = [2 * C, x + C]
        rates = links.afresh(cap, link, hops)
        np.testing.assert_array_equal(rates, [C / 2, C / 2, x, C - x])
        assert links.certified is certified


def _incast_apart(late_s):
    """Ranks 0-3 each send 1 MB to rank 4 in five identical rounds (one Round object: a run), over
    one switch (they share rank 4's port); ranks 2 and 3 enter ``late_s`` after the others."""
    fabric = Fabric(FabricSpec(nodes=5, devices_per_node=1, network=IB))
    (rnd,) = schedule_of_rounds([(0, 4), (1, 4), (2, 4), (3, 4)], ranks=5).rounds()
    schedule = Schedule("incast", "allreduce", 5, 1, lambda: [rnd] * 5)
    return fabric, schedule, np.array([0.0, 0.0, late_s, late_s, 0.0])


def test_a_run_entered_too_far_apart_is_handed_over_at_its_first_round(monkeypatch):
    """Ranks 0 and 1 run two rounds ahead on rank 4's port while the late ranks' first flows there
    have not even started: the round path would simulate rounds 1 and 2 together and decline at
    round 3 (a flow starts while flows older than the previous round's may be there); with
    ``handover`` it proves so after round 1 (``_bound_to_decline``) and declines there, with the
    same hand-over point (none: never in step), and ``auto`` gives the same times to the bit."""
    fabric, schedule, start = _incast_apart(1e-3)
    declined = {}
    for proved in (True, False):
        if not proved:
            monkeypatch.setattr(VectorisedExecutor, "_bound_to_decline", lambda *args: False)
        executor = VectorisedExecutor(fabric, handover=True)
        with pytest.raises(ContentionDetected) as error:
            executor.run(schedule, 1e6, start)
        declined[proved] = (executor._serial, str(error.value), executor.resume)
        finish, path = run_collective(schedule, fabric, 1e6, start)
        assert path == "fluid"
        declined[proved] += (finish,)
    assert declined[True][0] == 1 and "two rounds on" in declined[True][1]
    assert declined[False][0] == 3 and "older than the previous round's" in declined[False][1]
    assert declined[True][2] is None and declined[False][2] is None
    np.testing.assert_array_equal(declined[True][3], declined[False][3])
    np.testing.assert_allclose(declined[True][3], MessageExecutor(fabric).run(schedule, 1e6, start), rtol=1e-9)


def test_a_run_entered_a_little_apart_is_not_handed_over_early():
    """The same run with the late ranks a round behind, not two: no proof of a decline, and the round
    path goes on as without it (the same outcome either way)."""
    fabric, schedule, start = _incast_apart(1e-4)
    outcomes = []
    for handover in (False, True):
        executor = VectorisedExecutor(fabric, handover=handover)
        try:
            outcomes.append(executor.run(schedule, 1e6, start))
        except ContentionDetected as error:
            outcomes.append((executor._serial, str(error)))
    assert "two rounds on" not in str(outcomes[1])
    if isinstance(outcomes[0], tuple):
        assert outcomes[1] == outcomes[0]
    else:
        np.testing.assert_array_equal(outcomes[1], outcomes[0])
