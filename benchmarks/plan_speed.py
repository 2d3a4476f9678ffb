"""How fast ``ddlsim plan`` searches: layouts per second on one core, and a million layouts.

    python benchmarks/plan_speed.py [--model megatron_76b] [--gpus 1024] [--device a100_sxm4_80gb]
                                     [--global-batch 1792] [--sample 100]
    python benchmarks/plan_speed.py --million [--model gpt3_175b --gpus 4096 --device h100_sxm5]

The default run times one search as ``ddlsim plan`` runs it: enumerate every valid layout, bound
each one's iteration from below, time by the closed form best bound first until no bound can beat
the 10th best (``planner.branch_and_bound``); and, for comparison, the exhaustive search's cost from
the closed form's rate on a random sample (``--sample``) times the layouts that fit.

``--million`` searches one space of more than a million layouts: the model's layouts at every global
batch from 1024 in steps of 256 until the count passes 1,000,000, ranked together by tokens/s (the
issue's target: under 60 s on one core; Calculon's exhaustive search of 1.14 million: about 3.7 h).
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time


def search(model: str, config, cluster, layouts: list, keep: int = 10) -> tuple[float, list, list]:
    from ddlsim.simulator import planner

    started = time.perf_counter()
    ranked, candidates = planner.branch_and_bound(model, config, cluster, layouts, keep)
    return time.perf_counter() - started, ranked, candidates


def report(label: str, count: int, enumerate_s: float, search_s: float, ranked: list, candidates: list) -> None:
    from ddlsim.simulator import planner

    pruned = sum(1 for candidate in candidates if candidate.pruned)
    total = enumerate_s + search_s
    print(f"{label}: {count:,} layouts; enumerate {enumerate_s:.1f} s, bound and search {search_s:.1f} s "
          f"({len(ranked)} timed by the closed form, {pruned:,} pruned); {total:.1f} s in all = "
          f"{count / total:,.0f} layouts/s")  # fmt: skip
    best = ranked[0]
    print(
        f"  best: {planner.layout_text(best.layout)}, global batch {best.layout.global_batch}: "
        f"{best.figures['tokens_per_s']:,.0f} tokens/s, {best.figures['tflops_per_gpu']:.1f} TFLOP/s per GPU"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--global-batch", type=int, default=1792)
    parser.add_argument("--sample", type=int, default=100)
    parser.add_argument("--million", action="store_true")
    args = parser.parse_args(argv)

    from ddlsim.simulator import planner

    if args.million:
        model, gpus, device = args.model or "gpt3_175b", args.gpus or 4096, args.device or "h100_sxm5"
    else:
        model, gpus, device = args.model or "megatron_76b", args.gpus or 1024, args.device or "a100_sxm4_80gb"
    config = planner.load_model(model)
    cluster = planner.Cluster.of(device, gpus)
    started = time.perf_counter()
    if args.million:
        layouts, batch = [], 1024
        while len(layouts) < 1_000_000:
            layouts += planner.candidate_layouts(config, cluster, batch)
            batch += 256
        label = f"# {model} on {gpus} {device}, global batches 1024..{batch - 256} in steps of 256"
    else:
        layouts = list(planner.candidate_layouts(config, cluster, args.global_batch))
        label = f"# {model} on {gpus} {device}, global batch {args.global_batch}"
    enumerate_s = time.perf_counter() - started
    search_s, ranked, candidates = search(model, config, cluster, layouts)
    report(label, len(layouts), enumerate_s, search_s, ranked, candidates)
    print(f"  peak resident memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")
    if not args.million:  # what the exhaustive search would cost: the closed form's rate on a sample
        fitting = [candidate for candidate in planner.screen(config, cluster, layouts) if not candidate.reason]
        sample = random.Random(0).sample(fitting, min(args.sample, len(fitting)))
        started = time.perf_counter()
        for candidate in sample:
            planner.closed_form_figures((model, cluster, candidate.layout))
        rate = len(sample) / (time.perf_counter() - started)
        print(f"  exhaustive (every fitting layout timed): {len(fitting):,} x {1e3 / rate:.1f} ms = "
              f"about {len(fitting) / rate:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
