"""Issue 3's speed targets: message-faithful ring all-reduce in the DES.

* 100 MB over 4096 ranks on a single switch: under 1 s of wall time;
* 1 GB over 512 ranks: under 0.2 s;
* peak memory under 1 GB.

Each case runs in a fresh Python process (so peak RSS is that case's own), three times; the
script prints the minimum and median wall time of the simulation itself, the process's peak
resident memory, the simulated time and the transfer count.

    python benchmarks/collective_speed.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

CASES = [("ring 100 MB x 4096 ranks", 4096, 100e6, 1.0), ("ring 1 GB x 512 ranks", 512, 1e9, 0.2)]

CHILD = """
import json, resource, sys, time
from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.engine.collective_engine import VectorisedExecutor
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec
ranks, size = int(sys.argv[1]), float(sys.argv[2])
fabric = Fabric(FabricSpec(nodes=ranks, devices_per_node=1, network=load_link("ib_edr")))
schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", ranks)
started = time.perf_counter()
executor = VectorisedExecutor(fabric)
finish = executor.run(schedule, size, 0.0)
wall = time.perf_counter() - started
print(json.dumps({"wall_s": wall, "simulated_s": float(finish.max()), "transfers": executor.transfers,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def main() -> int:
    failed = False
    for label, ranks, size, limit in CASES:
        runs = []
        for _ in range(3):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(ranks), str(size)], capture_output=True, text=True, check=True
            ).stdout
            runs.append(json.loads(out))
        walls = [run["wall_s"] for run in runs]
        peak = max(run["peak_rss_bytes"] for run in runs)
        ok = min(walls) < limit and peak < 1e9
        failed |= not ok
        print(
            f"{label}: wall min {min(walls):.3f} s, median {statistics.median(walls):.3f} s (target < {limit} s); "
            f"peak RSS {peak / 1e6:.0f} MB (target < 1000 MB); simulated {runs[0]['simulated_s'] * 1e3:.3f} ms; "
            f"{runs[0]['transfers']:,} transfers; {'OK' if ok else 'MISSED'}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
