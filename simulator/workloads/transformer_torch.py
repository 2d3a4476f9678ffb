"""A torch model built from a TransformerConfig, module for module as ``transformer_blocks`` lists it.

Used by the tests to hold the analytic counts to torch (parameters exactly; FLOPs through
``torch.utils.flop_counter.FlopCounterMode``), and small enough for the harness to train. The
model is ``blocks[block_name][part_name]`` with the same names as ``transformer_costs``, so a
FLOP counter's per-module totals line up with the analytic parts. Nothing else in ddlsim imports
torch through this module.

Simplifications that change neither parameter counts nor matrix-product FLOPs: rotary
embeddings are omitted (no parameters, no products), dropout is omitted, the relative position
bias uses bucket 0 for every pair, and the loss is a plain cross entropy over all tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddlsim.simulator.workloads.transformer import TransformerConfig


def _norm(config: TransformerConfig, width: int | None = None) -> nn.Module:
    width = width or config.hidden
    return nn.LayerNorm(width) if config.norm == "layernorm" else nn.RMSNorm(width)


def _activate(config: TransformerConfig, x: Tensor) -> Tensor:
    if config.activation == "swiglu":
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    if config.activation == "geglu":
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate) * up
    if config.activation == "relu":
        return F.relu(x)
    if config.activation == "squared_relu":
        return F.relu(x) ** 2
    return F.gelu(x)


class Core(nn.Module):
    """Scaled dot-product attention with explicit products (so the FLOP counter sees both)."""

    def __init__(self, config: TransformerConfig, causal: bool, relative_bias: bool) -> None:
        super().__init__()
        self.causal = causal
        self.bias = nn.Embedding(config.relative_attention_buckets, config.heads) if relative_bias else None

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # (batch, heads, tokens, dim)
        if k.shape[1] != q.shape[1]:  # grouped-query attention: share each key/value head
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        if self.bias is not None:
            buckets = torch.zeros(scores.shape[-2:], dtype=torch.long, device=scores.device)
            scores = scores + self.bias(buckets).permute(2, 0, 1)
        if self.causal:
            future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        return torch.matmul(scores.softmax(-1), v)


def _child(module: nn.Module, *names: str) -> Any:
    """``module[a][b]...`` through ModuleDicts, typed loosely (torch types ModuleDict items as Module)."""
    for name in names:
        module = module[name]  # type: ignore[index]
    return module


def _heads(x: Tensor, heads: int) -> Tensor:
    batch, tokens, width = x.shape
    return x.view(batch, tokens, heads, width // heads).transpose(1, 2)


def _merge(x: Tensor) -> Tensor:
    batch, heads, tokens, dim = x.shape
    return x.transpose(1, 2).reshape(batch, tokens, heads * dim)


class Layer(nn.ModuleDict):
    """One transformer layer; its children are the parts of ``transformer_costs._layer``."""

    def __init__(self, config: TransformerConfig, index: int, stack: str) -> None:
        super().__init__()
        h, a, k, d, bias = config.hidden, config.heads, config.kv_heads, config.head_dim, config.linear_bias
        self.config, self.stack = config, stack
        causal = stack == "decoder"
        relative = config.position_embedding == "relative_bias" and index == 0
        latent = config.latent_attention
        self["norm_attention"] = _norm(config)
        if latent is not None:
            q_rank, kv_rank, rope = latent.q_lora_rank, latent.kv_lora_rank, latent.qk_rope_head_dim
            qk = latent.qk_nope_head_dim + rope
            self["attention_latent"] = nn.ModuleDict({
                "down": nn.Linear(h, q_rank + kv_rank + rope, bias=bias),
                "kv_norm": nn.RMSNorm(kv_rank),
                **({"q_norm": nn.RMSNorm(q_rank)} if q_rank else {}),
            })  # fmt: skip
            self["attention_qkv"] = nn.ModuleDict({
                "q": nn.Linear(q_rank or h, a * qk, bias=bias),
                "kv": nn.Linear(kv_rank, a * (latent.qk_nope_head_dim + latent.v_head_dim), bias=bias),
            })  # fmt: skip
            value_width = a * latent.v_head_dim
        else:
            self["attention_qkv"] = nn.Linear(h, (a + 2 * k) * d, bias=bias)
            value_width = a * d
        self["attention_core"] = Core(config, causal, relative)
        self["attention_output"] = nn.Linear(value_width, h, bias=bias)
        self.cross = stack == "decoder" and config.architecture == "encoder_decoder"
        if self.cross:
            self["norm_cross_attention"] = _norm(config)
            self["cross_attention_q"] = nn.Linear(h, a * d, bias=bias)
            self["cross_attention_kv"] = nn.Linear(h, 2 * k * d, bias=bias)
            self["cross_attention_core"] = Core(config, causal=False, relative_bias=False)
            self["cross_attention_output"] = nn.Linear(a * d, h, bias=bias)
        self["norm_mlp"] = _norm(config)
        gate = 2 if config.gated else 1
        moe = config.moe
        self.moe = moe is not None and stack == "decoder" and moe.is_moe_layer(index)
        if self.moe:
            assert moe is not None
            self["router"] = nn.Linear(h, moe.experts, bias=False)
            width = moe.expert_ffn_hidden
            self["experts_in"] = nn.ModuleList(nn.Linear(h, gate * width, bias=bias) for _ in range(moe.experts))
            self["experts_out"] = nn.ModuleList(nn.Linear(width, h, bias=bias) for _ in range(moe.experts))
            if moe.shared_experts:
                shared = moe.shared_experts * moe.shared_ffn_hidden
                self["shared_experts_in"] = nn.Linear(h, gate * shared, bias=bias)
                self["shared_experts_out"] = nn.Linear(shared, h, bias=bias)
        else:
            self["mlp_in"] = nn.Linear(h, gate * config.ffn_hidden, bias=bias)
            self["mlp_out"] = nn.Linear(config.ffn_hidden, h, bias=bias)

    def _self_attention(self, x: Tensor) -> Tensor:
        config, a = self.config, self.config.heads
        latent = config.latent_attention
        if latent is None:
            d, k = config.head_dim, config.kv_heads
            q, key, value = _child(self, "attention_qkv")(x).split([a * d, k * d, k * d], dim=-1)
            context = _child(self, "attention_core")(_heads(q, a), _heads(key, k), _heads(value, k))
            return _child(self, "attention_output")(_merge(context))
        q_rank, kv_rank, rope = latent.q_lora_rank, latent.kv_lora_rank, latent.qk_rope_head_dim
        down = _child(self, "attention_latent")
        q_latent, kv_latent, k_rope = down["down"](x).split([q_rank, kv_rank, rope], dim=-1)
        q = _child(self, "attention_qkv", "q")(down["q_norm"](q_latent) if q_rank else x)
        kv = _heads(_child(self, "attention_qkv", "kv")(down["kv_norm"](kv_latent)), a)
        k_nope, value = kv.split([latent.qk_nope_head_dim, latent.v_head_dim], dim=-1)
        k_rope = k_rope.unsqueeze(1).expand(-1, a, -1, -1)
        context = _child(self, "attention_core")(_heads(q, a), torch.cat([k_nope, k_rope], dim=-1), value)
        return _child(self, "attention_output")(_merge(context))

    def _experts(self, x: Tensor) -> Tensor:
        moe = self.config.moe
        assert moe is not None
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = _child(self, "router")(tokens).softmax(-1).topk(moe.top_k, dim=-1)
        out = torch.zeros_like(tokens)
        for expert in range(moe.experts):
            rows, slot = (chosen == expert).nonzero(as_tuple=True)
            if rows.numel():
                hidden = _activate(self.config, _child(self, "experts_in")[expert](tokens[rows]))
                out = out.index_add(0, rows, _child(self, "experts_out")[expert](hidden) * weights[rows, slot, None])
        if moe.shared_experts:
            shared = _activate(self.config, _child(self, "shared_experts_in")(tokens))
            out = out + _child(self, "shared_experts_out")(shared)
        return out.view_as(x)

    def forward(self, x: Tensor, memory: Tensor | None = None) -> Tensor:
        post = self.config.norm_position == "post"

        def residual(norm: str, body, x: Tensor) -> Tensor:
            return _child(self, norm)(x + body(x)) if post else x + body(_child(self, norm)(x))

        x = residual("norm_attention", self._self_attention, x)
        if self.cross:
            assert memory is not None
            a, k = self.config.heads, self.config.kv_heads

            def cross(y: Tensor) -> Tensor:
                key, value = _child(self, "cross_attention_kv")(memory).chunk(2, dim=-1)
                q = _heads(_child(self, "cross_attention_q")(y), a)
                context = _child(self, "cross_attention_core")(q, _heads(key, k), _heads(value, k))
                return _child(self, "cross_attention_output")(_merge(context))

            x = residual("norm_cross_attention", cross, x)
        if self.moe:
            return residual("norm_mlp", self._experts, x)
        return residual("norm_mlp", self._mlp, x)

    def _mlp(self, x: Tensor) -> Tensor:
        return _child(self, "mlp_out")(_activate(self.config, _child(self, "mlp_in")(x)))


class Embedding(nn.ModuleDict):
    def __init__(self, config: TransformerConfig, table: nn.Embedding | None) -> None:
        super().__init__()
        self.table = [table]  # a shared table, kept out of this module's parameters
        parts: dict[str, nn.Module] = {}
        if table is None:
            parts["tokens"] = nn.Embedding(config.vocabulary, config.hidden)
        if config.position_embedding == "learned":
            parts["positions"] = nn.Embedding(config.max_positions, config.hidden)
        if config.token_types:
            parts["token_types"] = nn.Embedding(config.token_types, config.hidden)
        self["embedding"] = nn.ModuleDict(parts)
        if config.embedding_norm:
            self["embedding_norm"] = _norm(config)

    def lookup(self) -> nn.Embedding:
        return self.table[0] or _child(self, "embedding", "tokens")

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.lookup()(tokens)
        parts = _child(self, "embedding")
        if "positions" in parts:
            x = x + parts["positions"](torch.arange(tokens.shape[1], device=tokens.device))
        if "token_types" in parts:
            x = x + parts["token_types"](torch.zeros_like(tokens))
        return _child(self, "embedding_norm")(x) if "embedding_norm" in self else x


class Logits(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        v, h = config.vocabulary, config.hidden
        self.weight = None if config.tied_embeddings else nn.Parameter(torch.empty(v, h).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(v)) if config.output_bias else None

    def forward(self, x: Tensor, table: nn.Embedding) -> Tensor:
        weight = table.weight if self.weight is None else self.weight
        return F.linear(x, weight, self.bias)


class TorchTransformer(nn.Module):
    """``blocks`` in the order and with the names of ``transformer_blocks(config)``."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        blocks: dict[str, nn.Module] = {}
        encoder_decoder = config.architecture == "encoder_decoder"
        if encoder_decoder:
            blocks["encoder_embedding"] = Embedding(config, None)
            for index in range(config.encoder_layers):
                blocks[f"encoder_layer_{index}"] = Layer(config, index, "encoder")
            blocks["encoder_output"] = nn.ModuleDict({"final_norm": _norm(config)})
        stack = "encoder" if config.architecture == "encoder" else "decoder"
        shared = _child(blocks["encoder_embedding"]).lookup() if encoder_decoder else None
        blocks["embedding"] = Embedding(config, shared)
        for index in range(config.layers):
            blocks[f"layer_{index}"] = Layer(config, index, stack)
        output: dict[str, nn.Module] = {}
        if config.norm_position == "pre":
            output["final_norm"] = _norm(config)
        if config.pooler:
            output["pooler"] = nn.ModuleDict({"dense": nn.Linear(config.hidden, config.hidden),
                                              "classifier": nn.Linear(config.hidden, 2)})
        if config.lm_head_transform:
            output["lm_head_transform"] = nn.Sequential(nn.Linear(config.hidden, config.hidden), nn.GELU(),
                                                        _norm(config))
        output["logits"] = Logits(config)
        blocks["output"] = nn.ModuleDict(output)
        self.blocks = nn.ModuleDict(blocks)

    def forward(self, tokens: Tensor, decoder_tokens: Tensor | None = None) -> Tensor:
        """Mean cross-entropy loss of predicting ``tokens`` (or ``decoder_tokens``) from themselves."""
        blocks: Any = self.blocks
        config = self.config
        memory = None
        if config.architecture == "encoder_decoder":
            memory = blocks["encoder_embedding"](tokens)
            for index in range(config.encoder_layers):
                memory = blocks[f"encoder_layer_{index}"](memory)
            memory = blocks["encoder_output"]["final_norm"](memory)
            tokens = tokens if decoder_tokens is None else decoder_tokens
        x = blocks["embedding"](tokens)
        for index in range(config.layers):
            x = blocks[f"layer_{index}"](x, memory)
        output = blocks["output"]
        loss = torch.zeros((), device=x.device)
        if "final_norm" in output:
            x = output["final_norm"](x)
        if "pooler" in output:
            pooled = torch.tanh(output["pooler"]["dense"](x[:, 0]))
            loss = loss + output["pooler"]["classifier"](pooled).logsumexp(-1).mean()
        if "lm_head_transform" in output:
            x = output["lm_head_transform"](x)
        logits = output["logits"](x, blocks["embedding"].lookup())
        return loss + F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
