"""Transformer catalog and Hugging Face configs: every entry loads with its sources, parameter totals
match the published ones, config.json files read as they are, bad files fail with one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlsim.registry import UnknownNameError
from ddlsim.simulator.workloads.huggingface import read_huggingface_config
from ddlsim.simulator.workloads.transformer import (
    CATALOG_DIR,
    TransformerConfigError,
    load_transformer,
    load_transformer_file,
    transformer_names,
)
from ddlsim.simulator.workloads.transformer_costs import (
    active_parameter_count,
    parameter_count,
    transformer_blocks,
)

HF_DIR = Path(__file__).parent / "data" / "huggingface"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "transformers.md"

# Exact trainable-parameter totals as the Hugging Face model classes count them (model cards, or
# sum(p.numel()) of the published checkpoints): BertForPreTraining, GPT2LMHeadModel (tied),
# T5ForConditionalGeneration v1.0 (tied), LlamaForCausalLM, MixtralForCausalLM, DeepseekV2/V3.
PUBLISHED_EXACT = {
    "bert_base": 110_106_428,
    "bert_large": 336_226_108,
    "gpt2": 124_439_808,
    "gpt2_medium": 354_823_168,
    "gpt2_large": 774_030_080,
    "gpt2_xl": 1_557_611_200,
    "t5_base": 222_903_552,
    "t5_large": 737_668_096,
    "t5_3b": 2_851_598_336,
    "t5_11b": 11_307_321_344,
    "llama2_7b": 6_738_415_616,
    "llama2_13b": 13_015_864_320,
    "llama2_70b": 68_976_648_192,
    "llama3_8b": 8_030_261_248,
    "llama3_70b": 70_553_706_496,
    "llama3_405b": 405_853_388_800,
    "mixtral_8x7b": 46_702_792_704,
    "deepseek_v2_lite": 15_706_484_224,
    "bloom_176b": 176_247_271_424,  # BloomForCausalLM (tied), the bigscience/bloom model card's count
}

# Narayanan et al. SC21 table 1, "number of parameters (billion)", one decimal.
NARAYANAN_TABLE_1 = {
    "megatron_1_7b": 1.7, "megatron_3_6b": 3.6, "megatron_7_5b": 7.5, "megatron_18b": 18.4,
    "megatron_39b": 39.1, "megatron_76b": 76.1, "megatron_146b": 145.6, "megatron_310b": 310.1,
    "megatron_530b": 529.6, "megatron_1t": 1008.0,
}  # fmt: skip

# Brown et al. 2020 table 2.1 "n_params" (rounded labels): within 2% (the labels round to 2 digits).
GPT3_LABELS = {
    "gpt3_125m": 125e6, "gpt3_350m": 350e6, "gpt3_760m": 760e6, "gpt3_1_3b": 1.3e9, "gpt3_2_7b": 2.7e9,
    "gpt3_6_7b": 6.7e9, "gpt3_13b": 13e9, "gpt3_175b": 175e9,
}  # fmt: skip

REQUIRED = [
    "bert_base", "bert_large", "gpt2", "gpt2_medium", "gpt2_large", "gpt2_xl", *GPT3_LABELS, *NARAYANAN_TABLE_1,
    "t5_base", "t5_large", "t5_3b", "t5_11b", "llama2_7b", "llama2_13b", "llama2_70b", "llama3_8b", "llama3_70b",
    "llama3_405b", "mixtral_8x7b", "deepseek_v2_lite", "deepseek_v3",
]  # fmt: skip


def parameters(name: str) -> int:
    return parameter_count(transformer_blocks(load_transformer(name)))


def test_required_models_are_in_the_catalog() -> None:
    assert sorted(set(REQUIRED) - set(transformer_names())) == []


@pytest.mark.parametrize("name", transformer_names())
def test_every_setting_cites_a_source(name: str) -> None:
    config = load_transformer(name)
    assert config.name == name and config.description.strip()
    text = (CATALOG_DIR / f"{name}.toml").read_text(encoding="utf-8")
    settings = [line.split("=")[0].strip() for line in text.splitlines() if "{ value =" in line]
    assert len(settings) == len(config.sources) > 10
    for key, source in config.sources.items():
        assert len(source) > 20, f"{name}: source of {key!r} does not name a document"


@pytest.mark.parametrize("name", transformer_names())
def test_every_model_is_documented(name: str) -> None:
    assert f"`{name}`" in DOCS.read_text(encoding="utf-8")


@pytest.mark.parametrize(("name", "published"), PUBLISHED_EXACT.items())
def test_parameters_match_the_published_checkpoints_exactly(name: str, published: int) -> None:
    assert parameters(name) == published


# Nemotron-4 15B (arXiv 2402.16819) and 340B (arXiv 2406.11704): non-embedding parameters in
# billions, one decimal (the embeddings are the untied input and output tables of 256,000 tokens).
NEMOTRON_4 = {"nemotron4_15b": 12.5, "nemotron4_340b": 331.6}


def test_mixtral_8x22b_has_its_model_cards_141b_with_39b_active() -> None:
    config = load_transformer("mixtral_8x22b")
    blocks = transformer_blocks(config)
    assert round(parameter_count(blocks) / 1e9) == 141 and round(active_parameter_count(config, blocks) / 1e9) == 39


@pytest.mark.parametrize(("name", "billions"), NEMOTRON_4.items())
def test_nemotron_4_has_its_reports_non_embedding_parameters(name: str, billions: float) -> None:
    config = load_transformer(name)
    embedding = 2 * config.vocabulary * config.hidden
    assert round((parameters(name) - embedding) / 1e9, 1) == billions


@pytest.mark.parametrize(("name", "billions"), NARAYANAN_TABLE_1.items())
def test_megatron_parameters_round_to_narayanan_table_1(name: str, billions: float) -> None:
    assert round(parameters(name) / 1e9, 1) == billions


@pytest.mark.parametrize(("name", "label"), GPT3_LABELS.items())
def test_gpt3_parameters_near_the_paper_labels(name: str, label: float) -> None:
    assert parameters(name) == pytest.approx(label, rel=0.02)


def test_moe_active_parameters_match_the_papers() -> None:
    """Mixtral: 12.9B active of 46.7B (Jiang et al. 2024: '13B active'); DeepSeek-V3: 37B active of
    671B (DeepSeek-AI 2024); DeepSeek-V2-Lite: 2.4B active without the 0.21B input embedding."""
    mixtral = load_transformer("mixtral_8x7b")
    assert active_parameter_count(mixtral, transformer_blocks(mixtral)) == pytest.approx(12.88e9, rel=0.005)
    v3 = load_transformer("deepseek_v3")
    assert parameters("deepseek_v3") == pytest.approx(671e9, rel=0.001)
    assert active_parameter_count(v3, transformer_blocks(v3)) == pytest.approx(37e9, rel=0.02)
    lite = load_transformer("deepseek_v2_lite")
    without_embedding = active_parameter_count(lite, transformer_blocks(lite)) - 102400 * 2048
    assert without_embedding == pytest.approx(2.4e9, rel=0.03)


def test_unknown_model_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown transformer model 'llama9'.*llama3_70b"):
        load_transformer("llama9")


# --- Hugging Face config.json ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(path.name for path in HF_DIR.iterdir() if path.is_dir()))
def test_huggingface_config_reads_as_the_catalog_entry(name: str) -> None:
    catalog = load_transformer(name)
    read = read_huggingface_config(HF_DIR / name / "config.json", seq_len=catalog.seq_len)
    assert read.name == name
    assert parameter_count(transformer_blocks(read)) == PUBLISHED_EXACT[name]
    for key in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocabulary", "activation",
                "tied_embeddings", "moe", "latent_attention", "encoder_layers"):
        assert getattr(read, key) == getattr(catalog, key), key


def test_huggingface_sequence_length_defaults_to_max_positions() -> None:
    assert read_huggingface_config(HF_DIR / "llama2_7b" / "config.json").seq_len == 4096


def write_config(tmp_path: Path, data: dict) -> Path:
    folder = tmp_path / "mine"
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def llama_fields() -> dict:
    return json.loads((HF_DIR / "llama2_7b" / "config.json").read_text(encoding="utf-8"))


def test_huggingface_missing_field_is_one_line(tmp_path: Path) -> None:
    data = llama_fields()
    del data["hidden_size"]
    with pytest.raises(TransformerConfigError) as caught:
        read_huggingface_config(write_config(tmp_path, data))
    message = str(caught.value)
    assert "\n" not in message
    assert "config.json: field 'hidden_size' (model_type 'llama') is missing" in message


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("num_attention_heads", "32", "(model_type 'llama') must be a whole number >= 1, got '32'"),
        ("num_key_value_heads", 5, "heads (32) must be a multiple of kv_heads (5)"),
        ("hidden_act", "tanh", "field 'hidden_act' (model_type 'llama') must be one of silu, swish, gelu"),
        ("tie_word_embeddings", "no", "field 'tie_word_embeddings' (model_type 'llama') must be true or false"),
        ("model_type", "mamba", "field 'model_type' must be one of bert, deepseek_v2"),
    ],
)
def test_huggingface_invalid_field_is_one_line(tmp_path: Path, field: str, value: object, expected: str) -> None:
    data = llama_fields()
    data[field] = value
    with pytest.raises(TransformerConfigError) as caught:
        read_huggingface_config(write_config(tmp_path, data))
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_huggingface_not_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{ not json", encoding="utf-8")
    with pytest.raises(TransformerConfigError, match="not valid JSON"):
        read_huggingface_config(path)


# --- catalog file validation ----------------------------------------------------------------------


def catalog_text(name: str = "llama2_7b") -> str:
    return (CATALOG_DIR / f"{name}.toml").read_text(encoding="utf-8")


def load_text(tmp_path: Path, text: str):
    path = tmp_path / "mine.toml"
    path.write_text(text, encoding="utf-8")
    return load_transformer_file(path)


def test_catalog_copy_loads_the_same(tmp_path: Path) -> None:
    copy = load_text(tmp_path, catalog_text())
    assert parameter_count(transformer_blocks(copy)) == PUBLISHED_EXACT["llama2_7b"]


SOURCE = 'source = "a source long enough"'
BAD_EDITS = [
    # (text replaced, replacement, expected message)
    ("", f"colour = {{ value = 1, {SOURCE} }}\n", "unknown key 'colour'; allowed keys:"),
    ("hidden = { value = 4096,", "# hidden = { value = 4096,", "missing key 'hidden'"),
    ("layers = { value = 32,", "layers = { value = 0,", "layers: must be a whole number >= 1, got 0"),
    ("layers = { value = 32,", "layers = { value = 32.5,", "key 'layers': must be a whole number"),
    ('"swiglu"', '"tanh"', "key 'activation': must be one of gelu, relu, squared_relu, swiglu"),
    ("layers = { value = 32, source =", "layers = { value = 32, origin =",
     "key 'layers' must be a table { value = ..., source = \"...\" }"),
    ("kv_heads = { value = 32,", "kv_heads = { value = 3,", "heads (32) must be a multiple of kv_heads (3)"),
    ("", f"[moe]\nexperts = {{ value = 4, {SOURCE} }}\n", "missing key 'moe.expert_ffn_hidden'"),
]


@pytest.mark.parametrize(("old", "new", "expected"), BAD_EDITS)
def test_bad_catalog_file_names_file_and_key(tmp_path: Path, old: str, new: str, expected: str) -> None:
    text = catalog_text()
    text = text.replace(old, new) if old else text + new
    with pytest.raises(TransformerConfigError) as caught:
        load_text(tmp_path, text)
    assert "mine.toml" in str(caught.value)
    assert expected in str(caught.value)


def test_moe_top_k_above_experts_is_refused(tmp_path: Path) -> None:
    text = catalog_text("mixtral_8x7b").replace("top_k = { value = 2,", "top_k = { value = 9,")
    with pytest.raises(TransformerConfigError, match=r"moe.top_k \(9\) must not exceed moe.experts \(8\)"):
        load_text(tmp_path, text)


def test_user_catalog_adds_models_in_both_formats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DDLSIM_CATALOG directory's transformers/ folder: a catalog TOML and a config.json, read as they are."""
    from ddlsim.hardware_models.catalog import CATALOG_ENVIRONMENT_VARIABLE

    folder = tmp_path / "transformers"
    folder.mkdir()
    (folder / "my_llama.toml").write_text(catalog_text(), encoding="utf-8")
    (folder / "my_mixtral.json").write_text((HF_DIR / "mixtral_8x7b" / "config.json").read_text(), encoding="utf-8")
    monkeypatch.setenv(CATALOG_ENVIRONMENT_VARIABLE, str(tmp_path))
    assert {"my_llama", "my_mixtral", "llama2_7b"} <= set(transformer_names())
    assert parameters("my_llama") == PUBLISHED_EXACT["llama2_7b"]
    assert parameters("my_mixtral") == PUBLISHED_EXACT["mixtral_8x7b"]
    clash = tmp_path / "clash" / "transformers"
    clash.mkdir(parents=True)
    (clash / "gpt2.toml").write_text(catalog_text("gpt2"), encoding="utf-8")
    monkeypatch.setenv(CATALOG_ENVIRONMENT_VARIABLE, f"{tmp_path}:{clash.parent}")
    with pytest.raises(TransformerConfigError, match=r"model 'gpt2' is already defined by .*gpt2\.toml"):
        transformer_names()
