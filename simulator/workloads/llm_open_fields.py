"""What a large-model row words its own way or leaves open: its GPU, interconnect and architecture.

``llm_runs.map_run`` maps the exact strings of ``llm_dev.csv`` through its tables first. A row
from another source names the same hardware in other words ("A100 80GB", "8x NDR 400 Gb/s",
"DGX H100 nodes") or leaves it open, and a paper often gives a model's size but not its shape.
These readers turn such text into catalog tokens by the words that identify a part, and fill what
is left open with the documented default of that part's node; each returns the assumptions made,
which the row's note lists. None means the text names nothing they know.

- ``device_from_text``: the GPU generation and variant words (A100 + 80 GB, H100 + PCIe, V100 +
  DGX-2...). A form factor the text does not give is the SXM part of that generation's DGX.
- ``links_from_text``: the network generation (NDR, HDR, EDR, RoCE 400 Gb/s...) and the count of
  adapters ("8x", or a node total such as "800 Gbps" over the generation's rate); whatever the text
  leaves open comes from the device's node in the catalog (its ``[system]``), or for the parts
  without one (PCIe cards) as 8 to a server on one EDR InfiniBand adapter (``PCIE_SERVER``).
- ``catalog_model_by_name``, ``zero_stage_of``, ``recompute_of``, ``precision_of``: a model by its
  published name, and a run's optimizer sharding, recomputation and precision by their words.
- ``shape_from_parameters``: the decoder shape of a GPT-like model of a given size, from the
  published Megatron family (Narayanan et al. SC21 table 1, the ``megatron_*`` catalog entries):
  the hidden size of the nearest member, the depth that gives the parameter count, 128-wide heads.
  The neighbouring members' hidden sizes give the alternatives, whose spread widens the interval.
"""

from __future__ import annotations

import dataclasses
import math
import re

from ddlsim.hardware_models.catalog import load_device
from ddlsim.simulator.workloads.transformer import TransformerConfig, load_transformer, transformer_names

# (pattern on the lowered text, device token, assumption when the words leave the variant open)
_DEVICE_PATTERNS: tuple[tuple[str, str, str], ...] = (
    (r"gb300", "gb300", ""),
    (r"gb200", "gb200", ""),
    (r"\bb200", "b200", ""),
    (r"h200", "h200_sxm", ""),
    (r"h100.*pcie|pcie.*h100", "h100_pcie", ""),
    (r"h100", "h100_sxm5", "H100 SXM5 (the DGX H100 part; the form factor is not stated)"),
    (r"a100.*80|80.*a100", "a100_sxm4_80gb", ""),
    (r"a100.*40|40.*a100", "a100_sxm4", ""),
    (r"a100", "a100_sxm4_80gb", "A100 SXM4 80 GB (the memory size is not stated)"),
    (r"v100s", "v100s_pcie", ""),
    (r"v100.*(dgx-?2|sxm3)|(dgx-?2|sxm3).*v100", "v100_sxm3", ""),
    (r"v100.*pcie|pcie.*v100", "v100_pcie", ""),
    (r"v100", "v100_sxm2", "V100 SXM2 (the DGX-1 part; the form factor is not stated)"),
    (r"p100.*pcie|pcie.*p100", "p100_pcie", ""),
    (r"p100", "p100_sxm2", "P100 SXM2 (the DGX-1 part; the form factor is not stated)"),
    (r"mi300x", "mi300x", ""),
    (r"gaudi ?2", "gaudi2", ""),
    (r"tpu ?v5p", "tpu_v5p", ""),
    (r"tpu ?v4", "tpu_v4", ""),
    (r"tpu ?v3", "tpu_v3", ""),
)
# The node of a device whose catalog entry has none ([system]: PCIe cards, which no one system
# defines): (devices per node, intra-node link, network, adapters) of an 8-card server on one adapter
PCIE_SERVER = (8, "pcie3_x16", "ib_edr", 1)
# network words -> (token, per-adapter rate in Gb/s); RoCE and Ethernet take their token from the rate
_IB = (("xdr", "ib_xdr", 800), ("ndr", "ib_ndr", 400), ("hdr", "ib_hdr", 200), ("edr", "ib_edr", 100),
       ("fdr", "ib_fdr", 56), ("qdr", "ib_qdr", 40))  # fmt: skip
_ETHERNET_RATES = {"roce": (25, 40, 50, 100, 200, 400), "eth": (1, 10, 25, 40, 50, 100)}
_IB_BY_RATE = {rate: token for _, token, rate in _IB}
_IB_WORDS = "|".join(word for word, _, _ in _IB)  # the generations' words, for the adapter-count patterns


def device_from_text(text: str) -> tuple[str, str] | None:
    """The device token a GPU description names, and the assumption made (or '')."""
    lowered = text.lower().strip()
    if not lowered:
        return None
    token = lowered.replace("-", "_").replace(" ", "_")
    try:
        load_device(token)
    except KeyError:  # UnknownNameError: not a token, read the words
        pass
    else:
        return token, ""
    for pattern, device, assumption in _DEVICE_PATTERNS:
        if re.search(pattern, lowered):
            return device, assumption
    return None


def node_of(device: str) -> tuple[int, str, str, int]:
    """(devices per node, intra-node link, network, adapters) of ``device``'s usual node."""
    system = load_device(device).system
    if system is not None:
        return system.devices_per_node, system.intra_node_link, system.network, system.nics_per_node
    return PCIE_SERVER


def links_from_text(text: str, device: str) -> tuple[str, str, int, list[str]]:
    """(intra-node link, network, adapters per node, assumptions) of an interconnect description."""
    lowered = text.lower()
    _, intra, default_network, default_nics = node_of(device)
    assumptions: list[str] = []
    stated = _rate_in_text(text)
    network, rate = _network_words(lowered, stated, default_network)
    if network is None:
        network, rate = default_network, _rate_of(default_network)
        assumptions.append(f"network {default_network} (the usual one of a {device} node; the row names none)")
    nics = _adapter_count(lowered, rate, stated)
    if nics is None:
        nics = default_nics
        assumptions.append(f"{default_nics} network adapters per node (as {device}'s usual node; not stated)")
    return intra, network, nics, assumptions


def _network_words(lowered: str, stated: float | None, usual: str = "") -> tuple[str | None, float]:
    """(network token, per-adapter Gb/s) the words name. InfiniBand named by a rate alone is the
    generation of that rate, except a whole multiple of the node's usual generation's rate, which is
    that generation's node total ('1600 Gb/s InfiniBand' on a DGX A100: 8 HDR adapters)."""
    for word, token, rate in _IB:
        if re.search(rf"\b{word}", lowered):
            return token, rate
    for kind, rates in _ETHERNET_RATES.items():
        if kind in lowered or (kind == "eth" and re.search(r"ethernet|\dg(?:b|bit)?e\b|\bgbe\b", lowered)):
            speed = stated or rates[-1]
            best = min(rates, key=lambda r: abs(math.log(r / speed)))
            return f"{kind}_{best}g", best
    if stated and re.search(r"\bib\b|infiniband", lowered):
        per_adapter = _rate_of(usual) if usual.startswith("ib_") else 0.0
        if per_adapter and stated > per_adapter and stated % per_adapter == 0:
            return usual, per_adapter
        nearest = min(_IB_BY_RATE, key=lambda r: abs(math.log(r / stated)))
        return _IB_BY_RATE[nearest], nearest
    if "aries" in lowered:
        return "aries", 0.0
    if "omni-path" in lowered or "omnipath" in lowered or re.search(r"\bopa\b", lowered):
        return "opa_100", 100.0
    if re.search(r"\befa\b", lowered):  # AWS Elastic Fabric Adapter: RDMA over Ethernet, 100 Gb/s a NIC (p4d)
        return "roce_100g", 100.0
    return None, 0.0


def _rate_in_text(text: str) -> float | None:
    """A link rate in Gb/s ('400G', '200 Gb/s', '100Gbps', '40GbE', '10GE'), not a rate in bytes
    ('600GB/s' of NVLink)."""
    match = re.search(r"(\d+)\s*(?:[Gg]b(?:it)?(?:/s|ps|s|[Ee])?|[Gg][Ee]?(?![Bb]))\b", text)
    return float(match.group(1)) if match else None


def _rate_of(network: str) -> float:
    match = re.search(r"_(\d+)g$", network)
    if match:
        return float(match.group(1))
    return next((rate for _, token, rate in _IB if token == network), 0.0)


def _adapter_count(lowered: str, rate: float, total: float | None) -> int | None:
    match = re.search(
        rf"(\d+)\s*x\s*(?:\w+\s*)?(?:{_IB_WORDS}|ib|infiniband|roce|cx|connectx|nic|hca|\d+\s*g)", lowered)
    if match:
        return int(match.group(1))
    match = re.search(r"(\d+)\s*(?:nics|hcas|adapters|rails)", lowered) or re.search(
        rf"(?:omni-?path|\bopa|\befa|\bib|infiniband|roce|ethernet|{_IB_WORDS})\W*(\d+)\s*x\b", lowered)  # "OPA 4x"
    if match:
        return int(match.group(1))
    if total and rate and total > rate and total % rate == 0:
        return int(total // rate)  # a node total such as "800 Gbps" over the generation's rate
    return None


# --- a model, its sharding, recomputation and precision by their words -----------------------------


def catalog_model_by_name(name: str) -> str | None:
    """The catalog model a published name means (``Llama 3.1 405B`` -> ``llama3_405b``), if any."""
    lowered = name.lower()
    patterns = ((r"llama\s*-?\s*(\d)(?:\.\d)?\D*?(\d+)\s*b\b", "llama{0}_{1}b"), (r"gpt-?3\D*?(175)\s*b", "gpt3_{0}b"),
                (r"mixtral\D*?8\s*x\s*(7|22)\s*b", "mixtral_8x{0}b"), (r"deepseek-?v3", "deepseek_v3"),
                (r"nemotron[\s_-]*4\D*?(\d+)\s*b\b", "nemotron4_{0}b"), (r"bloom\D*?(176)\s*b", "bloom_{0}b"),
                (r"t5\D*?(\d+)\s*b\b", "t5_{0}b"))  # fmt: skip
    names = set(transformer_names())
    for pattern, template in patterns:
        match = re.search(pattern, lowered)
        if match and template.format(*match.groups()) in names:
            return template.format(*match.groups())
    return None


def zero_stage_of(text: str, assumptions: list[str]) -> int:
    """The ZeRO stage a row's words name: a stage number ('2', 'ZeRO-3', 'stage 1'), FSDP's names
    (FULL_SHARD 3, SHARD_GRAD_OP 2), a distributed optimizer 1; 0 where they name none."""
    lowered = text.lower()
    match = re.search(r"(?:zero|stage)?[\s_-]*\b([0-3])\b", lowered)
    if match:
        return int(match.group(1))
    for words, stage in (("shard_grad_op", 2), ("fsdp", 3), ("full_shard", 3), ("dist", 1)):
        if words in lowered:
            return stage
    if lowered:
        assumptions.append(f"ZeRO stage 0 ({text!r} names no stage)")
    return 0


def recompute_of(text: str, assumptions: list[str]) -> str:
    """The recomputation a row's words name (full, selective, none), none where they name none."""
    lowered = text.lower()
    for mode in ("full", "selective", "none"):
        if mode in lowered:
            return mode
    assumptions.append("no activation recomputation (the source leaves it open)" if not text else
                       f"no activation recomputation ({text!r} names none of full, selective, none)")  # fmt: skip
    return "none"


def precision_of(text: str, assumptions: list[str]) -> str:
    """The layout precision a row's words name (fp8 before bf16 before fp16: "fp8 with bf16 master
    weights" trains in fp8); bf16 where they name none."""
    lowered = text.lower()
    for word in ("fp8", "bf16", "fp16"):
        if word in lowered:
            return word
    assumptions.append(f"bf16 (precision {text!r} names none of fp8, bf16, fp16)" if text else
                       "bf16 (the row leaves the precision open)")  # fmt: skip
    return "bf16"


# --- the shape of a model given by its size ---------------------------------------------------------


def _family() -> list[TransformerConfig]:
    members = [load_transformer(name) for name in transformer_names() if name.startswith("megatron_")]
    return sorted((m for m in members if m.architecture == "decoder"), key=lambda m: m.hidden)


def decoder_parameters(config: TransformerConfig) -> float:
    """A GPT decoder's weights: 12 h^2 + 13 h per layer, and the token and position embeddings."""
    h = config.hidden
    return config.layers * (12 * h * h + 13 * h) + (config.vocabulary + config.seq_len) * h


def _with_shape(template: TransformerConfig, hidden: int, parameters: float) -> TransformerConfig:
    h = hidden
    embedding = (template.vocabulary + template.seq_len) * h
    layers = max(1, round((parameters - embedding) / (12 * h * h + 13 * h)))
    heads = max(1, h // 128)
    return dataclasses.replace(template, layers=layers, hidden=h, heads=heads, kv_heads=heads, head_dim=h // heads,
                               ffn_hidden=4 * h)  # fmt: skip


def shape_from_parameters(billions: float) -> tuple[TransformerConfig, list[TransformerConfig], str]:
    """A GPT decoder of ``billions`` parameters: the chosen shape, the alternatives, and the note."""
    family = _family()
    target = billions * 1e9
    nearest = min(range(len(family)), key=lambda i: abs(math.log(decoder_parameters(family[i]) / target)))
    template = family[nearest]
    chosen = _with_shape(template, template.hidden, target)
    neighbours = [family[i] for i in (nearest - 1, nearest + 1) if 0 <= i < len(family)]
    alternatives = [_with_shape(template, member.hidden, target) for member in neighbours]
    note = (f"architecture from the size ({billions:g}B): hidden {chosen.hidden} and {chosen.heads} heads of "
            f"{template.name} (the nearest Megatron GPT of Narayanan et al. table 1), {chosen.layers} layers for "
            f"the parameter count; the interval spans hidden "
            f"{', '.join(str(a.hidden) for a in alternatives)} (the neighbouring sizes' shapes)")  # fmt: skip
    return chosen, alternatives, note


def shape_from_dimensions(template: TransformerConfig, layers: int, hidden: int, heads: int) -> TransformerConfig:
    """``template`` (a catalog decoder of the same kind) with a row's depth, width and heads; the
    feed-forward and key/value heads keep the template's ratios."""
    ratio = template.ffn_hidden / template.hidden
    kv_heads = max(1, heads * template.kv_heads // template.heads)
    return dataclasses.replace(template, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                               head_dim=hidden // heads, ffn_hidden=round(ratio * hidden))  # fmt: skip
