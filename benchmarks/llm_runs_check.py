"""Check the transformer FLOPs counts and the memory model against the published runs of llm_dev.csv (issue 14).

    python benchmarks/llm_runs_check.py [--measurements FILE]

Prints, row by row: how each row maps onto ddlsim (or why it cannot), our FLOPs against the
source's own second figure (NeMo: TFLOP/s / tokens/s; Korthikanti et al.: MFU; Narayanan et al.:
parameters), the memory of the fullest pipeline rank against the device, and the largest
fragmentation allowance that refuses none of the runs (the one ``simulator/workloads/transformer_memory.py``
uses). Exits 1 if a run that ran is refused.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddlsim.simulator.workloads.llm_checks import flops_checks, largest_fragmentation, memory_checks
from ddlsim.simulator.workloads.llm_runs import DATA_FILE, mapped_runs
from ddlsim.simulator.workloads.transformer_memory import FRAGMENTATION, RUNTIME_RESERVE_BYTES


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measurements", type=Path, default=DATA_FILE)
    args = parser.parse_args()
    mapped, unmapped = mapped_runs(args.measurements)
    print(f"{args.measurements}: {len(mapped) + len(unmapped)} rows, {len(mapped)} mapped")
    for item in unmapped:
        print(f"  {item.run.id}: not mapped: {item.reason}")

    print("\nFLOPs: ours against the source's second figure")
    checks, skipped = flops_checks(mapped)
    for check in checks:
        print(f"  {check.run_id}  {check.what:24s} published {check.published:12.5g}  ours {check.modelled:12.5g}"
              f"  {100 * check.relative_error:+6.2f}%")
    for run_id, reason in skipped:
        print(f"  {run_id}  not compared: {reason}")
    per_token = [abs(c.relative_error) for c in checks if c.what == "model FLOPs per token"]
    if per_token:
        print(f"  model FLOPs per token: median |error| {100 * statistics.median(per_token):.2f}%, "
              f"max {100 * max(per_token):.2f}% over {len(per_token)} NeMo rows")

    print("\nMemory of the fullest pipeline rank (GB = 1e9 B)")
    memory, not_checked = memory_checks(mapped)
    for check in memory:
        verdict = "fits" if check.fits else "REFUSED"
        print(f"  {check.run_id}  rank {check.stage:2d}  model {check.before_allowances_bytes / 1e9:6.1f}  "
              f"with allowances {check.total_bytes / 1e9:6.1f}  capacity {check.capacity_bytes / 1e9:5.1f}  "
              f"headroom {100 * (check.capacity_bytes / check.before_allowances_bytes - 1):+5.1f}%  {verdict}")
    for run_id, reason in not_checked:
        print(f"  {run_id}  not checked: {reason}")
    bound = largest_fragmentation(memory, RUNTIME_RESERVE_BYTES)
    tightest = min(memory, key=lambda c: (c.capacity_bytes - RUNTIME_RESERVE_BYTES) / c.before_allowances_bytes)
    print(f"  largest fragmentation allowance refusing no run (reserve {RUNTIME_RESERVE_BYTES / 1e9:.1f} GB): "
          f"{bound:.2f} (bound by {tightest.run_id}); memory.py uses {FRAGMENTATION:.2f}")
    refused = [check.run_id for check in memory if not check.fits]
    print(f"  runs refused: {len(refused)} of {len(memory)} {refused if refused else ''}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
