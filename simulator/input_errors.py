"""The error every invalid setting raises, and the checks that the training scenario and the
collective command share: a module of its own so that ``ddlsim collective`` reads its settings
without loading the training side (``scenario.py`` and what it imports: the algorithms, workloads,
transformer configurations; about 70 ms a start)."""

from __future__ import annotations

from ddlsim.hardware_models.catalog import load_link

__all__ = ["ScenarioError", "check_sockets"]


class ScenarioError(ValueError):
    """The scenario is invalid; the message names the setting and what is allowed."""


def check_sockets(devices_per_node: int, sockets: int, socket_link: str | None) -> None:
    """A node's devices split evenly over its sockets, joined by an intra-node ``socket_link``."""
    if devices_per_node % sockets:
        raise ScenarioError(f"--sockets {sockets} does not divide --devices-per-node {devices_per_node} evenly")
    if sockets > 1 and not socket_link:
        raise ScenarioError("--sockets > 1 needs --socket-link (the link between two sockets, e.g. qpi)")
    if socket_link and load_link(socket_link).kind != "intra_node":
        raise ScenarioError(f"--socket-link {socket_link!r} is a network, not an intra-node link")
