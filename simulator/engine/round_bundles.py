"""A round whose flows travel in bundles: its overlap check and link-state commit per bundle, not per hop.

A bundle is a set of a round's transfers whose binding routes are the same links in the same order:
the devices of one node sending to those of another through the node's network port (torus_2d's
column ring with eight devices per node, where every rank sends to its counterpart on the next
node). Where no link carries flows of two bundles, a link's flows are exactly its bundle's, so what
the round executor (``collective_engine.VectorisedExecutor``) computes per hop over a link's flows it
can compute once per bundle and link:

* the overlap check (does a flow start on a link several senders use before that link's busy time?)
  needs the earliest flow start on the link: its bundle's earliest;
* the commit (the link is busy until the latest end of its flows; its writer is the flow that ends
  there last, of several the highest-numbered, as the hop lists leave it) needs the bundle's latest
  end and the highest-numbered of its flows that end then.

Minima and maxima are exact in any order, so this gives the hop lists' link state to the bit, with
one entry per bundle and link instead of one per flow and link (an eighth at eight per node). Taken
(``Bundles.of``) where it at least halves the entries; the round's contended flows' end times, the
overlap group with the previous round (which needs the hop lists) and every other use of the round
are unchanged. ``tests/test_round_bundles.py`` holds it to the hop lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ddlsim.simulator.engine.round_fluid import Runs


@dataclass
class Bundles:
    """A round's transfers grouped into bundles (only those with binding hops), and each bundle's links.

    ``order``: the transfers bundle by bundle, in increasing order within each (None: that is
    ``arange`` of every transfer); ``runs``: the bundles in that order; ``link`` and ``bundle``: one
    entry per bundle and link it crosses (every link once).
    """

    order: np.ndarray | None
    runs: Runs
    link: np.ndarray
    bundle: np.ndarray
    index: np.ndarray  # ``order``, or where that is None ``arange``
    checked: np.ndarray  # positions in ``link`` of links several senders use (refreshed per ``version``)
    version: int = -1

    @staticmethod
    def of(
        flat_links: np.ndarray, flat_owner: np.ndarray, transfers: int, links: int, halve: bool = True
    ) -> Bundles | None:
        """The bundles of a round's binding hops (``flat_links[e]`` crossed by transfer ``flat_owner[e]``,
        owners non-decreasing; link ids below ``links``), or None where a link carries flows with
        different routes, or (``halve``) bundling would not halve the entries."""
        if flat_links.size < 2:
            return None
        hops = np.bincount(flat_owner, minlength=transfers)
        first_entry = np.cumsum(hops) - hops
        routed = np.flatnonzero(hops)
        # a bundle is keyed by its first link: where no link carries two routes, flows sharing their
        # first link share every link (checked below)
        first_link = flat_links[first_entry[routed]]
        by_link = np.argsort(first_link, kind="stable")
        order, key = routed[by_link], first_link[by_link]
        starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        sizes = np.diff(np.append(starts, order.size))
        if halve and 2 * int(hops[order[starts]].sum()) > flat_links.size:
            return None  # before any pass over the hops: the entries would be the representatives'
        representative = np.repeat(order[starts], sizes)  # per position in ``order``: its bundle's lowest
        rep = np.empty(transfers, dtype=np.int64)
        rep[order] = representative
        if not np.array_equal(hops[order], hops[representative]):
            return None
        position = np.arange(flat_links.size) - first_entry[flat_owner]
        if not np.array_equal(flat_links, flat_links[first_entry[rep[flat_owner]] + position]):
            return None
        own = rep[flat_owner] == flat_owner  # the representatives' hops: one entry per bundle and link
        bundle_links = flat_links[own]
        if np.bincount(bundle_links, minlength=links).max() > 1:
            return None
        label = np.empty(transfers, dtype=np.int64)
        label[order] = np.repeat(np.arange(starts.size), sizes)
        identity = order.size == transfers and bool(np.all(order == np.arange(transfers)))
        by_id = np.argsort(bundle_links)  # the link state read and written in order of link id
        return Bundles(
            None if identity else order,
            Runs.of_bounds(starts, order.size),
            bundle_links[by_id],
            label[flat_owner[own]][by_id],
            order,
            np.arange(bundle_links.size),
        )

    def refresh(self, link_sender: np.ndarray, version: int) -> None:
        """Recompute ``checked`` for the executor's shared-link ``version`` (-2: several senders)."""
        if self.version != version:
            self.checked = np.flatnonzero(link_sender[self.link] == -2)
            self.version = version

    def commit(
        self,
        flow_start: np.ndarray,
        ends: np.ndarray,
        busy_until: np.ndarray,
        writer_serial: np.ndarray,
        writer_index: np.ndarray,
        alone: np.ndarray,
        serial: int,
    ) -> bool:
        """The round executor's overlap check and commit on the checked links (``refresh``), per bundle:
        False, changing nothing, where some flow would start on one before its busy time (the hop lists
        then decide: an overlap group needs them); else each such link busy until its flows' latest
        end (``ends``: per transfer, flow start + flow seconds), and where one ends no earlier than the
        link was busy, that flow its writer, of round ``serial``, alone there from that busy time."""
        if not self.checked.size:
            return True
        if self.checked.size == self.link.size:
            links, bundle = self.link, self.bundle
        else:
            links, bundle = self.link[self.checked], self.bundle[self.checked]
        before = busy_until[links]
        if np.any(self.earliest(flow_start)[bundle] < before):
            return False
        latest, last = self.latest(ends)
        end = latest[bundle]
        busy_until[links] = np.maximum(before, end)
        written = end >= before  # the flows ending last there end no earlier than the new busy time
        if not written.all():
            links, bundle, before = links[written], bundle[written], before[written]
        writer_serial[links] = serial
        writer_index[links] = last[bundle]
        alone[links] = before
        return True

    def _grouped(self, values: np.ndarray) -> np.ndarray:
        return values if self.order is None else values[self.order]

    def earliest(self, flow_start: np.ndarray) -> np.ndarray:
        """Per bundle: its flows' earliest start."""
        return self.runs.reduce(self._grouped(flow_start), np.minimum)

    def latest(self, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per bundle: (its flows' latest end, the highest-numbered flow that ends then)."""
        grouped = self._grouped(ends)
        latest = self.runs.reduce(grouped, np.maximum)
        at_latest = grouped == self.runs.spread(latest)
        return latest, self.runs.reduce(np.where(at_latest, self.index, -1), np.maximum)
