"""Fields a source leaves open: the documented default of the era and vendor, and the alternatives.

A published row often omits something the model needs: the GPU ("Pascal GPUs"), the all-reduce
library, the per-device batch, the precision, the network, the link inside the node. Such a row
is still predicted: with the default below, and with every alternative too, so the interval can
be widened to the spread of the choices (``predict_with_defaults`` in ``intervals.py``). Each
choice is said in the row's note.

The defaults (what a run of that era and vendor most likely used, so the most likely number):

========================  =====================================================================
open field                default (alternatives)
========================  =====================================================================
device                    the generation's reference part, found from a family name in the
                          notes or source ("Pascal", "Volta", "Skylake", ...): ``GENERATION_PARTS``
                          (the other parts of that generation in the catalog)
algorithm (library)       GPUs: ``nccl`` (``openmpi``, ``ring``); CPUs and Xeon Phi: ``mpich``,
                          Intel MPI's base (``mlsl``, ``openmpi``); TPUs: ``torus_2d`` (``ring``)
per_device_batch          ``DEFAULT_BATCH`` per device kind: GPU 64 (32, 128, 256), CPU 32 per
                          socket (16, 64), Xeon Phi 64 (32, 128); the value tf_cnn_benchmarks and
                          Intel Caffe's ImageNet examples used; TPU 256 per chip (128, 512): the
                          Cloud TPU ResNet-50 reference's 1024 on a v3-8 (4 chips)
precision                 ``fp16`` (mixed) on parts with Tensor Cores (a reduced-precision peak
                          4x fp32 or more: Volta and later, what MLPerf-era and Horovod
                          benchmarks ran), else ``fp32``; the other is the alternative where the
                          part has both
network                   per generation: ``ERA_NETWORKS`` (Kepler/Maxwell 10 GbE or FDR, Pascal/
                          Volta EDR, Ampere HDR, Hopper NDR, Xeon/Xeon Phi Omni-Path; the
                          alternatives of the era, e.g. FDR and 25 GbE for Pascal)
intra_node_link           GPUs: PCIe of their generation (``pcie3_x16``; ``pcie4_x16`` from
                          Ampere), NVLink of the generation as the alternative; CPUs: ``upi``;
                          TPUs: their ICI (the datasheet's system link)
nics_per_node             on several nodes whose shape is the device's vendor system (its
                          datasheet's ``[system]``: a DGX's GPUs per node, link and network, all
                          stated), that system's adapters (DGX-1 4, DGX-2 and DGX A100/H100 8)
                          (1); else 1, as before
========================  =====================================================================
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ddlsim.hardware_models.catalog import device_names, load_device
from ddlsim.hardware_models.compute import ARCHITECTURES, architecture
from ddlsim.simulator.calibration.measurements import Measurement

# The reference part of each generation (the first) and the others the catalog holds.
GENERATION_PARTS = {
    "kepler": ("k80", "k40", "k20x"),
    "maxwell": ("m40",),
    "pascal": ("p100_pcie", "p100_sxm2", "titanx_pascal", "p40"),
    "volta": ("v100_sxm2", "v100_pcie", "v100_sxm3", "v100_sxm3_h", "v100s_pcie"),
    "ampere": ("a100_sxm4",),
    "hopper": ("h100_sxm5",),
    "knights_landing": ("knl_7250", "knl_7230"),
    "skylake": ("xeon_8160", "xeon_6148", "xeon_8180"),
    "cooper_lake": ("xeon_8380h",),
}
# The Pascal alternatives hold 25 Gb/s-class Ethernet: two of the seed papers' Pascal clusters ran it
# (Goyal et al. 2017: a 50 Gb Ethernet card per 8-P100 server; Sergeev & Del Balso 2018: 25 GbE RoCE).
ERA_NETWORKS = {
    "kepler": ("eth_10g", "ib_fdr"),
    "maxwell": ("eth_10g", "ib_fdr"),
    "pascal": ("ib_edr", "ib_fdr", "eth_25g"),
    "volta": ("ib_edr", "eth_25g", "ib_hdr"),
    "ampere": ("ib_hdr", "roce_100g", "ib_edr"),
    "hopper": ("ib_ndr", "ib_hdr"),
    "knights_landing": ("opa_100", "ib_edr"),
    "skylake": ("opa_100", "ib_edr", "eth_25g"),
    "cooper_lake": ("ib_hdr", "opa_100"),
}
ERA_NVLINK = {"pascal": "nvlink1", "volta": "nvlink2", "ampere": "nvswitch2"}
DEFAULT_BATCH = {
    "gpu": (64, 32, 128, 256),
    "cpu": (32, 16, 64),
    "manycore": (64, 32, 128),
    "accelerator": (256, 128, 512),
}
GPU_LIBRARIES = ("nccl", "openmpi", "ring")
# a reduced-precision peak this many times fp32 marks matrix units (Tensor Cores) that mixed-precision
# training was run for; a 2x path (P100 fp16, Cooper Lake bf16) was mostly left unused in fp32 code
TENSOR_CORE_RATIO = 4.0
CPU_LIBRARIES = ("mpich", "mlsl", "openmpi")
# TPU pods: the 2-D gradient summation over the torus (Ying et al. 2018, 'Image classification at
# supercomputer scale', on TPU v3 pods), a ring the alternative
ACCELERATOR_LIBRARIES = ("torus_2d", "ring")


@dataclass(frozen=True)
class Choice:
    """One open field: the default taken, the alternatives for the interval, and the note."""

    column: str
    default: object
    alternatives: tuple[object, ...]
    note: str


def _generation_hint(row: Measurement) -> str | None:
    text = f"{row.notes} {row.source}".lower()
    for name, words in ARCHITECTURES:
        if any(re.search(rf"\b{re.escape(word)}", text) for word in words):
            return name
    return None


def _device_choice(row: Measurement) -> Choice | str:
    generation = _generation_hint(row)
    if generation is None or generation not in GENERATION_PARTS:
        return "device not stated, and the notes and source name no GPU or CPU generation to default to"
    parts = [token for token in GENERATION_PARTS[generation] if token in device_names()]
    return Choice(
        "device",
        parts[0],
        tuple(parts[1:]),
        f"device not stated: {parts[0]} assumed ({generation} reference part); interval spans "
        + (", ".join(parts[1:]) or "no other part"),
    )


def open_choices(row: Measurement) -> list[Choice] | str:
    """The choices for ``row``'s open fields (empty if none is open), or why the row stays unmodeled."""
    choices: list[Choice] = []
    if not row.device:
        choice = _device_choice(row)
        if isinstance(choice, str):
            return choice
        choices.append(choice)
        row = dataclasses.replace(row, device=str(choice.default))
    device = load_device(row.device)
    generation = architecture(device)
    if row.devices > 1 and not row.algorithm:
        libraries = {"gpu": GPU_LIBRARIES, "accelerator": ACCELERATOR_LIBRARIES}.get(device.kind, CPU_LIBRARIES)
        choices.append(
            Choice(
                "algorithm",
                libraries[0],
                libraries[1:],
                f"all-reduce library not stated: {libraries[0]} assumed ({device.kind} default); "
                f"interval spans {', '.join(libraries[1:])}",
            )
        )
    if row.kind == "training" and row.per_device_batch is None:
        batches = DEFAULT_BATCH[device.kind]
        choices.append(
            Choice(
                "per_device_batch",
                batches[0],
                batches[1:],
                f"per-device batch not stated: {batches[0]} assumed ({device.kind} default); interval spans "
                + ", ".join(map(str, batches[1:])),
            )
        )
    if row.kind == "training" and not row.precision:  # a collective's size is given in bytes
        fp32 = device.peak_flops["fp32"]
        fast = [p for p in ("fp16", "bf16") if device.peak_flops.get(p, 0.0) > fp32]
        others: tuple[str, ...]
        if fast and device.peak_flops[fast[0]] >= TENSOR_CORE_RATIO * fp32:
            default, others = fast[0], ("fp32",)
        else:
            default, others = "fp32", tuple(fast[:1])
        choices.append(
            Choice(
                "precision",
                default,
                others,
                f"precision not stated: {default} assumed"
                + (f" (what {device.token}'s era ran by default); interval spans {others[0]}" if others else ""),
            )
        )
    if row.modeled().nodes > 1 and not row.network:
        system_network = (device.system.network,) if device.system and device.system.network else ()
        networks = ERA_NETWORKS.get(generation) or system_network or ("ib_edr", "eth_10g")
        choices.append(
            Choice(
                "network",
                networks[0],
                networks[1:],
                f"network not stated: {networks[0]} assumed ({generation} era); "
                f"interval spans {', '.join(networks[1:])}",
            )
        )
    system = device.system
    shape = (row.devices_per_node, row.intra_node_link, row.network)
    if (row.modeled().nodes > 1 and not row.nics_per_node and system is not None and system.nics_per_node > 1
            and shape == (system.devices_per_node, system.intra_node_link, system.network)):
        choices.append(
            Choice(
                "nics_per_node",
                system.nics_per_node,
                (1,),
                f"network adapters per node not stated: {system.nics_per_node} assumed, as the vendor's system "
                f"of {system.devices_per_node} {device.token} on {system.intra_node_link} and {system.network} has "
                f"({device.token}'s datasheet); interval spans 1",
            )
        )  # fmt: skip
    if row.devices_per_node > 1 and not row.intra_node_link and not (row.nodes == 1 and row.network):
        if device.kind == "gpu":
            pcie = "pcie4_x16" if generation in ("ampere", "hopper") else "pcie3_x16"
            nvlink = ERA_NVLINK.get(generation)
            default, others = pcie, tuple(link for link in (nvlink,) if link)
        elif device.kind == "accelerator" and device.system and device.system.intra_node_link:
            default, others = device.system.intra_node_link, ()  # the chip's own interconnect (TPU ICI)
        else:
            default, others = "upi", ()
        choices.append(
            Choice(
                "intra_node_link",
                default,
                others,
                f"link inside the node not stated: {default} assumed"
                + (f"; interval spans {', '.join(map(str, others))}" if others else ""),
            )
        )
    return choices


def with_choice(row: Measurement, choices: list[Choice], override: tuple[str, object] | None = None) -> Measurement:
    """``row`` with every open field at its default, and ``override`` = (column, value) on top."""
    values = {choice.column: choice.default for choice in choices}
    if override:
        values[override[0]] = override[1]
    return dataclasses.replace(row, **values)  # type: ignore[arg-type]
