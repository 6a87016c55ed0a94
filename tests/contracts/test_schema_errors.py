"""Bad contracts fail at load with `file:line: field.path: why` (one line)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ninfer_compile.contracts import GRAPHS_DIR, load_contract
from ninfer_compile.errors import ContractError

BASE = (Path(GRAPHS_DIR) / "tiny-qwen3.5.yaml").read_text(encoding="utf-8")


def line_of(text: str, snippet: str, nth: int = 0) -> int:
    """1-based line of the nth line containing `snippet`."""
    hits = [i + 1 for i, line in enumerate(text.splitlines()) if snippet in line]
    assert len(hits) > nth, f"{snippet!r} not in the contract text"
    return hits[nth]


def load_error(tmp_path, text: str) -> tuple[str, str]:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ContractError) as info:
        load_contract(path)
    message = str(info.value)
    assert "\n" not in message
    return message, str(path)


def edit(old: str, new: str, count: int = 1) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, count)


def test_base_is_valid():
    load_contract(Path(GRAPHS_DIR) / "tiny-qwen3.5.yaml")


def test_unknown_key(tmp_path):
    text = edit("  gdn_decay: FP32\n", "  gdn_decay: FP32\n") .replace(
        "  count: layers\n", "  count: layers\n  atention_every: 4\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'atention_every')}: layers.atention_every: unknown key")


def test_unknown_key_in_tensor_pattern(tmp_path):
    text = edit("{name: text/final_norm, shape: [hidden], role: text_norm}",
                "{name: text/final_norm, shape: [hidden], role: text_norm, dtype: bf16}")
    message, path = load_error(tmp_path, text)
    assert re.match(rf"{re.escape(path)}:{line_of(text, 'dtype: bf16')}: inventory\[\d+\]\.tensors\[0\]\.dtype: unknown key",
                    message), message


def test_wrong_type(tmp_path):
    text = edit("  hidden: 96\n", "  hidden: ninety-six\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'ninety-six')}: dims.hidden:"), message
    assert "integer" in message

    text = edit("  rms_eps: 1.0e-06\n", "  rms_eps: [1]\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'rms_eps')}: params.rms_eps:"), message

    text = edit("shape: [hidden, intermediate], role: mlp_down}", "shape: [hidden, true], role: mlp_down}")
    message, path = load_error(tmp_path, text)
    assert re.match(rf"{re.escape(path)}:{line_of(text, '[hidden, true]')}: inventory\[2\]\.per_layer\.\w+\[\d+\]\.shape\[1\]: "
                    "expected an integer or an expression", message), message


def test_bad_format_name(tmp_path):
    text = edit("  mlp_down: Q5G64_F16S\n", "  mlp_down: Q5G32_F16S\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'Q5G32_F16S')}: formats.mlp_down:"), message
    assert "Q5G32_F16S" in message


def test_bad_expression(tmp_path):
    text = edit("shape: [2*intermediate, hidden], role: mlp_gate_up}", "shape: [2*intermediate), hidden], role: mlp_gate_up}")
    message, path = load_error(tmp_path, text)
    assert re.match(rf"{re.escape(path)}:{line_of(text, '2*intermediate)')}: inventory\[2\]\.per_layer\.attention\[7\]\.shape\[0\]: "
                    r"bad expression", message), message


def test_unknown_dim_in_shape(tmp_path):
    text = edit("{name: text/final_norm, shape: [hidden], role: text_norm}",
                "{name: text/final_norm, shape: [hiden], role: text_norm}")
    message, path = load_error(tmp_path, text)
    assert re.match(rf"{re.escape(path)}:{line_of(text, '[hiden]')}: inventory\[\d\]\.tensors\[0\]\.shape\[0\]: "
                    r"unknown dimension 'hiden'", message), message


def test_unknown_dim_in_view(tmp_path):
    text = edit("up: [intermediate, 2*intermediate]", "up: [intermediate, 2*intermediat]")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, '2*intermediat]')}: views[4].rows.up[1]: unknown dimension"), message


def test_unknown_dim_name_declared(tmp_path):
    text = edit("  hidden: 96\n", "  hidden: 96\n  hidden_size: 96\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, '  hidden_size:')}: dims.hidden_size: unknown dimension name"), message


def test_missing_field_and_missing_dim(tmp_path):
    text = edit("family: qwen3_5_hybrid\n", "")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'model_id:')}: family: required field is missing"), message

    text = edit("  conv_kernel: 4\n", "")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'dims:')}: dims: missing dimension(s) conv_kernel"), message


def test_duplicate_key(tmp_path):
    text = edit("  hidden: 96\n", "  hidden: 96\n  hidden: 97\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'hidden: 97')}: dims.hidden: duplicate key"), message


def test_yaml_syntax(tmp_path):
    text = edit("  hidden: 96\n", "  hidden: [96\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:") and "YAML syntax" in message


def test_non_positive_extent(tmp_path):
    text = edit("{name: text/final_norm, shape: [hidden], role: text_norm}",
                "{name: text/final_norm, shape: [hidden - 96], role: text_norm}")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'hidden - 96')}:") and "must be positive" in message


def test_view_outside_parent_and_gap(tmp_path):
    text = edit("up: [intermediate, 2*intermediate]", "up: [intermediate, 2*intermediate + 1]")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, '2*intermediate + 1')}: views[4].rows.up:") and "exceeds" in message

    text = edit("gate: [0, intermediate]", "gate: [0, intermediate - 1]")
    message, path = load_error(tmp_path, text)
    assert "leaves rows [159, 160) uncovered" in message
    assert message.startswith(f"{path}:{line_of(text, 'up: [intermediate')}: views[4].rows.up:")

    text = edit("gate: [0, intermediate]", "gate: [0, intermediate + 1]")
    message, _ = load_error(tmp_path, text)
    assert "overlaps" in message


def test_view_parent_unknown(tmp_path):
    text = edit("- parent: text/layers/{l}/mlp/gate_up", "- parent: text/layers/{l}/mlp/gateup")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'mlp/gateup')}: views[4].parent:"), message


def test_quantized_format_needs_matrix(tmp_path):
    text = edit("  text_norm: BF16\n", "  text_norm: Q4G64_F16S\n")
    message, path = load_error(tmp_path, text)
    assert "needs a matrix" in message and message.startswith(f"{path}:")


def test_roles_and_placeholders(tmp_path):
    text = edit("  gdn_decay: FP32\n", "  gdn_decay: FP32\n  spare_role: BF16\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'spare_role')}: formats.spare_role: role 'spare_role' is used by no tensor")

    text = edit("role: gdn_output}", "role: gdn_out}")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'gdn_out}')}:") and "no entry in formats" in message

    text = edit("{name: 'text/layers/{l}/gdn/norm'", "{name: 'text/layers/gdn/norm'")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'layers/gdn/norm')}:") and "must contain {l}" in message

    text = edit("{name: text/final_norm,", "{name: 'text/final_norm/{l}',")
    message, path = load_error(tmp_path, text)
    assert "must contain no placeholder" in message


def test_duplicate_object(tmp_path):
    text = edit("{name: text/output_head,", "{name: text/final_norm,")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'text/final_norm', 1)}:") and "twice" in message


def test_family_invariants(tmp_path):
    text = edit("  gdn_v_heads: 4\n", "  gdn_v_heads: 5\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'gdn_v_heads: 5')}: dims.gdn_v_heads:") and "multiple" in message

    text = edit("  partial_rotary_factor: 0.25\n", "  partial_rotary_factor: 0.5\n")
    message, _ = load_error(tmp_path, text)
    assert "partial_rotary_factor" in message


def test_layer_pattern_errors(tmp_path):
    text = edit("  attention_every: full_attention_interval\n", "  attention_every: full_attention_interval\n  kinds: [gdn, gdn, gdn, attention]\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'layers:', 1)}: layers: give exactly one")

    text = edit("  attention_every: full_attention_interval\n", "  kinds: [gdn, gdn, attention]\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'kinds:')}: layers.kinds: 3 kinds for 4 layers")

    text = edit("  attention_every: full_attention_interval\n", "  kinds: [gdn, gdn, mamba, attention]\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'kinds:')}: layers.kinds[2]:"), message


def test_text_part_required(tmp_path):
    text = edit("  text: required\n", "  text: optional\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'text: optional')}: parts.text:")


def test_model_id_is_a_file_name(tmp_path):
    text = edit("model_id: tiny-qwen3.5\n", "model_id: ../evil\n")
    message, path = load_error(tmp_path, text)
    assert message.startswith(f"{path}:{line_of(text, 'model_id')}: model_id:")
