"""Issue 12's collective speed targets, measured on the whole ``ddlsim collective`` command.

Three tables:

1. every registered collective algorithm x every topology (switch, fat_tree, torus_2d, torus_3d,
   dragonfly: ``fabric_spec.TOPOLOGIES``) x one or eight devices per node, at 4096 and 131,072
   ranks, 100 MB all-reduce (``chain`` has no
   all-reduce: its broadcast is timed instead). Each cell runs ``python -m ddlsim collective ...``
   in a fresh process: the wall seconds of the whole command (interpreter start included), its CPU
   seconds (user + system: what the wall time would be on an idle machine), its peak resident
   memory, and the execution path the command printed. Targets: < 2 s at 4096 ranks, < 10 s at
   131,072 ranks, on the wall time. A cell that runs past ``--timeout`` is killed and shown as
   ``>T``; one that needs more than 8 GiB of address space fails with a MemoryError.
2. the message path on its own: a ring all-reduce run message by message (``MessageExecutor``) at
   32, 64 and 128 ranks, in-process (before issue 12: 1 s, 6 s and 74 s).
3. the flow network on its own: 4096 flows into one port at once, then 20,000 staggered flows.

    python benchmarks/collective_speed.py                      # everything (about 20 minutes)
    python benchmarks/collective_speed.py --ranks 4096 --algorithms ring,hierarchical
    python benchmarks/collective_speed.py --ranks 4096 --algorithms nccl,mpich   # library selectors
    python benchmarks/collective_speed.py --tables 2,3 --repeat 3

Timings on a shared machine are noisy: ``--repeat N`` runs every case N times and prints the
minimum and the median.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

TARGET_S = {4096: 2.0, 131072: 10.0}

MESSAGE_PATH = """
import sys, time
from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.engine.collective_engine import MessageExecutor
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec
ranks = int(sys.argv[1])
fabric = Fabric(FabricSpec(nodes=ranks, devices_per_node=1, network=load_link("ib_edr")))
schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", ranks)
started = time.perf_counter()
executor = MessageExecutor(fabric)
finish = executor.run(schedule, 100e6, 0.0)
print(time.perf_counter() - started, float(finish.max()), executor.transfers)
"""

INCAST = """
import sys, time
import numpy as np, simpy
from ddlsim.simulator.engine.flow_network import FlowNetwork
senders, staggered = int(sys.argv[1]), int(sys.argv[2])
# links: 0 = the server's port (12.5 GB/s), 1..senders = each sender's own port (12.5 GB/s)
env = simpy.Environment()
network = FlowNetwork(env, np.full(senders + 1, 12.5e9))
ends = []
def push(sender, start, nbytes):
    yield env.timeout(start)
    yield network.transfer([sender + 1, 0], nbytes)
    ends.append(env.now)
started = time.perf_counter()
for s in range(senders):                        # everyone pushes 244 MB at t = 0
    env.process(push(s, 0.0, 244e6))
rng = np.random.default_rng(1)
begin = senders * 244e6 / 12.5e9
for i, at in enumerate(np.sort(rng.uniform(begin, 2 * begin, staggered))):  # then a staggered stream
    env.process(push(i % senders, float(at), 1e6))
env.run()
print(time.perf_counter() - started, max(ends), len(ends))
"""

# the fluid path's compiled loop (``fluid_compiled``): numba compiles it the first time a run hands
# over, and keeps it in its cache; this child makes one run hand over at once, whatever the cache holds
COMPILED_LOOP = """
import time
started = time.perf_counter()
from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec
from ddlsim.simulator.engine.fluid_executor import FluidExecutor
spec = FabricSpec(nodes=16, devices_per_node=1, network=load_link("ib_edr"), topology="dragonfly",
                  nodes_per_router=2, routers_per_group=4)
executor = FluidExecutor(Fabric(spec))
executor.compiled_after = 0
executor.run(COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 16), 1e6, 0.0)
assert executor.compiled_instants > 0
print(time.perf_counter() - started)
"""


def compiled_loop_seconds(timeout_s: float) -> tuple[str, str]:
    """Seconds to reach the compiled loop in a fresh process: with an empty numba cache (what the
    first long fluid run after installing pays once) and with the cache the table's cells use (which
    this call fills where it was empty)."""
    shown = []
    with tempfile.TemporaryDirectory() as empty:
        for env in ({**os.environ, "NUMBA_CACHE_DIR": empty}, None):
            _, code, out, timed_out, _, _ = timed([sys.executable, "-c", COMPILED_LOOP], timeout_s, env)
            shown.append("failed" if timed_out or code else f"{float(out.split()[-1]):.1f} s")
    return shown[0], shown[1]


MEMORY_LIMIT_BYTES = 8 * 2**30  # a child that needs more is stopped (the machine is shared)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def timed(
    args: list[str], timeout_s: float, env: dict[str, str] | None = None
) -> tuple[float, int, str, bool, int, float]:
    """(wall seconds, exit status, output, timed out, peak RSS bytes, CPU seconds) of one child.

    The child writes into a temporary file and is reaped with ``os.wait4``, which gives its own
    resource usage (peak RSS, user + system CPU) rather than the sum over all children.
    """
    with tempfile.TemporaryFile("w+") as out:
        started = time.perf_counter()
        child = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, text=True, preexec_fn=_limit_memory, env=env
        )
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            wall = time.perf_counter() - started
            if pid:
                break
            if wall > timeout_s:
                child.kill()
                os.wait4(child.pid, 0)
                return wall, -1, "", True, 0, 0.0
            time.sleep(0.005)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
        out.seek(0)
        return wall, child.returncode, out.read(), False, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def command(algorithm: str, topology: str, dpn: int, ranks: int) -> list[str]:
    collective = "broadcast" if algorithm == "chain" else "allreduce"
    args = [sys.executable, "-m", "ddlsim", "collective", "--algorithm", algorithm, "--collective", collective]
    args += ["--message-bytes", "100MB", "--ranks", str(ranks), "--topology", topology, "--network", "ib_edr"]
    if dpn > 1:
        args += ["--devices-per-node", str(dpn), "--intra-node", "nvlink2"]
    return args


def path_of(out: str) -> str:
    for line in out.splitlines():
        words = line.split()
        if words and words[-1] in ("vectorised", "message", "fluid"):
            return words[-1]
    return "error: " + (out.strip().splitlines() or ["no output"])[-1][:60]


def collective_table(
    algorithms: list[str], topologies: list[str], ranks_list: list[int], repeat: int, timeout_s: float
) -> bool:
    print("# 1. ddlsim collective, 100 MB all-reduce (chain: broadcast), whole command")
    cold, warm = compiled_loop_seconds(timeout_s)
    print(f"# the fluid path's compiled loop in a fresh process: {cold} with numba's cache empty (once per")
    print(f"# installation: the first long fluid run pays it), {warm} from the cache the cells below use")
    header = f"{'algorithm':19} {'topology':9} {'dpn':>3} {'ranks':>7} {'min_s':>7} {'median_s':>8} {'cpu_s':>6}"
    print(f"{header} {'peak_MB':>7}  {'path':11} target")
    ok_all = True
    for algorithm in algorithms:
        for topology in topologies:
            for dpn in (1, 8):
                for ranks in ranks_list:
                    walls, cpus, peaks, path, timed_out = [], [], [], "", False
                    for _ in range(repeat):
                        wall, code, out, timed_out, peak, cpu = timed(
                            command(algorithm, topology, dpn, ranks), timeout_s
                        )
                        if timed_out:
                            break
                        walls.append(wall)
                        cpus.append(cpu)
                        peaks.append(peak)
                        lines = out.strip().splitlines() or ["no output"]
                        path = path_of(out) if code == 0 else "error: " + lines[-1][:70]
                    target = TARGET_S.get(ranks, 10.0)
                    if timed_out:
                        shown, median, cpu_s, peak_mb, verdict = f">{timeout_s:.0f}", "", "", "", "MISSED"
                    else:
                        shown, median = f"{min(walls):.2f}", f"{statistics.median(walls):.2f}"
                        cpu_s, peak_mb = f"{min(cpus):.2f}", f"{max(peaks) / 1e6:.0f}"
                        verdict = "ok" if min(walls) < target and not path.startswith("error") else "MISSED"
                    ok_all &= verdict == "ok"
                    print(
                        f"{algorithm:19} {topology:9} {dpn:>3} {ranks:>7} {shown:>7} {median:>8} {cpu_s:>6} "
                        f"{peak_mb:>7}  {path:11} {verdict} (< {target:g} s)",
                        flush=True,
                    )
    return ok_all


def child_table(title: str, code: str, cases: list[list[str]], label, repeat: int, timeout_s: float) -> None:
    print(title)
    for case in cases:
        runs = []
        for _ in range(repeat):
            _, code_rc, out, timed_out, _, _ = timed([sys.executable, "-c", code, *case], timeout_s)
            if timed_out or code_rc:
                runs = []
                break
            runs.append([float(x) for x in out.split()])
        if not runs:
            print(f"  {label(case)}: >{timeout_s:.0f} s or failed", flush=True)
            continue
        walls = [run[0] for run in runs]
        print(
            f"  {label(case)}: min {min(walls):.3f} s, median {statistics.median(walls):.3f} s; "
            f"simulated {runs[0][1]:.6g} s, {int(runs[0][2]):,} transfers/flows",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", default="1,2,3", help="which tables to print: 1, 2, 3 or a list")
    parser.add_argument("--ranks", default="4096,131072", help="rank counts of table 1")
    parser.add_argument("--algorithms", default=None, help="algorithms of table 1 (default: every registered one)")
    parser.add_argument("--topologies", default=None, help="topologies of table 1 (default: every one the fabric has)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a case is killed")
    args = parser.parse_args()
    tables = {int(t) for t in args.tables.split(",")}
    os.environ.setdefault("PYTHONHASHSEED", "0")
    ok = True
    if 1 in tables:
        if args.algorithms:
            algorithms = args.algorithms.split(",")
        else:
            from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS

            algorithms = list(COLLECTIVE_ALGORITHMS.names())
        from ddlsim.simulator.engine.fabric_spec import TOPOLOGIES

        topologies = args.topologies.split(",") if args.topologies else list(TOPOLOGIES)
        ranks = [int(r) for r in args.ranks.split(",")]
        ok = collective_table(algorithms, topologies, ranks, args.repeat, args.timeout)
    if 2 in tables:
        child_table(
            "# 2. message path alone: ring all-reduce of 100 MB, message by message (before: 1 s / 6 s / 74 s)",
            MESSAGE_PATH,
            [["32"], ["64"], ["128"]],
            lambda case: f"{case[0]:>4} ranks",
            args.repeat,
            args.timeout,
        )
    if 3 in tables:
        child_table(
            "# 3. flow network alone: N pushes of 244 MB into one port at once, then M staggered 1 MB pushes",
            INCAST,
            [["4096", "20000"]],
            lambda case: f"N={case[0]}, M={case[1]}",
            args.repeat,
            args.timeout,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
