"""How fast ``ddlsim plan`` searches: layouts per second of each step, on one core.

    python benchmarks/plan_speed.py [--model megatron_76b] [--gpus 1024] [--device a100_sxm4_80gb]
                                     [--global-batch 1792] [--sample 300]

Enumerates every valid layout (as ``ddlsim plan``), screens them all for memory, and times the
closed form on a random sample of the fitting ones (``--sample``, seeded), then prints layouts/s of
each step, the whole search's projected seconds, and what a million layouts would take (the issue's
target: under 60 s on one core; Calculon's exhaustive search: about 3.7 h for 1.14 million).
"""

from __future__ import annotations

import argparse
import random
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="megatron_76b")
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--device", default="a100_sxm4_80gb")
    parser.add_argument("--global-batch", type=int, default=1792)
    parser.add_argument("--sample", type=int, default=300)
    args = parser.parse_args(argv)

    from ddlsim.simulator import planner

    config = planner.load_model(args.model)
    cluster = planner.Cluster.of(args.device, args.gpus)
    started = time.perf_counter()
    layouts = list(planner.candidate_layouts(config, cluster, args.global_batch))
    enumerate_s = time.perf_counter() - started
    started = time.perf_counter()
    candidates = planner.screen(config, cluster, layouts)
    screen_s = time.perf_counter() - started
    fitting = [candidate for candidate in candidates if not candidate.reason]
    sample = random.Random(0).sample(fitting, min(args.sample, len(fitting)))
    started = time.perf_counter()
    for candidate in sample:
        planner.closed_form_figures((args.model, cluster, candidate.layout))
    closed_s = time.perf_counter() - started
    rates = {"enumerate": len(layouts) / enumerate_s, "memory screen": len(layouts) / screen_s,
             "closed form": len(sample) / closed_s}  # fmt: skip
    print(f"# {args.model} on {args.gpus} {args.device}, global batch {args.global_batch}: {len(layouts)} valid "
          f"layouts, {len(fitting)} fit; one core")  # fmt: skip
    for step, rate in rates.items():
        print(f"{step:14s} {rate:10.0f} layouts/s")
    whole = enumerate_s + screen_s + len(fitting) / rates["closed form"]
    fit_share = len(fitting) / len(layouts)
    per_layout = 1 / rates["enumerate"] + 1 / rates["memory screen"] + fit_share / rates["closed form"]
    print(f"this search: about {whole:.1f} s; a million layouts at this mix: about {1e6 * per_layout / 3600:.1f} h "
          f"(target: 60 s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
