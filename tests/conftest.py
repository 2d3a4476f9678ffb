"""Shared fixtures: small fabrics built from the real catalog."""

from __future__ import annotations

import pytest

from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec


@pytest.fixture
def switch_fabric():
    def build(nodes: int, devices_per_node: int = 1, **kwargs) -> Fabric:
        spec = FabricSpec(
            nodes=nodes,
            devices_per_node=devices_per_node,
            peer_link=load_link("nvlink2") if devices_per_node > 1 else None,
            host_link=load_link("pcie3_x16") if devices_per_node > 1 else None,
            network=load_link("ib_edr") if nodes > 1 else None,
            **kwargs,
        )
        return Fabric(spec)

    return build
