"""The fluid path's instants in compiled code, for a long run with no period: ``fluid_executor``'s loop in numba.

``fluid_executor`` moves a collective's flows through instants with numpy: a few dozen array calls
per instant, each a microsecond or more whatever its size. Where an instant has a few hundred flows
that is the whole cost: torus_2d on a dragonfly at 131,072 ranks (folded to 256) has 139,032
instants at about 230 us each, and its ranks drift apart in classes that never repeat a state, so
no period is skipped (``fluid_steady``). This module runs the same loop compiled (numba): the same
model, the same arithmetic in the same order (a rank's next flows, the flows' order, each link's
sum of bounds, the max-min passes of ``max_min_fair_rates_flat`` entry by entry), about 10 us an
instant there (4.5 s for the run in-process, against 33.5 s).

The executor hands a run over (``finish``) once it has simulated ``FluidExecutor.compiled_after``
instants without finding a period, where the rest fits in memory (``MAX_PLACES``): every round from the
last rank's on is kept (no round is dropped, none skipped) and every flow the rest can start has a
place. Its state at that point (flows in flight and waiting, in order; every rank's progress
through the rounds built; the links' loads) goes in, the ranks' finish times come out. What the
kernel leaves out: the transfer log and link use (a run that keeps them is never handed over) and
the incremental re-rating (``fluid_rates.LinkRates.rerate``: its rates are to the bit those of
rating every flow afresh, which is what the kernel does at every instant).

numba compiles the kernel on first use and keeps it in its cache (``__pycache__`` beside this file,
or the user's cache directory): about 12 s once per installation on the 2-core development machine;
after that a fresh process reaches the kernel in about a second, numba's import (0.65 s) included,
which is why a short run is never handed over (``COMPILED_AFTER``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

if TYPE_CHECKING:
    from ddlsim.algorithms.schedule import Round, Schedule
    from ddlsim.simulator.engine.fluid_executor import FluidExecutor

__all__ = ["MAX_PLACES", "Handover", "finish"]

MAX_PLACES = 4_000_000  # flow places (and rounds x ranks of progress) a handed-over run may take


@njit(cache=True, error_model="numpy")
def _enter(who, at, k, s, st, w):
    """Ranks ``who`` enter round k at ``at`` (and pass through rounds they have nothing left in), as
    ``FluidExecutor.run``'s ``enter``; their flows join the waiting ones (``w``)."""
    (round_def, d_toff, d_left0, s_ptr, s_order, t_overhead, ranks, rounds, base) = s
    (st_left, st_done, st_entered, st_entry, current, finish, built) = st
    w_round, w_index, w_start, nw = w[0], w[1], w[2], w[3]
    while who.size:
        if k >= rounds:
            for i in range(who.size):
                finish[who[i]] = at[i]
            break
        while built[0] <= k:  # the round's progress, as ``_build`` starts it
            d, row = round_def[built[0]], (built[0] - base) * ranks
            for r in range(ranks):
                st_left[row + r] = d_left0[d * ranks + r]
                st_done[row + r] = -np.inf
                st_entered[row + r] = False
                st_entry[row + r] = -np.inf
            built[0] += 1
        d, row = round_def[k], (k - base) * ranks
        to, so = d_toff[d], d * (ranks + 1)
        for i in range(who.size):
            r = who[i]
            current[r] = k
            st_entered[row + r] = True
            st_entry[row + r] = at[i]
        for i in range(who.size):
            r = who[i]
            for p in range(s_ptr[so + r], s_ptr[so + r + 1]):
                t = s_order[p]
                w_round[nw[0]] = k
                w_index[nw[0]] = t
                w_start[nw[0]] = at[i] + t_overhead[to + t]
                nw[0] += 1
        through = 0
        for i in range(who.size):
            if st_left[row + who[i]] == 0:
                through += 1
        if through == 0:
            break
        nwho = np.empty(through, np.int64)
        nat = np.empty(through)
        j = 0
        for i in range(who.size):
            r = who[i]
            if st_left[row + r] == 0:
                nwho[j] = r
                nat[j] = max(at[i], st_done[row + r])
                j += 1
        who, at = nwho, nat
        k += 1


@njit(cache=True, error_model="numpy")
def _arrive(k, index, now, s, t, st, w, mark):
    """The transfers ``index`` of round k end at ``now`` and arrive; ranks with nothing left
    in the round move on (``FluidExecutor.run``'s ``arrive``, for one round)."""
    round_def, d_toff, ranks, base = s[0], s[1], s[6], s[8]
    t_src, t_dst, t_latency, t_reduce = t
    st_left, st_done, st_entered, st_entry, current = st[0], st[1], st[2], st[3], st[4]
    d, row = round_def[k], (k - base) * ranks
    to, count = d_toff[d], index.size
    touched = np.empty(2 * count, np.int64)
    n = 0
    for i in range(count):
        g = to + index[i]
        arrival = now + t_latency[g]
        a, b = t_src[g], t_dst[g]
        if arrival > st_done[row + a]:
            st_done[row + a] = arrival
        received = arrival + t_reduce[g]
        if received > st_done[row + b]:
            st_done[row + b] = received
        st_left[row + a] -= 1
        st_left[row + b] -= 1
        if not mark[a]:
            mark[a] = True
            touched[n] = a
            n += 1
        if not mark[b]:
            mark[b] = True
            touched[n] = b
            n += 1
    # the ranks touched in order (np.sort would add seconds to the compilation): an insertion sort
    # where they are few, else a pass over every rank's mark; either way at most ``ranks`` steps
    if n * n <= ranks:
        for i in range(1, n):
            r, j = touched[i], i - 1
            while j >= 0 and touched[j] > r:
                touched[j + 1] = touched[j]
                j -= 1
            touched[j + 1] = r
    else:
        n = 0
        for r in range(ranks):
            if mark[r]:
                touched[n] = r
                n += 1
    ready = 0
    for i in range(n):
        r = touched[i]
        mark[r] = False
        if st_left[row + r] == 0 and st_entered[row + r] and current[r] == k:
            touched[ready] = r
            ready += 1
    if ready:
        who = touched[:ready].copy()
        at = np.empty(ready)
        for i in range(ready):
            at[i] = max(st_entry[row + who[i]], st_done[row + who[i]])
        _enter(who, at, k + 1, s, st, w)


@njit(cache=True, error_model="numpy")
def _rates(f_cap, f_hlo, f_hhi, nf, h_link, binding, capacity, local, tolerance):
    """Max-min fair rates of the flows in flight, as ``LinkRates.rates`` over all of them: the
    passes of ``max_min_fair_rates_flat`` over the binding hops, entry by entry in the same order."""
    rates = f_cap[:nf].copy()
    entries = 0
    for i in range(nf):
        for h in range(f_hlo[i], f_hhi[i]):
            if binding[h_link[h]]:
                entries += 1
    if entries == 0:
        return rates
    owner = np.empty(entries, np.int64)  # the constrained flows numbered in order
    link = np.empty(entries, np.int64)  # the binding links numbered as first met
    row = np.empty(nf, np.int64)
    links = np.empty(entries, np.int64)
    nl = 0
    rows = 0
    e = 0
    for i in range(nf):
        row[i] = -1
        for h in range(f_hlo[i], f_hhi[i]):
            lk = h_link[h]
            if binding[lk]:
                if row[i] < 0:
                    row[i] = rows
                    rows += 1
                if local[lk] < 0:
                    local[lk] = nl
                    links[nl] = lk
                    nl += 1
                owner[e] = row[i]
                link[e] = local[lk]
                e += 1
    remaining = np.empty(nl)
    counts = np.zeros(nl, np.int64)
    for j in range(nl):
        remaining[j] = capacity[links[j]]
        local[links[j]] = -1  # (scratch: back to -1 for the next call)
    for e in range(entries):
        counts[link[e]] += 1
    bound = np.empty(rows)
    flow = np.empty(rows, np.int64)
    for i in range(nf):
        if row[i] >= 0:
            bound[row[i]] = f_cap[i]
            flow[row[i]] = i
    free = np.ones(rows, np.bool_)
    open_bounds = rows
    alive = np.ones(entries, np.bool_)
    open_entries = entries
    share = np.empty(nl)
    newly = np.zeros(rows, np.bool_)
    out = np.full(rows, np.inf)
    while open_entries or open_bounds:
        level = np.inf
        for j in range(nl):
            if counts[j] > 0:
                share[j] = remaining[j] / counts[j]
                if share[j] < level:
                    level = share[j]
            else:
                share[j] = np.inf
        for q in range(rows):
            if free[q] and bound[q] < level:
                level = bound[q]
        cut = level * (1 + tolerance)
        newly[:] = False
        for e in range(entries):
            if alive[e] and share[link[e]] <= cut:
                newly[owner[e]] = True
        for q in range(rows):
            if free[q] and bound[q] <= cut:
                newly[q] = True
        for q in range(rows):
            if newly[q]:
                out[q] = level
                if free[q]:
                    free[q] = False
                    open_bounds -= 1
        every = True
        for e in range(entries):
            if alive[e] and not newly[owner[e]]:
                every = False
                break
        if every:  # every entry's flow has its rate
            alive[:] = False
            open_entries = 0
            counts[:] = 0
            continue
        for e in range(entries):
            if alive[e] and newly[owner[e]]:
                remaining[link[e]] -= level
                alive[e] = False
                open_entries -= 1
                counts[link[e]] -= 1
    for q in range(rows):
        rates[flow[q]] = out[q]
    return rates


@njit(cache=True, error_model="numpy")
def _run(now, finish_tolerance, max_min_tolerance, s, t, more, st, w, f, links):
    """``FluidExecutor.run``'s loop from an instant just rated to the last arrival; returns the
    instants rated and the transfers arrived."""
    round_def, d_toff, ranks = s[0], s[1], s[6]
    t_nbytes, t_cap, t_instant, t_hlo, t_hhi, h_link = more
    w_round, w_index, w_start, nw = w
    f_round, f_index, f_remaining, f_cap, f_rate, f_finish, f_hlo, f_hhi, nflow = f
    load, users, capacity, threshold = links
    binding = np.zeros(load.size, np.bool_)
    local = np.full(load.size, -1, np.int64)
    mark = np.zeros(ranks, np.bool_)
    scratch = np.empty(max(w_round.size, 1), np.int64)
    instants = 0
    transfers = 0
    changed = False
    while True:
        nf = nflow[0]
        # flows that start now, by round in order (instant ones arrive at once)
        due = 0
        for i in range(nw[0]):
            if w_start[i] <= now:
                due += 1
        if due:
            changed = True
            d_round = np.empty(due, np.int64)
            d_index = np.empty(due, np.int64)
            j = kept = 0
            for i in range(nw[0]):
                if w_start[i] <= now:
                    d_round[j] = w_round[i]
                    d_index[j] = w_index[i]
                    j += 1
                else:
                    w_round[kept], w_index[kept], w_start[kept] = w_round[i], w_index[i], w_start[i]
                    kept += 1
            nw[0] = kept
            low = d_round.min()
            present = np.zeros(d_round.max() - low + 1, np.bool_)
            for i in range(due):
                present[d_round[i] - low] = True
            for kk in range(present.size):
                if not present[kk]:
                    continue
                k = low + kk
                to = d_toff[round_def[k]]
                count = 0
                for i in range(due):
                    if d_round[i] == k and t_instant[to + d_index[i]]:
                        scratch[count] = d_index[i]
                        count += 1
                if count:
                    transfers += count
                    _arrive(k, scratch[:count], now, s, t, st, w, mark)
                for i in range(due):
                    if d_round[i] == k and not t_instant[to + d_index[i]]:
                        g = to + d_index[i]
                        f_round[nf], f_index[nf] = k, d_index[i]
                        f_remaining[nf], f_cap[nf] = t_nbytes[g], t_cap[g]
                        f_hlo[nf], f_hhi[nf] = t_hlo[g], t_hhi[g]
                        f_rate[nf], f_finish[nf] = t_cap[g], np.inf  # (rated below, before any use)
                        nf += 1
            # the new flows' hops loaded, flow by flow in order (``LinkRates.started``)
            for i in range(nflow[0], nf):
                for h in range(f_hlo[i], f_hhi[i]):
                    load[h_link[h]] += f_cap[i]
                    users[h_link[h]] += 1
            nflow[0] = nf
            continue
        if changed:  # one re-rating per instant, after every start and end in it
            for i in range(nf):
                for h in range(f_hlo[i], f_hhi[i]):
                    lk = h_link[h]
                    binding[lk] = load[lk] > threshold[lk]
            rates = _rates(f_cap, f_hlo, f_hhi, nf, h_link, binding, capacity, local, max_min_tolerance)
            for i in range(nf):
                f_rate[i] = rates[i]
                f_finish[i] = now + max(f_remaining[i], 0.0) / rates[i]
            instants += 1
            changed = False
        if nf == 0 and nw[0] == 0:
            break
        following = np.inf
        for i in range(nf):
            if f_finish[i] < following:
                following = f_finish[i]
        for i in range(nw[0]):
            if w_start[i] < following:
                following = w_start[i]
        for i in range(nf):
            f_remaining[i] -= f_rate[i] * (following - now)
        now = following
        # flows that end now: arrive by round in order, their hops unloaded, their places dropped
        limit = now + finish_tolerance * max(abs(now), 1e-9)
        ended = 0
        for i in range(nf):
            if f_finish[i] <= limit:
                ended += 1
        if not ended:
            continue
        changed = True
        e_at = np.empty(ended, np.int64)
        j = 0
        for i in range(nf):
            if f_finish[i] <= limit:
                e_at[j] = i
                j += 1
        low = high = f_round[e_at[0]]
        for fl in e_at:
            if f_round[fl] < low:
                low = f_round[fl]
            if f_round[fl] > high:
                high = f_round[fl]
        for k in range(low, high + 1):
            count = 0
            for fl in e_at:
                if f_round[fl] == k:
                    scratch[count] = f_index[fl]
                    count += 1
            if count:
                transfers += count
                _arrive(k, scratch[:count], now, s, t, st, w, mark)
        for fl in e_at:
            for h in range(f_hlo[fl], f_hhi[fl]):
                load[h_link[h]] -= f_cap[fl]
                users[h_link[h]] -= 1
        for fl in e_at:
            for h in range(f_hlo[fl], f_hhi[fl]):
                if users[h_link[h]] == 0:
                    load[h_link[h]] = 0.0  # no drift: an idle link carries exactly nothing
        kept = 0
        for i in range(nf):
            if f_finish[i] > limit:
                f_round[kept], f_index[kept] = f_round[i], f_index[i]
                f_remaining[kept], f_cap[kept], f_rate[kept] = f_remaining[i], f_cap[i], f_rate[i]
                f_finish[kept], f_hlo[kept], f_hhi[kept] = f_finish[i], f_hlo[i], f_hhi[i]
                kept += 1
        nflow[0] = kept
    return instants, transfers


class Handover:
    """The rounds of a run as the kernel reads them: the round of each of ``runs`` from run ``first``
    on (the one the last rank is in), built once by the executor (``_build``: its routes, costs and
    compact link ids), flattened; ``round_def``: each round's run less ``first`` (-1 before it)."""

    def __init__(
        self,
        executor: FluidExecutor,
        schedule: Schedule,
        message_bytes: float,
        runs: list[tuple[Round, int]],
        first: int,
    ) -> None:
        ranks = schedule.ranks if executor.fold is None else executor.fold.ranks
        built = [executor._build(schedule, rnd, message_bytes) for rnd, _ in runs[first:]]
        counts = np.array([rd.src.size for rd in built], dtype=np.int64)
        self.ranks = ranks
        self.transfers = counts
        before = sum(count for _, count in runs[:first])
        repeats = [count for _, count in runs[first:]]
        self.round_def = np.concatenate([np.full(before, -1), np.repeat(np.arange(len(built)), repeats)])
        self.d_toff = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        hop_counts = np.array([rd.hop_link.size for rd in built], dtype=np.int64)
        hop_off = np.concatenate([[0], np.cumsum(hop_counts)])
        send_off = np.concatenate([[0], np.cumsum([rd.send_order.size for rd in built])])
        self.d_left0 = np.concatenate([rd.left for rd in built]).astype(np.int64)
        self.s_ptr = np.concatenate([rd.send_ptr + send_off[d] for d, rd in enumerate(built)]).astype(np.int64)
        self.s_order = np.concatenate([rd.send_order for rd in built]).astype(np.int64)

        def flat(name: str, dtype: Any = np.float64) -> np.ndarray:
            return np.concatenate([np.asarray(getattr(rd, name)) for rd in built]).astype(dtype)

        self.t_overhead, self.t_latency, self.t_reduce = flat("overhead_s"), flat("latency_s"), flat("reduce_s")
        self.t_src, self.t_dst = flat("src", np.int64), flat("dst", np.int64)
        self.t_nbytes, self.t_cap, self.t_instant = flat("nbytes"), flat("cap_Bps"), flat("instant", np.bool_)
        self.t_hlo = np.concatenate([rd.hop_ptr[:-1] + hop_off[d] for d, rd in enumerate(built)]).astype(np.int64)
        self.t_hhi = np.concatenate([rd.hop_ptr[1:] + hop_off[d] for d, rd in enumerate(built)]).astype(np.int64)
        self.h_link = flat("hop_link", np.int64)

    def places(self, low: int) -> int:
        """Flows that rounds ``low`` on can start (each transfer of each round at most once)."""
        return int(self.transfers[self.round_def[low:]].sum())


def finish(
    h: Handover,
    now: float,
    tolerances: tuple[float, float],
    low: int,
    built: int,
    progress: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    current: np.ndarray,
    finish_s: np.ndarray,
    flows: tuple[np.ndarray, ...],
    waiting: tuple[np.ndarray, ...],
    links: tuple[np.ndarray, ...],
) -> tuple[int, int]:
    """Run the rest of a fluid run compiled, from an instant just rated: ``progress`` (per round from
    ``low``: left, done, entered, entry per rank), ``flows`` in flight (round, transfer, remaining,
    bound, rate, finish: in order, none ended), ``waiting`` (round, transfer, start), the links'
    (load, users, capacity, threshold). ``finish_s`` gets every rank's finish time; returns the
    instants rated and the transfers arrived."""
    ranks, rounds = h.ranks, h.round_def.size
    span = (rounds - low) * ranks
    st_left = np.zeros(span, dtype=np.int64)
    st_done, st_entry = np.full(span, -np.inf), np.full(span, -np.inf)
    st_entered = np.zeros(span, dtype=np.bool_)
    for k, (left, done, entered, entry) in progress.items():
        row = slice((k - low) * ranks, (k - low + 1) * ranks)
        st_left[row], st_done[row], st_entered[row], st_entry[row] = left, done, entered, entry
    # every flow in flight or waiting is among ``places(low)`` too: the slack guards the kernel's
    # unchecked writes all the same
    places = h.places(low) + flows[0].size + waiting[0].size
    w_round, w_index, w_start = np.empty(places, np.int64), np.empty(places, np.int64), np.empty(places)
    nw = np.array([waiting[0].size], dtype=np.int64)
    w_round[: nw[0]], w_index[: nw[0]], w_start[: nw[0]] = waiting
    f = [np.empty(places, np.int64), np.empty(places, np.int64)] + [np.empty(places) for _ in range(4)]
    count = flows[0].size
    for into, values in zip(f, flows, strict=True):
        into[:count] = values
    to = h.d_toff[h.round_def[flows[0]]] + flows[1]
    f_hlo, f_hhi = np.empty(places, np.int64), np.empty(places, np.int64)
    f_hlo[:count], f_hhi[:count] = h.t_hlo[to], h.t_hhi[to]
    s = (h.round_def, h.d_toff, h.d_left0, h.s_ptr, h.s_order, h.t_overhead, ranks, rounds, low)
    st = (st_left, st_done, st_entered, st_entry, current, finish_s, np.array([built], dtype=np.int64))
    more = (h.t_nbytes, h.t_cap, h.t_instant, h.t_hlo, h.t_hhi, h.h_link)
    instants, transfers = _run(
        now,
        tolerances[0],
        tolerances[1],
        s,
        (h.t_src, h.t_dst, h.t_latency, h.t_reduce),
        more,
        st,
        (w_round, w_index, w_start, nw),
        (*f, f_hlo, f_hhi, np.array([count], dtype=np.int64)),
        links,
    )
    return int(instants), int(transfers)
