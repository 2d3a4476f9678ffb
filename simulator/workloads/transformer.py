"""Transformer workloads described by their architecture settings, and the built-in catalog of them.

A ``TransformerConfig`` holds what a model card or a Hugging Face ``config.json`` says: layers,
hidden size, heads and key/value heads (GQA/MQA), head size, feed-forward size and activation,
vocabulary, training sequence length, tied embeddings, norms, and optionally a mixture of experts
(``MoE``) and DeepSeek's multi-head latent attention (``LatentAttention``). Costs (FLOPs,
parameters, saved activations, communication sizes) are computed from it in
``transformer_costs.py``; nothing is tabulated.

Catalog files: ``simulator/workloads/transformers/<token>.toml``, one model per file, the token
is the file name. User catalog directories (``DDLSIM_CATALOG``, ``--catalog DIR``; see
``hardware_models/catalog.py``) add ``transformers/<token>.toml`` in this format and
``transformers/<token>.json`` Hugging Face config.json files read as they are. A directory is
listed once per process (per set of directories).

Every setting is ``{ value = ..., source = "..." }`` so that its origin stays beside it (as in
the hardware datasheets); ``description`` is a plain string. Unknown keys,
missing keys and impossible values are rejected with a message naming the file, the key and
what is allowed. Settings with a default (below) may be left out.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ddlsim.hardware_models.catalog import catalog_files
from ddlsim.registry import UnknownNameError

CATALOG_DIR = Path(__file__).parent / "transformers"

ARCHITECTURES = ("decoder", "encoder", "encoder_decoder")
ACTIVATIONS = ("gelu", "relu", "squared_relu", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")  # three matrices: gate, up, down
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
# rotary, sinusoidal and alibi (a fixed per-head bias added to the attention scores, BLOOM) hold no parameters
POSITION_EMBEDDINGS = ("learned", "rotary", "relative_bias", "sinusoidal", "alibi")


class TransformerConfigError(ValueError):
    """An invalid transformer description; the message names the file (or field) and what is allowed."""


@dataclass(frozen=True)
class MoE:
    """Mixture of experts in the feed-forward block (GShard/Switch, Mixtral, DeepSeekMoE).

    Each token goes to ``top_k`` of ``experts`` routed experts of feed-forward size
    ``expert_ffn_hidden``, plus ``shared_experts`` always-active experts of ``shared_ffn_hidden``
    each (DeepSeekMoE). ``capacity_factor`` None means dropless (every routed token computed);
    a number pads or drops each expert's tokens to ``capacity_factor x tokens x top_k / experts``.
    The first ``dense_layers`` layers keep a dense feed-forward of the model's ``ffn_hidden``;
    after them every ``layer_frequency``-th layer is MoE (1: all).
    """

    experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    shared_ffn_hidden: int = 0
    capacity_factor: float | None = None
    dense_layers: int = 0
    layer_frequency: int = 1

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (from 0) has the expert feed-forward."""
        return index >= self.dense_layers and (index - self.dense_layers) % self.layer_frequency == 0


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek-V2/V3 multi-head latent attention (MLA): low-rank query and key/value projections.

    Queries: ``hidden -> q_lora_rank -> heads x (qk_nope_head_dim + qk_rope_head_dim)`` (or one
    projection when ``q_lora_rank`` is 0); keys and values: ``hidden -> kv_lora_rank +
    qk_rope_head_dim`` (the rotary part is shared by all heads), then ``kv_lora_rank -> heads x
    (qk_nope_head_dim + v_head_dim)``. Modelled as computed in training (the up-projections are
    not absorbed).
    """

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class TransformerConfig:
    """One transformer model's architecture settings. Sizes are counts (elements, tokens, layers).

    ``layers`` is the decoder depth (the encoder depth for encoder-only models);
    ``encoder_layers`` is the encoder depth of an encoder-decoder model. ``seq_len`` is the
    training sequence length of the (first) stack; ``decoder_seq_len`` that of the decoder of an
    encoder-decoder model. ``head_dim`` is per head (it need not be hidden / heads: GPT-3 1.3B,
    T5 3B/11B).
    """

    name: str
    description: str
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    activation: str
    vocabulary: int
    seq_len: int
    position_embedding: str
    tied_embeddings: bool
    norm: str
    linear_bias: bool
    dropout: bool
    encoder_layers: int = 0
    decoder_seq_len: int = 0
    max_positions: int = 0
    relative_attention_buckets: int = 0
    norm_position: str = "pre"
    token_types: int = 0
    embedding_norm: bool = False
    lm_head_transform: bool = False
    output_bias: bool = False
    pooler: bool = False
    moe: MoE | None = None
    latent_attention: LatentAttention | None = None
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_config(self)

    @property
    def gated(self) -> bool:
        """True for SwiGLU/GeGLU: the feed-forward has three matrices (gate, up, down)."""
        return self.activation in GATED_ACTIVATIONS

    @property
    def kind(self) -> str:
        """``decoder``, ``encoder``, ``encoder_decoder``, with ``_moe`` appended for a mixture of experts."""
        return self.architecture + ("_moe" if self.moe is not None else "")

    @property
    def total_layers(self) -> int:
        """Transformer layers of all stacks (encoder and decoder)."""
        return self.layers + self.encoder_layers


def _fail(where: str, message: str) -> TransformerConfigError:
    return TransformerConfigError(f"{where}: {message}")


def check_config(config: TransformerConfig) -> None:
    """Reject impossible settings with a message naming the setting and the allowed range."""
    where = f"model {config.name!r}"
    choices = {
        "architecture": ARCHITECTURES,
        "activation": ACTIVATIONS,
        "norm": NORMS,
        "norm_position": NORM_POSITIONS,
        "position_embedding": POSITION_EMBEDDINGS,
    }
    for key, allowed in choices.items():
        if getattr(config, key) not in allowed:
            raise _fail(where, f"{key} must be one of {', '.join(allowed)}, got {getattr(config, key)!r}")
    for key in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocabulary", "seq_len"):
        _whole(getattr(config, key), f"{where}: {key}", minimum=1)
    for key in ("encoder_layers", "decoder_seq_len", "max_positions", "relative_attention_buckets", "token_types"):
        _whole(getattr(config, key), f"{where}: {key}", minimum=0)
    if config.heads % config.kv_heads:
        raise _fail(where, f"heads ({config.heads}) must be a multiple of kv_heads ({config.kv_heads})")
    if (config.architecture == "encoder_decoder") != (config.encoder_layers > 0):
        raise _fail(where, "encoder_layers must be > 0 exactly when architecture is encoder_decoder")
    if config.position_embedding == "learned" and config.max_positions < config.seq_len:
        raise _fail(
            where,
            f"learned position embeddings need max_positions >= seq_len ({config.seq_len}), got {config.max_positions}",
        )
    if config.position_embedding == "relative_bias" and config.relative_attention_buckets < 1:
        raise _fail(where, "relative_bias position embeddings need relative_attention_buckets >= 1")
    if config.moe is not None:
        moe = config.moe
        for key in ("experts", "top_k", "expert_ffn_hidden", "layer_frequency"):
            _whole(getattr(moe, key), f"{where}: moe.{key}", minimum=1)
        for key in ("shared_experts", "shared_ffn_hidden", "dense_layers"):
            _whole(getattr(moe, key), f"{where}: moe.{key}", minimum=0)
        if moe.top_k > moe.experts:
            raise _fail(where, f"moe.top_k ({moe.top_k}) must not exceed moe.experts ({moe.experts})")
        if (moe.shared_experts > 0) != (moe.shared_ffn_hidden > 0):
            raise _fail(where, "moe.shared_experts and moe.shared_ffn_hidden must both be 0 or both > 0")
        if moe.capacity_factor is not None and not moe.capacity_factor > 0:
            raise _fail(where, f"moe.capacity_factor must be > 0 (or absent: dropless), got {moe.capacity_factor!r}")
        if moe.dense_layers >= config.layers:
            raise _fail(where, f"moe.dense_layers ({moe.dense_layers}) must be below layers ({config.layers})")
    if config.latent_attention is not None:
        latent = config.latent_attention
        _whole(latent.q_lora_rank, f"{where}: latent_attention.q_lora_rank", minimum=0)
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _whole(getattr(latent, key), f"{where}: latent_attention.{key}", minimum=1)
        if config.kv_heads != config.heads:
            raise _fail(where, "latent attention has one key/value head per query head: kv_heads must equal heads")


def _whole(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TransformerConfigError(f"{where}: must be a whole number >= {minimum}, got {value!r}")
    return value


# --- catalog files --------------------------------------------------------------------------------

_INTEGERS_REQUIRED = ("layers", "hidden", "heads", "ffn_hidden", "vocabulary", "seq_len")
_INTEGERS_OPTIONAL = (
    "kv_heads", "head_dim", "encoder_layers", "decoder_seq_len", "max_positions",
    "relative_attention_buckets", "token_types",
)  # fmt: skip
_CHOICES_REQUIRED = {
    "architecture": ARCHITECTURES,
    "activation": ACTIVATIONS,
    "position_embedding": POSITION_EMBEDDINGS,
    "norm": NORMS,
}
_CHOICES_OPTIONAL = {"norm_position": NORM_POSITIONS}
_FLAGS_REQUIRED = ("tied_embeddings", "linear_bias", "dropout")
_FLAGS_OPTIONAL = ("embedding_norm", "lm_head_transform", "output_bias", "pooler")
_MOE_REQUIRED = ("experts", "top_k", "expert_ffn_hidden")
_MOE_OPTIONAL = ("shared_experts", "shared_ffn_hidden", "dense_layers", "layer_frequency", "capacity_factor")
_LATENT_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _entry(table: dict[str, Any], key: str, where: str, sources: dict[str, str], prefix: str = "") -> Any:
    entry = table[key]
    if not isinstance(entry, dict) or set(entry) != {"value", "source"}:
        raise _fail(where, f'key {prefix}{key!r} must be a table {{ value = ..., source = "..." }}, got {entry!r}')
    if not isinstance(entry["source"], str) or not entry["source"].strip():
        raise _fail(where, f"key {prefix}{key!r}: source must be a non-empty string")
    sources[prefix + key] = entry["source"]
    return entry["value"]


def _keys(table: dict[str, Any], where: str, required: set[str], optional: set[str], prefix: str = "") -> None:
    unknown = sorted(set(table) - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise _fail(where, f"unknown key {prefix + unknown[0]!r}; allowed keys: {allowed}")
    missing = sorted(required - set(table))
    if missing:
        raise _fail(where, f"missing key {prefix + missing[0]!r}")


def _typed(value: Any, kind: type, where: str, key: str, allowed: tuple[str, ...] | None = None) -> Any:
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _fail(where, f"key {key!r}: must be a whole number, got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise _fail(where, f"key {key!r}: must be true or false, got {value!r}")
    if kind is str and (not isinstance(value, str) or (allowed is not None and value not in allowed)):
        raise _fail(where, f"key {key!r}: must be one of {', '.join(allowed or ())}, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise _fail(where, f"key {key!r}: must be a number, got {value!r}")
    return value


def parse_transformer(name: str, data: dict[str, Any], where: str) -> TransformerConfig:
    """Validate one catalog file's parsed TOML into a TransformerConfig; ``where`` names the file."""
    tables = {"moe", "latent_attention"}
    required = {"description", *_INTEGERS_REQUIRED, *_CHOICES_REQUIRED, *_FLAGS_REQUIRED}
    optional = {*_INTEGERS_OPTIONAL, *_CHOICES_OPTIONAL, *_FLAGS_OPTIONAL, *tables}
    _keys(data, where, required, optional)
    description = data["description"]
    if not isinstance(description, str) or not description.strip():
        raise _fail(where, "key 'description' must be a non-empty string")
    sources: dict[str, str] = {}
    values: dict[str, Any] = {}
    for key in (*_INTEGERS_REQUIRED, *_INTEGERS_OPTIONAL):
        if key in data:
            values[key] = _typed(_entry(data, key, where, sources), int, where, key)
    for key, allowed in {**_CHOICES_REQUIRED, **_CHOICES_OPTIONAL}.items():
        if key in data:
            values[key] = _typed(_entry(data, key, where, sources), str, where, key, allowed)
    for key in (*_FLAGS_REQUIRED, *_FLAGS_OPTIONAL):
        if key in data:
            values[key] = _typed(_entry(data, key, where, sources), bool, where, key)
    values.setdefault("kv_heads", values["heads"])
    if "head_dim" not in values:
        if values["hidden"] % values["heads"]:
            raise _fail(where, "hidden is not a multiple of heads: give head_dim")
        values["head_dim"] = values["hidden"] // values["heads"]
    if "moe" in data:
        values["moe"] = _parse_moe(data["moe"], where, sources)
    if "latent_attention" in data:
        values["latent_attention"] = _parse_latent(data["latent_attention"], where, sources)
    try:
        return TransformerConfig(name=name, description=description, sources=sources, **values)
    except TransformerConfigError as error:
        raise _fail(where, str(error)) from None


def _parse_moe(table: Any, where: str, sources: dict[str, str]) -> MoE:
    if not isinstance(table, dict):
        raise _fail(where, "key 'moe' must be a table")
    _keys(table, where, set(_MOE_REQUIRED), set(_MOE_OPTIONAL), prefix="moe.")
    values: dict[str, Any] = {}
    for key in (*_MOE_REQUIRED, *_MOE_OPTIONAL):
        if key in table:
            kind: type = float if key == "capacity_factor" else int
            values[key] = _typed(_entry(table, key, where, sources, "moe."), kind, where, f"moe.{key}")
    return MoE(**values)


def _parse_latent(table: Any, where: str, sources: dict[str, str]) -> LatentAttention:
    if not isinstance(table, dict):
        raise _fail(where, "key 'latent_attention' must be a table")
    _keys(table, where, set(_LATENT_KEYS), set(), prefix="latent_attention.")
    values = {
        key: _typed(_entry(table, key, where, sources, "latent_attention."), int, where, key) for key in _LATENT_KEYS
    }
    return LatentAttention(**values)


def _catalog() -> dict[str, Path]:
    files = {path.stem: path for path in sorted(CATALOG_DIR.glob("*.toml"))}
    for token, path in catalog_files("transformers", (".toml", ".json")).items():
        if token in files:
            raise TransformerConfigError(
                f"{path}: model {token!r} is already defined by {files[token]}; "
                "a user catalog may add models, not redefine them"
            )
        files[token] = path
    return files


def transformer_names() -> list[str]:
    """The transformer catalog tokens (built-in and user catalog files), sorted."""
    return sorted(_catalog())


def load_transformer_file(path: Path | str) -> TransformerConfig:
    """Load one catalog-format TOML file; the model's token is the file stem."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise TransformerConfigError(f"{path}: not valid TOML: {error}") from None
    except OSError as error:
        raise TransformerConfigError(f"{path}: cannot read: {error.strerror}") from None
    return parse_transformer(path.stem, data, str(path))


def load_transformer(name: str) -> TransformerConfig:
    """The model ``name``; an unknown name raises UnknownNameError listing the valid ones."""
    files = _catalog()
    if name not in files:
        raise UnknownNameError(f"unknown transformer model {name!r}; valid: {', '.join(sorted(files))}")
    return _load(name, files[name])


@cache
def _load(name: str, path: Path) -> TransformerConfig:
    if path.suffix == ".json":
        from ddlsim.simulator.workloads.huggingface import read_huggingface_config

        return read_huggingface_config(path, name=name)
    return load_transformer_file(path)
