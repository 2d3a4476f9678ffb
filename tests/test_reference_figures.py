"""The one training model reproduces what the two simulators it replaced computed (git 76f5821).

tests/data/reference_figures/README.md says how the figures were made; the scenarios are the lists
of make_reference_figures.py, read here so that both sides use the same settings.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, AlgorithmOptions
from ddlsim.hardware_models.catalog import forget_catalog_directories, load_device, register_catalog_directory
from ddlsim.simulator.scenario import Scenario, default_host_link
from ddlsim.simulator.sweep import simulate_point

DATA = Path(__file__).parent / "data" / "reference_figures"
REFERENCE = json.loads((DATA / "reference_figures.json").read_text())
_spec = importlib.util.spec_from_file_location("make_reference_figures", DATA / "make_reference_figures.py")
assert _spec is not None and _spec.loader is not None
SETTINGS = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(SETTINGS)


# the datasheets the figures were made with, where the catalog has changed them since (a user catalog
# directory of links under new tokens; the scenarios name those)
CATALOG = DATA / "catalog"
AS_MADE = {"pcie3_x16": "pcie3_x16_76f5821", "ib_edr": "ib_edr_76f5821", "opa_100": "opa_100_76f5821"}


@pytest.fixture(autouse=True, scope="module")
def _catalog_as_made():
    register_catalog_directory(CATALOG)
    yield
    forget_catalog_directories()


def _links_as_made(values: dict) -> dict:
    """``values`` with every link the catalog has changed since replaced by its datasheet as it was:
    the peer link (also the host link, as the old scenarios had it), a GPU's default host link, and
    the network, the Scenario's default included."""
    values = dict(values)
    if values.get("intra_node") in AS_MADE:
        values["intra_node"] = values["host_link"] = AS_MADE[values["intra_node"]]
    host = default_host_link(load_device(values.get("device", Scenario.device)))
    if values.get("host_link", "auto") == "auto" and host in AS_MADE:
        values["host_link"] = AS_MADE[host]  # a GPU's own way to its NIC
    network = values.get("network", Scenario.network)
    values["network"] = AS_MADE.get(network, network)
    return values


def _scenario(values: dict) -> Scenario:
    """The old Scenario keywords in today's terms: the collective and bucket settings are options; a
    link the catalog has changed since is its datasheet as it was (``_links_as_made``)."""
    values = _links_as_made(values)
    options = {
        new: values.pop(old)
        for old, new in (("algorithm", "collective"), ("algorithm_options", "collective_options"),
                         ("bucket_bytes", "bucket_bytes"), ("overlap", "overlap"))
        if old in values
    }  # fmt: skip
    if "iterations" in values:
        values["updates"] = values.pop("iterations")
    return Scenario(**values, options=AlgorithmOptions(**options))


SYNC_CASES = [
    (label, values, nodes, executor) for label, values, nodes in SETTINGS.SYNC for executor in ("des", "analytic")
]


# Scenarios whose closed form charges ports shared by several transfers of one round since 27 Nov
# 2026 (the parameter servers' incast; halving-doubling's far rounds, where a node's devices cross
# through one NIC at once): their closed-form figures are now the old DES's, to the bit, but for
# comm_s of the parameter server, the buckets' collective time, which the DES averages over the workers
# and the closed form takes at the busiest port (colocated servers: a server's own shard stays home,
# so the ranks differ; 4 % apart).
SHARED_PORTS = {"resnet50_ps_colocated", "resnet50_ps_dedicated", "resnet50_p40_halving_doubling_fp16"}


@pytest.mark.parametrize(("label", "values", "nodes", "executor"), SYNC_CASES)
def test_sync_sgd_keeps_the_figures_of_the_bucketed_engine(label, values, nodes, executor):
    scenario = dataclasses.replace(_scenario(values), nodes=tuple(nodes), executor=executor)
    shared = label in SHARED_PORTS and executor == "analytic"
    reference = REFERENCE["sync"][f"{label}/{'des' if shared else executor}"]
    keys = ["iteration_s", "compute_s", "exposed_comm_s", "comm_s", "scaling_efficiency", "buckets"]
    if shared and label.startswith("resnet50_ps_"):
        keys.remove("comm_s")
    for count, old in zip(nodes, reference, strict=True):
        new = simulate_point(scenario, count)
        for key in keys:
            assert new[key] == pytest.approx(old[key], rel=1e-9, abs=1e-15), (count, key)


ALGORITHM_CASES = [
    (key, setting)
    for setting in SETTINGS.ALGORITHMS
    for key in REFERENCE["algorithms"]
    if key.startswith(setting[0] + "/") and not key.endswith("/sync_sgd")
]


@pytest.mark.parametrize(("key", "setting"), ALGORITHM_CASES, ids=[key for key, _ in ALGORITHM_CASES])
def test_every_other_algorithm_keeps_the_figures_of_the_role_program_simulator(key, setting):
    _, _, _, nodes, updates, stragglers, values = setting
    old = REFERENCE["algorithms"][key]
    name = old["algorithm"]
    reads = TRAINING_ALGORITHMS.get(name).options
    default = AlgorithmOptions()
    options = {k: v for k, v in old["options"].items() if k in reads and k != "split" and v != getattr(default, k)}
    scenario = Scenario(
        **_links_as_made(values), nodes=(nodes,), algorithm=name, options=AlgorithmOptions(**options), updates=updates,
        stragglers=stragglers, seed=1,
    )  # fmt: skip
    new = simulate_point(scenario, nodes)
    for field in ("time_s", "comm_share", "throughput_samples_per_s"):
        assert new[field] == pytest.approx(old[field], rel=1e-9), field
    if old["servers"]:
        for field in ("server_utilisation", "server_queue_s", "staleness_mean", "staleness_max"):
            assert new[field] == pytest.approx(old[field], rel=1e-9), field
