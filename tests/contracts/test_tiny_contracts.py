"""The tiny contracts: same structure as the 27B, tiny dims, parts absent/optional; HF configs map onto them."""

from pathlib import Path

import pytest

from ninfer_compile.contracts import GRAPHS_DIR, dims_from_hf_config, load_contract, parse_contract
from ninfer_compile.errors import ContractError

from .tiny_definitions import TINY_CONTRACTS, TINY_TEXT_DIMS, render_tiny


@pytest.mark.parametrize("model_id", sorted(TINY_CONTRACTS))
def test_shipped_file_is_the_27b_structure(model_id):
    """graphs/<tiny>.yaml == render_contract(qwen3.6-27b, tiny dims/params/parts): the tiny
    models differ from the 27B only in dimensions and parts (regenerate with tiny_definitions.py)."""
    shipped = load_contract(model_id)
    rendered = parse_contract(render_tiny(model_id), "<rendered>")
    assert shipped.model_dump() == rendered.model_dump()


def test_tiny_text_only():
    contract = load_contract("tiny-qwen3.5")
    spec = contract.resolve()
    assert spec.layer_kinds == ["gdn", "gdn", "gdn", "attention"]
    assert spec.parts == {"text": True, "mtp": False, "draft_head": False, "vision": False, "frontend": False}
    assert spec.tensor_count == 3 + 3 * 13 + 9 and spec.resource_count == 0
    assert spec.objects["text/layers/3/attention/query_key"].shape == (4 * 32 + 2 * 32, 96)
    assert spec.objects["text/layers/0/gdn/convolution"].shape == (4, 2 * 2 * 16 + 4 * 24)
    assert spec.objects["text/layers/0/gdn/value_z"].shape == (2 * 4 * 24, 96)
    assert spec.objects["text/layers/0/mlp/down"].format == "Q5G64_F16S"
    assert spec.aliases == {}
    assert spec.params["partial_rotary_factor"] == 0.25 and spec.params["mrope_section"] is None
    # optional frontend: all six resources or none
    with_frontend = contract.resolve(present=["frontend"])
    assert with_frontend.resource_count == 6 and with_frontend.parts["frontend"]
    assert list(with_frontend.objects)[6] == "text/token_embedding"


def test_tiny_mtp():
    contract = load_contract("tiny-qwen3.5-mtp")
    spec = contract.resolve()
    assert [l for l, k in enumerate(spec.layer_kinds) if k == "attention"] == [3, 7]
    assert spec.parts["mtp"] and not spec.parts["draft_head"]
    assert spec.objects["mtp/layer/attention/query_key_gate_value"].shape == (2 * (4 * 32 + 32), 160)
    assert spec.objects["mtp/input_projection"].format == "W8G32_F16S"
    # without the optional draft head its alias disappears with it
    assert spec.aliases == {"mtp/token_embedding": "text/token_embedding", "mtp/output_head": "text/output_head"}
    with_draft = contract.resolve(present=["draft_head"])
    assert with_draft.objects["text/draft_head"].shape == (128, 160)
    assert with_draft.aliases["mtp/draft_head_token_ids"] == "text/draft_head_token_ids"
    assert with_draft.tensor_count == spec.tensor_count + 2


def test_tiny_full():
    spec = load_contract("tiny-qwen3.6-full").resolve()
    assert all(spec.parts.values()) and spec.resource_count == 6
    assert spec.objects["vision/merger/fc2"].shape == (128, 192)
    assert sum(1 for n in spec.objects if n.startswith("vision/layers/")) == 2 * 12


def test_all_shipped_contracts_load():
    for path in sorted(Path(GRAPHS_DIR).glob("*.yaml")):
        contract = load_contract(path.stem)
        assert contract.model_id == path.stem


HF_TINY = {  # what transformers' Qwen3_5TextConfig(...).to_dict() gives for the tiny model
    "model_type": "qwen3_5_text", "vocab_size": 256, "hidden_size": 96, "intermediate_size": 160,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 24,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512,
    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
}


def test_dims_from_hf_config_matches_tiny():
    dims, params, kinds = dims_from_hf_config(HF_TINY)
    assert dims == TINY_TEXT_DIMS
    assert kinds == ["gdn", "gdn", "gdn", "attention"]
    assert params == {"rms_eps": 1e-6, "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                      "token_ids": 256, "max_positions": 512}
    # a full (multimodal) config's text_config is used; MRoPE settings come along
    nested = {"text_config": {**HF_TINY, "mtp_num_hidden_layers": 1,
                              "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                                  "mrope_section": [2, 1, 1], "mrope_interleaved": True}}}
    dims, params, _ = dims_from_hf_config(nested)
    assert dims["mtp_layers"] == 1 and params["mrope_section"] == [2, 1, 1] and params["mrope_interleaved"]


def test_dims_from_hf_config_irregular_and_errors():
    irregular = {**HF_TINY, "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"]}
    dims, _, kinds = dims_from_hf_config(irregular)
    assert kinds == ["attention", "gdn", "gdn", "attention"] and "full_attention_interval" not in dims
    no_types = {k: v for k, v in HF_TINY.items() if k != "layer_types"}
    assert dims_from_hf_config({**no_types, "full_attention_interval": 2})[2] == ["gdn", "attention"] * 2
    with pytest.raises(ContractError, match="missing 'linear_num_key_heads'"):
        dims_from_hf_config({k: v for k, v in HF_TINY.items() if k != "linear_num_key_heads"})
    with pytest.raises(ContractError, match="sliding_attention"):
        dims_from_hf_config({**HF_TINY, "layer_types": ["sliding_attention"] * 4})
    with pytest.raises(ContractError, match="not an integer rotary width"):
        dims_from_hf_config({**HF_TINY, "rope_parameters": {"partial_rotary_factor": 0.3}})


def test_transformers_config_maps_onto_tiny():
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3_5TextConfig(
        vocab_size=256, hidden_size=96, num_hidden_layers=4, intermediate_size=160, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16,
        linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4)
    dims, params, kinds = dims_from_hf_config(config.to_dict())
    assert dims == TINY_TEXT_DIMS and kinds == load_contract("tiny-qwen3.5").resolve().layer_kinds
