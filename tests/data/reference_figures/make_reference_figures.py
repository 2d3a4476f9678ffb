"""Write reference_figures.json from the simulators as they were before the redesign (git 76f5821).

The redesign replaced ``simulator/engine.py`` (bucketed sync SGD) and ``simulator/algorithm_sim.py``
(the other training algorithms) with one executor of role programs; tests/test_reference_figures.py
holds the new one to these figures. Run against a checkout of that commit, not this one:

    git worktree add /tmp/old 76f5821
    PYTHONPATH=/tmp/old python tests/data/reference_figures/make_reference_figures.py OUT.json
"""

import dataclasses
import json
import sys

SYNC = [
    # (label, Scenario keyword arguments, nodes)
    ("resnet50_p100_ring", {}, [1, 2, 3, 8]),
    ("resnet50_p100_ring_2_iterations_no_overlap", {"overlap": False, "iterations": 2}, [2, 3]),
    ("alexnet_knl_opa_ring", {"workload": "alexnet", "device": "knl_7250", "devices_per_node": 1,
                              "intra_node": None, "network": "opa_100", "per_device_batch": 64}, [1, 2, 16, 64]),
    ("vgg16_v100_hierarchical", {"workload": "vgg16", "device": "v100_sxm2", "intra_node": "nvlink2",
                                 "algorithm": "hierarchical", "per_device_batch": 16}, [2, 4]),
    ("resnet50_p40_halving_doubling_fp16", {"device": "p40", "intra_node": "pcie3_x16",
                                           "algorithm": "halving_doubling", "precision": "fp16",
                                           "per_device_batch": 64}, [2, 4]),
    ("resnet50_ps_colocated", {"device": "p40", "intra_node": "pcie3_x16", "algorithm": "parameter_server",
                               "algorithm_options": {"servers": 4, "placement": "colocated"}}, [2, 4]),
    ("resnet50_ps_dedicated", {"devices_per_node": 4, "algorithm": "parameter_server",
                               "algorithm_options": {"servers": 2, "placement": "dedicated"}}, [2]),
    ("resnet50_scatter_fat_tree_4to1", {"devices_per_node": 1, "intra_node": None, "topology": "fat_tree",
                                        "oversubscription": 4.0, "nodes_per_leaf": 4, "placement": "scatter"},
     [8, 16]),
    ("resnet50_double_binary_tree", {"devices_per_node": 2, "algorithm": "double_binary_tree"}, [4]),
    ("resnet50_small_buckets", {"bucket_bytes": 2e6, "devices_per_node": 2}, [3]),
]

ALGORITHMS = [
    # (label, algorithm, options, nodes, updates, stragglers, Scenario keyword arguments)
    ("you_et_al_knl", None, {"tau": 3}, 8, 12, "none",
     {"workload": "alexnet", "device": "knl_7250", "devices_per_node": 1, "intra_node": None,
      "network": "opa_100", "per_device_batch": 64}),
    ("stragglers", None, {}, 6, 10, "lognormal:0.3",
     {"workload": "resnet50", "device": "knl_7250", "devices_per_node": 1, "intra_node": None,
      "network": "opa_100"}),
]
ALGORITHM_OPTIONS = {"tau", "alpha", "servers", "threads"}


def sync_rows(Scenario, simulate_point):
    out = {}
    for label, values, nodes in SYNC:
        for executor in ("des", "analytic"):
            scenario = Scenario(**values, nodes=tuple(nodes), executor=executor)
            out[f"{label}/{executor}"] = [simulate_point(scenario, n) for n in nodes]
    return out


def algorithm_rows(Scenario, AlgorithmSetup, simulate_algorithm, make_options, names):
    out = {}
    for label, _, options, nodes, updates, stragglers, values in ALGORITHMS:
        scenario = Scenario(**values, nodes=(nodes,))
        for name in names:
            spec_options = {k: v for k, v in options.items() if k in ALGORITHM_OPTIONS}
            try:
                chosen = make_options(name, spec_options)
            except ValueError:
                chosen = make_options(name, {})
            setup = AlgorithmSetup(name, scenario, nodes, updates, chosen, stragglers, seed=1)
            result = simulate_algorithm(setup)
            summary = result.summary()
            out[f"{label}/{name}"] = {"options": dataclasses.asdict(chosen), **summary}
    return out


def main() -> None:
    from ddlsim.simulator.algorithm_sim import AlgorithmSetup, simulate_algorithm

    from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, make_options
    from ddlsim.simulator.scenario import Scenario
    from ddlsim.simulator.sweep import simulate_point

    data = {
        "source": "simulators of git 76f5821 (simulator/engine.py and simulator/algorithm_sim.py)",
        "sync": sync_rows(Scenario, simulate_point),
        "algorithms": algorithm_rows(
            Scenario, AlgorithmSetup, simulate_algorithm, make_options, TRAINING_ALGORITHMS.names()
        ),
    }
    with open(sys.argv[1], "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True, default=float)
        handle.write("\n")


if __name__ == "__main__":
    main()
