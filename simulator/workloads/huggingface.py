"""Read a Hugging Face ``config.json`` as it is into a TransformerConfig.

Supported ``model_type`` values and the fields read (Hugging Face ``transformers`` names; a field
with a default in ``transformers`` may be absent, the same default applies here):

- ``llama``, ``mistral``, ``mixtral``: hidden_size, num_hidden_layers, num_attention_heads,
  num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings, hidden_act,
  tie_word_embeddings, attention_bias, head_dim; Mixtral also num_local_experts,
  num_experts_per_tok.
- ``gpt2``: n_embd, n_layer, n_head, n_inner, vocab_size, n_positions, resid_pdrop.
- ``bert``: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size,
  max_position_embeddings, type_vocab_size, hidden_act, hidden_dropout_prob (read as
  BertForPreTraining: both pretraining heads).
- ``t5``: d_model, num_layers, num_decoder_layers, num_heads, d_kv, d_ff, vocab_size,
  relative_attention_num_buckets, feed_forward_proj, tie_word_embeddings, dropout_rate.
- ``deepseek_v2``, ``deepseek_v3``: the Llama fields plus q_lora_rank, kv_lora_rank,
  qk_nope_head_dim, qk_rope_head_dim, v_head_dim, n_routed_experts, num_experts_per_tok,
  moe_intermediate_size, n_shared_experts, first_k_dense_replace, moe_layer_freq.

A config.json names no training sequence length: ``seq_len`` defaults to
``max_position_embeddings`` (``n_positions`` for GPT-2, 512 for T5) and should usually be given.
A missing or invalid field is one error line naming the file, the field and what is allowed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddlsim.simulator.workloads.transformer import (
    LatentAttention,
    MoE,
    TransformerConfig,
    TransformerConfigError,
)

MODEL_TYPES = ("bert", "deepseek_v2", "deepseek_v3", "gpt2", "llama", "mistral", "mixtral", "t5")
_GATED_ACTIVATIONS = {
    "silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_new": "geglu", "gelu_pytorch_tanh": "geglu",
}  # fmt: skip


class _Fields:
    """Typed access to a config.json's fields, each failure one line naming file and field."""

    def __init__(self, data: dict[str, Any], where: str, model_type: str) -> None:
        self.data, self.where, self.model_type = data, where, model_type

    def fail(self, field: str, message: str) -> TransformerConfigError:
        return TransformerConfigError(f"{self.where}: field {field!r} (model_type {self.model_type!r}) {message}")

    def whole(self, field: str, default: int | None = None, minimum: int = 1, allow_null: bool = False) -> int:
        value = self.data.get(field, default)
        if value is None and field in self.data and allow_null:
            return 0
        if value is None:
            raise self.fail(field, "is missing; it must be a whole number")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(field, f"must be a whole number >= {minimum}, got {value!r}")
        return value

    def flag(self, field: str, default: bool) -> bool:
        value = self.data.get(field, default)
        if not isinstance(value, bool):
            raise self.fail(field, f"must be true or false, got {value!r}")
        return value

    def number(self, field: str, default: float) -> float:
        value = self.data.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise self.fail(field, f"must be a number >= 0, got {value!r}")
        return float(value)

    def text(self, field: str, default: str, allowed: tuple[str, ...]) -> str:
        value = self.data.get(field, default)
        if value not in allowed:
            raise self.fail(field, f"must be one of {', '.join(allowed)}, got {value!r}")
        return str(value)


def read_huggingface_config(path: Path | str, seq_len: int | None = None, name: str | None = None) -> TransformerConfig:
    """Read ``path`` (a Hugging Face config.json) into a TransformerConfig.

    ``name`` defaults to the folder name for a file called ``config.json``, else the file stem.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise TransformerConfigError(f"{path}: cannot read: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise TransformerConfigError(f"{path}: not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise TransformerConfigError(f"{path}: a config.json must hold one JSON object")
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES:
        raise TransformerConfigError(
            f"{path}: field 'model_type' must be one of {', '.join(MODEL_TYPES)}, got {model_type!r}"
        )
    if name is None:
        name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    fields = _Fields(data, str(path), model_type)
    readers = {"bert": _bert, "gpt2": _gpt2, "t5": _t5}
    settings = readers.get(model_type, _llama_like)(fields, seq_len)
    try:
        return TransformerConfig(
            name=name,
            description=f"{model_type} model read from {path}",
            sources={"*": f"Hugging Face config.json {path}"},
            **settings,
        )
    except TransformerConfigError as error:
        raise TransformerConfigError(f"{path}: {error}") from None


def _llama_like(fields: _Fields, seq_len: int | None) -> dict[str, Any]:
    heads = fields.whole("num_attention_heads")
    hidden = fields.whole("hidden_size")
    activation = fields.text("hidden_act", "silu", tuple(_GATED_ACTIVATIONS))
    settings: dict[str, Any] = dict(
        architecture="decoder",
        layers=fields.whole("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=fields.whole("num_key_value_heads", heads),
        head_dim=fields.whole("head_dim") if fields.data.get("head_dim") is not None else hidden // heads,
        ffn_hidden=fields.whole("intermediate_size"),
        activation=_GATED_ACTIVATIONS[activation],
        vocabulary=fields.whole("vocab_size"),
        seq_len=seq_len or fields.whole("max_position_embeddings"),
        position_embedding="rotary",
        norm="rmsnorm",
        linear_bias=fields.flag("attention_bias", False),
        dropout=fields.number("attention_dropout", 0.0) > 0,
        tied_embeddings=fields.flag("tie_word_embeddings", False),
    )
    if fields.model_type == "mixtral":
        settings["moe"] = MoE(
            experts=fields.whole("num_local_experts", 8),
            top_k=fields.whole("num_experts_per_tok", 2),
            expert_ffn_hidden=settings["ffn_hidden"],
        )
    elif fields.model_type.startswith("deepseek"):
        shared = fields.whole("n_shared_experts", 0, minimum=0, allow_null=True)
        expert_ffn = fields.whole("moe_intermediate_size")
        settings["kv_heads"] = heads
        settings["moe"] = MoE(
            experts=fields.whole("n_routed_experts"),
            top_k=fields.whole("num_experts_per_tok"),
            expert_ffn_hidden=expert_ffn,
            shared_experts=shared,
            shared_ffn_hidden=expert_ffn if shared else 0,
            dense_layers=fields.whole("first_k_dense_replace", 0, minimum=0),
            layer_frequency=fields.whole("moe_layer_freq", 1),
        )
        settings["latent_attention"] = LatentAttention(
            q_lora_rank=fields.whole("q_lora_rank", 0, minimum=0, allow_null=True),
            kv_lora_rank=fields.whole("kv_lora_rank"),
            qk_nope_head_dim=fields.whole("qk_nope_head_dim"),
            qk_rope_head_dim=fields.whole("qk_rope_head_dim"),
            v_head_dim=fields.whole("v_head_dim"),
        )
    return settings


def _gpt2(fields: _Fields, seq_len: int | None) -> dict[str, Any]:
    hidden = fields.whole("n_embd", 768)
    inner = fields.data.get("n_inner")
    positions = fields.whole("n_positions", 1024)
    return dict(
        architecture="decoder",
        layers=fields.whole("n_layer", 12),
        hidden=hidden,
        heads=fields.whole("n_head", 12),
        kv_heads=fields.whole("n_head", 12),
        head_dim=hidden // fields.whole("n_head", 12),
        ffn_hidden=4 * hidden if inner is None else fields.whole("n_inner"),
        activation="gelu",
        vocabulary=fields.whole("vocab_size", 50257),
        seq_len=seq_len or positions,
        position_embedding="learned",
        max_positions=positions,
        norm="layernorm",
        linear_bias=True,
        dropout=fields.number("resid_pdrop", 0.1) > 0,
        tied_embeddings=fields.flag("tie_word_embeddings", True),
    )


def _bert(fields: _Fields, seq_len: int | None) -> dict[str, Any]:
    heads = fields.whole("num_attention_heads", 12)
    hidden = fields.whole("hidden_size", 768)
    positions = fields.whole("max_position_embeddings", 512)
    fields.text("hidden_act", "gelu", ("gelu", "gelu_new", "gelu_pytorch_tanh"))
    return dict(
        architecture="encoder",
        layers=fields.whole("num_hidden_layers", 12),
        hidden=hidden,
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        ffn_hidden=fields.whole("intermediate_size", 3072),
        activation="gelu",
        vocabulary=fields.whole("vocab_size", 30522),
        seq_len=seq_len or positions,
        position_embedding="learned",
        max_positions=positions,
        token_types=fields.whole("type_vocab_size", 2, minimum=0),
        norm="layernorm",
        norm_position="post",
        linear_bias=True,
        dropout=fields.number("hidden_dropout_prob", 0.1) > 0,
        tied_embeddings=fields.flag("tie_word_embeddings", True),
        embedding_norm=True,
        lm_head_transform=True,
        output_bias=True,
        pooler=True,
    )


def _t5(fields: _Fields, seq_len: int | None) -> dict[str, Any]:
    projection = fields.text("feed_forward_proj", "relu", ("relu", "gated-gelu", "gated-silu"))
    layers = fields.whole("num_layers", 6)
    return dict(
        architecture="encoder_decoder",
        layers=fields.whole("num_decoder_layers", layers),
        encoder_layers=layers,
        hidden=fields.whole("d_model", 512),
        heads=fields.whole("num_heads", 8),
        kv_heads=fields.whole("num_heads", 8),
        head_dim=fields.whole("d_kv", 64),
        ffn_hidden=fields.whole("d_ff", 2048),
        activation={"relu": "relu", "gated-gelu": "geglu", "gated-silu": "swiglu"}[projection],
        vocabulary=fields.whole("vocab_size", 32128),
        seq_len=seq_len or 512,
        position_embedding="relative_bias",
        relative_attention_buckets=fields.whole("relative_attention_num_buckets", 32),
        norm="rmsnorm",
        linear_bias=False,
        dropout=fields.number("dropout_rate", 0.1) > 0,
        tied_embeddings=fields.flag("tie_word_embeddings", True),
    )
