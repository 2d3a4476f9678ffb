"""The hardware catalog: every datasheet loads, cites its sources, and converts units as a calculator says.

The loader is tested against small datasheets written to a temporary directory: each broken
file must be rejected with a message that names the file and the offending key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlsim.hardware_models.catalog import (
    CATALOG_ENVIRONMENT_VARIABLE,
    DEVICE_KINDS,
    LINK_KINDS,
    PEAK_PRECISIONS,
    CatalogError,
    catalog_directories,
    device_names,
    forget_catalog_directories,
    link_names,
    load_device,
    load_device_file,
    load_link,
    load_link_file,
    register_catalog_directory,
)
from ddlsim.registry import UnknownNameError

DOCS = Path(__file__).resolve().parent.parent / "docs" / "hardware.md"

REQUIRED_DEVICES = [
    "knl_7250", "knl_7230", "knl_7250_snc4", "xeon_8160", "xeon_8180", "xeon_6148", "xeon_8380h",
    "k20x", "k40", "k80", "m40", "titanx_pascal", "p40", "p100_pcie", "p100_sxm2",
    "v100_pcie", "v100_sxm2", "v100_sxm3", "v100_sxm3_h", "v100s_pcie", "a100_sxm4", "h100_sxm5",
    # large-model era (issue 14)
    "a100_sxm4_80gb", "h100_pcie", "h200_sxm", "b200", "gb200", "gb300", "mi300x", "gaudi2", "tpu_v4", "tpu_v5p",
    "tpu_v3",  # the measurement schema's TPU (MLPerf-era pods)
]  # fmt: skip
REQUIRED_INTRA_NODE = [
    "pcie3_x16", "pcie4_x16", "nvlink1", "nvlink2", "nvlink3", "nvswitch", "nvswitch2", "upi", "knl_mesh",
    "pcie5_x16", "nvlink4", "nvlink5", "nvswitch3", "nvswitch4", "nvl72", "infinity_fabric_mi300x", "gaudi2_roce",
    "tpu_v3_ici", "tpu_v4_ici", "tpu_v5p_ici",
]  # fmt: skip
REQUIRED_NETWORKS = [
    "opa_100", "ib_fdr", "ib_edr", "ib_hdr", "ib_ndr", "ib_xdr",
    "eth_1g", "eth_10g", "eth_25g", "eth_100g", "roce_25g", "roce_100g", "roce_200g", "roce_400g", "aries",
    # the rates between (40 and 50 Gb/s Ethernet, RoCE on them) and QDR InfiniBand, so a cluster of that class
    # is not refused for its network
    "ib_qdr", "eth_40g", "eth_50g", "roce_40g", "roce_50g",
]  # fmt: skip

DEVICE_QUANTITIES = {"memory_bandwidth", "memory_capacity", "on_chip_memory", "compute_efficiency",
                     "memory_efficiency"}  # fmt: skip
LINK_QUANTITIES = {"bandwidth", "latency", "per_message_overhead", "efficiency"}
SYSTEM_KEYS = ("devices_per_node", "intra_node_link", "network", "nics_per_node")


# --- every shipped datasheet ---------------------------------------------------------------------


def test_required_tokens_are_all_present() -> None:
    assert sorted(set(REQUIRED_DEVICES) - set(device_names())) == []
    assert sorted(set(REQUIRED_INTRA_NODE + REQUIRED_NETWORKS) - set(link_names())) == []


def test_link_kinds_split_the_links() -> None:
    assert set(REQUIRED_INTRA_NODE) <= set(link_names("intra_node"))
    assert set(REQUIRED_NETWORKS) <= set(link_names("network"))


@pytest.mark.parametrize("token", device_names())
def test_device_loads_with_a_source_for_every_number(token: str) -> None:
    device = load_device(token)
    assert device.token == token
    assert device.description.strip()
    assert device.kind in DEVICE_KINDS
    system = {f"system.{key}" for key in SYSTEM_KEYS} if device.system else set()
    if device.system is not None and device.system.host_link is not None:
        system.add("system.host_link")
    assert set(device.sources) == DEVICE_QUANTITIES | set(device.peak_flops) | set(device.layer_efficiency) | system
    for key, source in device.sources.items():
        assert len(source.strip()) > 20, f"{token}: source of {key!r} does not name a document"
    assert set(device.peak_flops) <= set(PEAK_PRECISIONS)
    for precision, peak in device.peak_flops.items():
        assert peak >= device.peak_flops["fp32"], f"{token}: {precision} peak below fp32"
    assert device.memory_capacity_bytes > device.on_chip_memory_bytes


@pytest.mark.parametrize("token", link_names())
def test_link_loads_with_a_source_for_every_number(token: str) -> None:
    link = load_link(token)
    assert link.token == token
    assert link.description.strip()
    assert link.kind in LINK_KINDS
    expected = LINK_QUANTITIES | ({"links_per_device"} if link.links_per_device > 1 else set())
    expected |= ({"domain_size"} if link.domain_size else set()) | ({"topology"} if link.topology else set())
    assert set(link.sources) >= expected
    for key, source in link.sources.items():
        assert len(source.strip()) > 20, f"{token}: source of {key!r} does not name a document"


@pytest.mark.parametrize("token", device_names())
def test_device_file_loads_the_same_through_either_entry(token: str) -> None:
    path = Path(__file__).resolve().parent.parent / "hardware_models" / "devices" / f"{token}.toml"
    assert load_device_file(path) == load_device(token)


@pytest.mark.parametrize("token", device_names() + link_names())
def test_every_token_is_documented(token: str) -> None:
    assert f"`{token}`" in DOCS.read_text(encoding="utf-8")


def test_device_kinds() -> None:
    kinds = {token: load_device(token).kind for token in REQUIRED_DEVICES}
    assert {token for token, kind in kinds.items() if kind == "manycore"} == {"knl_7250", "knl_7230", "knl_7250_snc4"}
    assert {token for token, kind in kinds.items() if kind == "cpu"} == {
        "xeon_8160", "xeon_8180", "xeon_6148", "xeon_8380h"
    }  # fmt: skip


# --- hand-checked conversions ---------------------------------------------------------------------


def test_ib_edr_line_rate() -> None:
    """100 Gbit/s / 8 bits per byte = 12.5e9 B/s; port = 12.5e9 x 0.96 (NCCL's NET_WIDTH 12) = 12.0e9 B/s."""
    link = load_link("ib_edr")
    assert link.bandwidth_Bps == 12.5e9
    assert link.port_bandwidth_Bps == pytest.approx(12.0e9)
    assert link.latency_s == pytest.approx(0.9e-6)


def test_aries_is_its_nic() -> None:
    """64 B every 5 cycles at 800 MHz = 10.24e9 B/s; x 0.73 = 7.4752e9 B/s, the Cray white paper's measured
    7.5 GB/s each way within 0.4 %; 0.8 us (8-byte put) + 0.5 us (MPI software) = its 1.3 us MPI message."""
    link = load_link("aries")
    assert link.kind == "network" and link.links_per_device == 1
    assert link.bandwidth_Bps == pytest.approx(64 * 800e6 / 5)
    assert link.port_bandwidth_Bps == pytest.approx(7.4752e9)
    assert link.port_bandwidth_Bps == pytest.approx(7.5e9, rel=0.004)
    assert link.latency_s + link.per_message_overhead_s == pytest.approx(1.3e-6)


def test_ib_fdr_data_rate() -> None:
    """54.54 Gbit/s (56.25 Gbaud x 64/66) / 8 = 6.8175e9 B/s."""
    assert load_link("ib_fdr").bandwidth_Bps == pytest.approx(6.8175e9)


def test_pcie3_x16_after_128b_130b() -> None:
    """16 lanes x 8 GT/s x 128/130 / 8 = 15.754e9 B/s, written as 15.75 GB/s."""
    link = load_link("pcie3_x16")
    assert link.bandwidth_Bps == pytest.approx(16 * 8e9 * 128 / 130 / 8, rel=1e-3)
    assert link.links_per_device == 1


def test_nvlink2_port_bundles_six_links() -> None:
    """6 links x 25e9 B/s x efficiency; at 0.9 that is 135e9 B/s per direction."""
    link = load_link("nvlink2")
    assert link.bandwidth_Bps == 25e9
    assert link.links_per_device == 6
    assert link.port_bandwidth_Bps == pytest.approx(6 * 25e9 * link.efficiency)


def test_nvswitch_generations() -> None:
    """DGX-2: 6 x 25e9 = 150e9 B/s raw per GPU; DGX A100: 12 x 25e9 = 300e9 B/s raw per GPU."""
    first, second = load_link("nvswitch"), load_link("nvswitch2")
    assert first.bandwidth_Bps * first.links_per_device == 150e9
    assert second.bandwidth_Bps * second.links_per_device == 300e9


def test_ethernet_is_quoted_in_bits() -> None:
    """1, 10, 25, 40, 50 and 100 Gbit/s are 0.125, 1.25, 3.125, 5, 6.25 and 12.5 GB/s; QDR carries 32 Gb/s of
    data on its 40 Gb/s signalling (8b/10b)."""
    tokens = ("eth_1g", "eth_10g", "eth_25g", "eth_40g", "eth_50g", "eth_100g", "roce_40g", "roce_50g", "ib_qdr")
    rates = {token: load_link(token).bandwidth_Bps for token in tokens}
    assert rates == {"eth_1g": 0.125e9, "eth_10g": 1.25e9, "eth_25g": 3.125e9, "eth_40g": 5e9, "eth_50g": 6.25e9,
                     "eth_100g": 12.5e9, "roce_40g": 5e9, "roce_50g": 6.25e9, "ib_qdr": 4e9}  # fmt: skip


def test_device_figures() -> None:
    """Decimal prefixes: 16 GB = 16e9 B, 732 GB/s = 732e9 B/s, 3.35 TB/s = 3.35e12 B/s, 4 MB = 4e6 B."""
    p100 = load_device("p100_sxm2")
    assert (p100.memory_capacity_bytes, p100.memory_bandwidth_Bps, p100.on_chip_memory_bytes) == (
        16e9, 732e9, 4e6
    )  # fmt: skip
    assert load_device("h100_sxm5").memory_bandwidth_Bps == pytest.approx(3.35e12)
    assert load_device("knl_7250").memory_capacity_bytes == 16e9  # MCDRAM, not DDR


def test_four_snc4_quadrants_make_one_knl_7250() -> None:
    """SNC-4: 17 cores x 1.4 GHz x 64 = 1.5232e12 FLOP/s, x 4 = 6.0928e12 (the chip's file rounds to
    6.09e12); 490 / 4 = 122.5 GB/s; 16 / 4 = 4 GB; 34 / 4 = 8.5 MB L2; the chip's efficiencies."""
    quadrant, chip = load_device("knl_7250_snc4"), load_device("knl_7250")
    assert quadrant.peak_flops == {"fp32": pytest.approx(17 * 1.4e9 * 64)}
    assert 4 * quadrant.peak_flops["fp32"] == pytest.approx(chip.peak_flops["fp32"], rel=1e-3)
    assert 4 * quadrant.memory_bandwidth_Bps == chip.memory_bandwidth_Bps == 490e9
    assert 4 * quadrant.memory_capacity_bytes == chip.memory_capacity_bytes == 16e9
    assert 4 * quadrant.on_chip_memory_bytes == chip.on_chip_memory_bytes == 34e6
    assert quadrant.compute_efficiency == chip.compute_efficiency
    assert quadrant.memory_efficiency == chip.memory_efficiency


def test_knl_mesh_port_is_a_copy_through_a_quadrants_mcdram() -> None:
    """122.5e9 B/s x 0.5 (each byte read once and written once) x 0.85 (STREAM fraction) = 52.0625e9 B/s,
    faster than UPI's 3 x 20.8e9 x 0.6 = 37.44e9 B/s between Skylake sockets."""
    mesh = load_link("knl_mesh")
    assert mesh.kind == "intra_node" and mesh.links_per_device == 1
    assert mesh.port_bandwidth_Bps == pytest.approx(52.0625e9)
    assert load_link("upi").port_bandwidth_Bps == pytest.approx(37.44e9)
    assert (mesh.latency_s, mesh.per_message_overhead_s) == (pytest.approx(0.2e-6), pytest.approx(1e-6))


def test_k80_is_one_die() -> None:
    """Board: 8.74 TFLOP/s boost, 480 GB/s, 24 GB; one GK210 die is half of each."""
    k80 = load_device("k80")
    assert k80.peak_flops["fp32"] == pytest.approx(4.37e12)
    assert k80.memory_bandwidth_Bps == 240e9
    assert k80.memory_capacity_bytes == 12e9


def test_dense_tensor_core_peaks() -> None:
    """V100 SXM2 125 TF, A100 312 TF, H100 SXM5 989 TF (1979 with sparsity / 2)."""
    assert load_device("v100_sxm2").peak_flops_for("fp16") == 125e12
    assert load_device("a100_sxm4").peak_flops_for("bf16") == 312e12
    assert load_device("h100_sxm5").peak_flops_for("fp16") == 989e12


def test_cpu_peak_is_cores_times_clock_times_64() -> None:
    """Xeon 8180: 28 cores x 2.5 GHz x 64 FP32 FLOP/cycle = 4.48e12 FLOP/s."""
    assert load_device("xeon_8180").peak_flops["fp32"] == pytest.approx(28 * 2.5e9 * 64)


def test_fp16_falls_back_to_fp32_without_a_fast_path() -> None:
    """The P40 lists no fp16 peak (GP102 runs fp16 at 1/64): mixed precision runs at the fp32 peak."""
    p40 = load_device("p40")
    assert "fp16" not in p40.peak_flops
    assert p40.peak_flops_for("fp16") == p40.peak_flops_for("fp32") == 12e12
    assert p40.peak_flops_for("bf16") == 12e12


def test_dense_peaks_of_this_era() -> None:
    """Datasheets quote sparsity; dense is half: H100 SXM fp8 3958/2 = 1979 TF; B200 fp8 72 PF / 8 GPUs / 2 = 4.5 PF;
    GB200 bf16 360 PF / 72 / 2 = 2.5 PF; MI300X bf16 2614.9/2 = 1307.4 TF; TPU v5p bf16 459 TF."""
    assert load_device("h100_sxm5").peak_flops_for("fp8") == 1979e12
    assert load_device("h200_sxm").peak_flops_for("bf16") == 989e12
    assert load_device("b200").peak_flops_for("fp8") == 4.5e15
    assert load_device("gb200").peak_flops_for("bf16") == 2.5e15
    assert load_device("mi300x").peak_flops_for("bf16") == pytest.approx(1307.4e12)
    assert load_device("tpu_v5p").peak_flops_for("bf16") == 459e12
    assert load_device("tpu_v4").memory_capacity_bytes == 32 * 2**30  # GiB, as Google states it


def test_precision_fallbacks() -> None:
    """fp8 on an A100 (no fp8 tensor cores) runs at its 16-bit peak, 312 TF; tf32 on a V100 at fp32, 15.7 TF."""
    assert load_device("a100_sxm4_80gb").peak_flops_for("fp8") == 312e12
    assert load_device("a100_sxm4").peak_flops_for("tf32") == 156e12
    assert load_device("v100_sxm2").peak_flops_for("tf32") == 15.7e12
    assert load_device("gaudi2").peak_flops_for("fp16") == load_device("gaudi2").peak_flops["fp32"]


@pytest.mark.parametrize("token", [name for name in device_names() if load_device(name).system is not None])
def test_device_system_fits_its_links(token: str) -> None:
    """A device's usual node: its scale-up link joins at least devices_per_node devices, NICs at most one per device."""
    system = load_device(token).system
    assert system is not None
    link = load_link(system.intra_node_link)
    assert link.kind == "intra_node" and load_link(system.network).kind == "network"
    assert link.domain_size >= system.devices_per_node
    assert 1 <= system.nics_per_node <= system.devices_per_node


def test_scale_up_domains_by_hand() -> None:
    """NVL72: 18 links x 50e9 B/s = 900e9 B/s raw per GPU per direction (1.8 TB/s bidirectional), 72 GPUs;
    HGX H100: 18 x 25e9 = 450e9 B/s, 8 GPUs; TPU v5p: 6 links x 100e9 = 600e9 B/s (1200 GB/s bidirectional)."""
    nvl72, hgx, tpu = load_link("nvl72"), load_link("nvswitch3"), load_link("tpu_v5p_ici")
    assert (nvl72.bandwidth_Bps * nvl72.links_per_device, nvl72.domain_size, nvl72.topology) == (900e9, 72, "switch")
    assert (hgx.bandwidth_Bps * hgx.links_per_device, hgx.domain_size) == (450e9, 8)
    assert (tpu.bandwidth_Bps * tpu.links_per_device, tpu.topology) == (600e9, "torus_3d")
    assert load_link("ib_xdr").bandwidth_Bps == 100e9
    assert load_link("roce_400g").bandwidth_Bps == 50e9


def test_unknown_precision_is_rejected() -> None:
    with pytest.raises(CatalogError, match=r"'fp4'; valid: fp32, tf32, fp16, bf16, fp8"):
        load_device("p40").peak_flops_for("fp4")


# --- the loader rejects broken datasheets ---------------------------------------------------------


def line(key: str, value: object, source: str | None = "test datasheet") -> str:
    """One TOML line ``key = { value = ..., source = "..." }``; strings are quoted, source may be left out."""
    text = f'"{value}"' if isinstance(value, str) else str(value)
    cited = "" if source is None else f', source = "{source}"'
    return f"{key} = {{ value = {text}{cited} }}"


DEVICE_LINES = {
    "description": 'description = "test device"',
    "kind": 'kind = "gpu"',
    "peak_flops": f"peak_flops = {{ {line('fp32', '10 TFLOP/s')} }}",
    "memory_bandwidth": line("memory_bandwidth", "700 GB/s"),
    "memory_capacity": line("memory_capacity", "16 GB"),
    "on_chip_memory": line("on_chip_memory", "4 MB"),
    "compute_efficiency": line("compute_efficiency", 0.5),
    "memory_efficiency": line("memory_efficiency", 0.75),
}
LINK_LINES = {
    "description": 'description = "test link"',
    "kind": 'kind = "network"',
    "bandwidth": line("bandwidth", "100 Gbit/s"),
    "latency": line("latency", "1 us"),
    "per_message_overhead": line("per_message_overhead", "1 us"),
    "efficiency": line("efficiency", 0.9),
}


def write(directory: Path, name: str, lines: dict[str, str], changes: dict[str, str | None]) -> Path:
    """Write ``lines`` as a TOML file, replacing (or with None, dropping) the keys in ``changes``."""
    merged: dict[str, str | None] = {**lines, **changes}
    path = directory / f"{name}.toml"
    path.write_text("\n".join(text for text in merged.values() if text is not None) + "\n")
    return path


def test_valid_test_datasheets_load(tmp_path: Path) -> None:
    """10 TFLOP/s x 0.5 = 5e12 FLOP/s; 100 Gbit/s = 12.5e9 B/s x 0.9 = 11.25e9 B/s."""
    device = load_device_file(write(tmp_path, "good_device", DEVICE_LINES, {}))
    assert device.token == "good_device"
    assert device.peak_flops_for("fp16") * device.compute_efficiency == 5e12
    link = load_link_file(write(tmp_path, "good_link", LINK_LINES, {}))
    assert link.port_bandwidth_Bps == pytest.approx(11.25e9)


Broken = dict[str, tuple[dict[str, str | None], str, str]]  # case -> (changes, key, allowed)

BROKEN_DEVICES: Broken = {
    "unknown_key": ({"colour": line("colour", "red")}, "colour", "allowed keys"),
    "missing_key": ({"memory_capacity": None}, "memory_capacity", "missing"),
    "efficiency_zero": (
        {"compute_efficiency": line("compute_efficiency", 0)},
        "compute_efficiency",
        "(0, 1]",
    ),
    "efficiency_above_one": (
        {"memory_efficiency": line("memory_efficiency", 1.5)},
        "memory_efficiency",
        "(0, 1]",
    ),
    "negative_bandwidth": (
        {"memory_bandwidth": line("memory_bandwidth", "-700 GB/s")},
        "memory_bandwidth",
        "> 0",
    ),
    "unparsable_unit": (
        {"memory_capacity": line("memory_capacity", "16 furlongs")},
        "memory_capacity",
        "GiB",
    ),
    "missing_source": ({"on_chip_memory": line("on_chip_memory", "4 MB", None)}, "on_chip_memory", "source"),
    "empty_source": ({"on_chip_memory": line("on_chip_memory", "4 MB", " ")}, "on_chip_memory", "source"),
    "unknown_precision": (
        {"peak_flops": f"peak_flops = {{ {line('fp32', '1 TFLOP/s')}, {line('fp4', '2 TFLOP/s')} }}"},
        "fp4",
        "allowed keys: bf16, fp16, fp32, fp8, tf32",
    ),
    "bad_kind": ({"kind": 'kind = "fpga"'}, "kind", "one of gpu, cpu, manycore, accelerator"),
    "system_unknown_link": (
        {"system": "[system]\n" + "\n".join([line("devices_per_node", 8), line("intra_node_link", "nvlink9"),
                                              line("network", "ib_ndr"), line("nics_per_node", 8)])},
        "intra_node_link",
        "is not a intra_node link; valid:",
    ),
    "system_network_as_scale_up": (
        {"system": "[system]\n" + "\n".join([line("devices_per_node", 8), line("intra_node_link", "ib_ndr"),
                                              line("network", "ib_ndr"), line("nics_per_node", 8)])},
        "intra_node_link",
        "is not a intra_node link",
    ),
    "system_zero_devices": (
        {"system": "[system]\n" + "\n".join([line("devices_per_node", 0), line("intra_node_link", "nvswitch3"),
                                              line("network", "ib_ndr"), line("nics_per_node", 8)])},
        "devices_per_node",
        ">= 1",
    ),
}

BROKEN_LINKS: Broken = {
    "efficiency_zero": ({"efficiency": line("efficiency", 0)}, "efficiency", "(0, 1]"),
    "efficiency_above_one": ({"efficiency": line("efficiency", 1.5)}, "efficiency", "(0, 1]"),
    "negative_bandwidth": ({"bandwidth": line("bandwidth", "-100 Gbit/s")}, "bandwidth", "> 0"),
    "unparsable_unit": ({"bandwidth": line("bandwidth", "100 furlongs/s")}, "bandwidth", "Gbit/s"),
    "missing_source": ({"latency": line("latency", "1 us", None)}, "latency", "source"),
    "unknown_key": ({"mtu": line("mtu", "4 kB")}, "mtu", "allowed keys"),
    "missing_key": ({"per_message_overhead": None}, "per_message_overhead", "missing"),
    "negative_latency": ({"latency": line("latency", "-1 us")}, "latency", ">= 0"),
    "zero_links": ({"links": line("links_per_device", 0)}, "links_per_device", ">= 1"),
    "domain_on_a_network": ({"domain": line("domain_size", 8)}, "domain_size", "only for kind 'intra_node'"),
    "zero_domain": ({"kind": 'kind = "intra_node"', "domain": line("domain_size", 0)}, "domain_size", ">= 1"),
    "bad_topology": ({"kind": 'kind = "intra_node"', "topology": line("topology", "ring")}, "topology",
                     "one of switch, full_mesh, torus_2d, torus_3d, point_to_point"),
}


@pytest.mark.parametrize("case", BROKEN_DEVICES)
def test_broken_device_is_rejected_naming_file_key_and_range(tmp_path: Path, case: str) -> None:
    changes, key, allowed = BROKEN_DEVICES[case]
    path = write(tmp_path, f"bad_{case}", DEVICE_LINES, changes)
    with pytest.raises(CatalogError) as raised:
        load_device_file(path)
    message = str(raised.value)
    assert path.name in message
    assert repr(key) in message
    assert allowed in message


@pytest.mark.parametrize("case", BROKEN_LINKS)
def test_broken_link_is_rejected_naming_file_key_and_range(tmp_path: Path, case: str) -> None:
    changes, key, allowed = BROKEN_LINKS[case]
    path = write(tmp_path, f"bad_{case}", LINK_LINES, changes)
    with pytest.raises(CatalogError) as raised:
        load_link_file(path)
    message = str(raised.value)
    assert path.name in message
    assert repr(key) in message
    assert allowed in message


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("bandwidth = { value = \n")
    with pytest.raises(CatalogError, match=r"broken\.toml: not valid TOML"):
        load_link_file(path)


# --- unknown tokens ----------------------------------------------------------------------------------


def test_unknown_device_lists_valid_tokens() -> None:
    with pytest.raises(UnknownNameError) as raised:
        load_device("v200")
    message = str(raised.value)
    assert "'v200'" in message
    assert all(token in message for token in REQUIRED_DEVICES)


def test_unknown_link_lists_valid_tokens() -> None:
    with pytest.raises(UnknownNameError) as raised:
        load_link("ib_gdr")
    message = str(raised.value)
    assert "'ib_gdr'" in message
    assert all(token in message for token in REQUIRED_INTRA_NODE + REQUIRED_NETWORKS)


# --- user catalog directories ------------------------------------------------------------------------


@pytest.fixture
def clean_search_path(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(CATALOG_ENVIRONMENT_VARIABLE, raising=False)
    forget_catalog_directories()
    yield
    forget_catalog_directories()


def user_catalog(root: Path, device: str = "my_gpu", link: str = "my_fabric") -> Path:
    (root / "devices").mkdir(parents=True)
    (root / "links").mkdir()
    write(root / "devices", device, DEVICE_LINES, {})
    write(root / "links", link, LINK_LINES, {})
    return root


def test_environment_variable_adds_user_tokens(tmp_path: Path, monkeypatch, clean_search_path) -> None:
    first, second = user_catalog(tmp_path / "a"), user_catalog(tmp_path / "b", "other_gpu", "other_fabric")
    monkeypatch.setenv(CATALOG_ENVIRONMENT_VARIABLE, f"{first}:{second}")
    assert catalog_directories() == (first.resolve(), second.resolve())
    assert {"my_gpu", "other_gpu", "a100_sxm4"} <= set(device_names())
    assert load_device("my_gpu").peak_flops_for("fp32") == 10e12
    assert load_link("other_fabric").port_bandwidth_Bps == pytest.approx(11.25e9)
    assert "my_fabric" in link_names("network")


def test_registered_directory_is_searched_and_validated(tmp_path: Path, clean_search_path) -> None:
    root = user_catalog(tmp_path / "mine")
    write(root / "devices", "broken_gpu", DEVICE_LINES, {"compute_efficiency": line("compute_efficiency", 2)})
    register_catalog_directory(root)
    assert load_device("my_gpu").token == "my_gpu"
    with pytest.raises(CatalogError, match=r"broken_gpu\.toml: key 'compute_efficiency': must be a number in \(0, 1\]"):
        load_device("broken_gpu")
    forget_catalog_directories()
    with pytest.raises(UnknownNameError, match="unknown device 'my_gpu'"):
        load_device("my_gpu")


def test_user_catalog_may_not_redefine_a_built_in(tmp_path: Path, clean_search_path) -> None:
    root = user_catalog(tmp_path / "mine", device="a100_sxm4")
    register_catalog_directory(root)
    with pytest.raises(CatalogError, match=r"token 'a100_sxm4' is already defined by .*a100_sxm4\.toml"):
        device_names()


def test_bad_catalog_directories_are_named(tmp_path: Path, monkeypatch, clean_search_path) -> None:
    with pytest.raises(CatalogError, match=r"--catalog: catalog directory '.*nowhere' does not exist"):
        register_catalog_directory(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CatalogError, match=r"holds none of devices/, links/, transformers/"):
        register_catalog_directory(tmp_path / "empty")
    monkeypatch.setenv(CATALOG_ENVIRONMENT_VARIABLE, str(tmp_path / "gone"))
    with pytest.raises(CatalogError, match=r"environment variable DDLSIM_CATALOG: catalog directory"):
        device_names()


def _ddlsim(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != CATALOG_ENVIRONMENT_VARIABLE}
    return subprocess.run(
        [sys.executable, "-m", "ddlsim", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment | (env or {}),
    )


def test_the_catalog_flag_reaches_every_process_of_a_command(tmp_path: Path) -> None:
    """``--catalog DIR`` before or after the command; a sweep's pool workers see the user's device too.
    10 TFLOP/s x 0.5 efficiency on one device: the step is the workload's roofline at 5 TFLOP/s."""
    root = user_catalog(tmp_path / "mine")
    listed = _ddlsim("--catalog", str(root), "list", "devices")
    assert listed.returncode == 0, listed.stderr
    assert "my_gpu" in listed.stdout
    out = tmp_path / "run"
    done = _ddlsim(
        "simulate", "--catalog", str(root), "--device", "my_gpu", "--network", "my_fabric", "--workload", "resnet50",
        "--nodes", "1,2", "--executor-pool", "process", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len((out / "results.csv").read_text().splitlines()) == 3  # both points, from the pool's workers
    written = json.loads((out / "scenario.json").read_text())
    assert written["device"]["description"] == "test device" and written["device"]["peak_flops"]["fp32"] == 10e12


def test_a_bad_catalog_flag_is_one_line(tmp_path: Path) -> None:
    done = _ddlsim("list", "devices", "--catalog", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert done.stderr.startswith("ddlsim: error: --catalog: catalog directory") and done.stderr.count("\n") == 1
    missing = _ddlsim("list", "devices", "--catalog")
    assert missing.returncode == 2 and "--catalog needs a directory" in missing.stderr


def test_a_broken_datasheet_in_a_user_catalog_stops_list_before_it_prints(tmp_path: Path) -> None:
    """One error line and exit 2, not the devices sorted before the broken one and then the error."""
    (tmp_path / "mine" / "devices").mkdir(parents=True)
    (tmp_path / "mine" / "devices" / "zz_gpu.toml").write_text('name = "x"\n')
    done = _ddlsim("--catalog", str(tmp_path / "mine"), "list", "devices")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("ddlsim: error: ") and "zz_gpu.toml: unknown key 'name'" in done.stderr
