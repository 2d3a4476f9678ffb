"""Collectives in flight together on the round path: their round structures as ``lockstep`` times them.

``lockstep`` times collectives whose ranks each move in lockstep from one representative rank per
collective and a rate per collective for every set of rounds in flight together; it knows nothing of
routes. The round executor (``collective_engine.VectorisedExecutor.run_concurrently``) looks up each
collective's rounds as it would to execute them (``round_structures.Structure``); this module turns
them into what ``lockstep`` needs, with the proofs that make its answer exact:

* ``lockstep_round``: a run of identical rounds is one ``LockstepRound`` only if it is a shift whose
  transfers are all alike (equal bytes, latencies, overheads, reduction times);
* ``lockstep_rates``: the max-min fair rates of all flows of the rounds in flight together, their
  paths' bottlenecks as private links (as in the flow network), must give every flow of one
  collective the same rate;
* ``time_in_lockstep``: no third flow may be on their links (``link_state``: what was known before
  their rounds were looked up) when they enter.

Each raises ``ContentionDetected`` where its proof fails; the executor then times them otherwise.
"""

from __future__ import annotations

import numpy as np

from ddlsim.hardware_models.network import FINISH_TOLERANCE, max_min_fair_rates_flat
from ddlsim.simulator.engine.link_state import ContentionDetected, LinkState
from ddlsim.simulator.engine.lockstep import LockstepRound, lockstep_exits
from ddlsim.simulator.engine.round_fluid import unique_ints
from ddlsim.simulator.engine.round_structures import Structure

__all__ = ["lockstep_rates", "lockstep_round", "time_in_lockstep"]


def lockstep_round(st: Structure, count: int) -> LockstepRound:
    """A run of ``count`` identical rounds as each rank of a collective in lockstep sees it (its bytes
    looked up: ``st.bytes``); ``ContentionDetected`` unless the round is a shift whose transfers are
    all alike. Its key is its structure's id."""
    rb = st.bytes
    assert rb is not None
    if not st.shift:
        raise ContentionDetected("a collective in flight with another has a round that is not a shift")
    values = [np.atleast_1d(rb.nbytes), st.alpha_s, st.overhead_s]
    if rb.reduce_s is not None:
        values.append(rb.reduce_s)
    if any(value.size and np.any(value != value[0]) for value in values):
        raise ContentionDetected("a collective in flight with another has a round of unlike transfers")
    overhead, alpha = float(st.overhead_s[0]), float(st.alpha_s[0])
    reduce_s = 0.0 if rb.reduce_s is None else float(rb.reduce_s[0])
    return LockstepRound(id(st), overhead, alpha - overhead, float(np.atleast_1d(rb.nbytes)[0]), reduce_s, count)


def time_in_lockstep(
    capacity_Bps: np.ndarray,
    known: LinkState,
    used: list[list[Structure]],
    lanes: list[list[LockstepRound]],
    starts: list[float],
) -> tuple[list[np.ndarray], list[tuple[float, float]]]:
    """(per collective the links its flows cross, and its exit time and last flow's end) of the
    collectives whose runs of rounds are ``lanes`` (built by ``lockstep_round`` from the structures
    ``used``), entered at ``starts``; ``known``: the link state before their rounds were looked up.
    ``ContentionDetected`` where a third flow may be on their links or their rates differ."""
    by_key = {id(st): st for structures in used for st in structures}
    links = [unique_ints(np.concatenate([st.flat_links for st in structures])) for structures in used]
    for collective_links, start in zip(links, starts, strict=True):
        if collective_links.size and known.busy_before(collective_links).max() > start:
            raise ContentionDetected("a collective in flight with another meets a third flow on a link")
    timed = lockstep_exits(
        lanes, starts, lambda key: lockstep_rates(capacity_Bps, tuple(None if k is None else by_key[k] for k in key))
    )
    return links, timed


def lockstep_rates(capacity_Bps: np.ndarray, key: tuple[Structure | None, ...]) -> tuple[float, ...]:
    """The max-min fair rate of each collective's flows in flight (``key``: its round's structure,
    None where none), their paths' bottlenecks taking part as private links (as in the flow
    network); ``ContentionDetected`` unless every flow of one collective gets the same rate."""
    flowing = [st for st in key if st is not None]
    if not flowing:
        return (0.0,) * len(key)
    sizes = [st.src.size for st in flowing]
    flows = sum(sizes)
    offsets = np.cumsum([0, *sizes])
    distinct, local = np.unique(np.concatenate([st.flat_links for st in flowing]), return_inverse=True)
    owner = np.concatenate([st.flat_owner + offset for st, offset in zip(flowing, offsets, strict=False)])
    rates = max_min_fair_rates_flat(
        np.concatenate([owner, np.arange(flows)]),
        np.concatenate([local.ravel(), distinct.size + np.arange(flows)]),
        flows,
        np.concatenate([capacity_Bps[distinct], *(st.bottleneck_Bps for st in flowing)]),
    )
    result, position = [], 0
    for st in key:
        if st is None:
            result.append(0.0)
            continue
        mine = rates[offsets[position] : offsets[position + 1]]
        position += 1
        if mine.max() - mine.min() > FINISH_TOLERANCE * mine.max():
            raise ContentionDetected("flows of a collective in flight with another get unequal rates")
        result.append(float(mine.min()))
    return tuple(result)
