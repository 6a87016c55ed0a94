"""graphs/qwen3.6-35b-a3b.yaml is the exact NInfer inventory of the sparse-MoE model (artifact
reference sections 2-10), and the schema features it needs (expert banks, per-layer roles, the
DFlash part) reject bad input with one precise line."""

from collections import Counter
from pathlib import Path

import pytest

from ninfer_compile.contracts import GRAPHS_DIR, PART_NAMES, check_artifact, load_contract
from ninfer_compile.errors import ContractError

from .conftest import fake_artifact

TEXT = (Path(GRAPHS_DIR) / "qwen3.6-35b-a3b.yaml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def spec():
    return load_contract("qwen3.6-35b-a3b").resolve()


def test_counts_and_formats(spec):
    assert spec.family == "qwen3_5_moe"
    assert spec.tensor_count == 934 and spec.resource_count == 6 and len(spec.objects) == 940
    by_part = Counter(o.part for o in spec.objects.values() if o.kind == "tensor")
    assert by_part == {"text": 533, "draft_head": 2, "mtp": 15, "vision": 333, "dflash": 51}
    per_part = {p: Counter(o.format for o in spec.objects.values() if o.part == p) for p in by_part}
    # the numeric-format table of the artifact reference, column by column
    assert per_part["text"] == {"BF16": 231, "FP32": 60, "Q4G64_F16S": 40, "Q5G64_F16S": 37,
                                "Q6G64_F16S": 4, "W8G32_F16S": 161}
    assert per_part["draft_head"] == {"I32": 1, "Q4G64_F16S": 1}
    assert per_part["mtp"] == {"BF16": 8, "W8G32_F16S": 7}
    assert per_part["vision"] == {"BF16": 222, "Q4G64_F16S": 54, "Q5G64_F16S": 54, "Q6G64_F16S": 1,
                                  "W8G32_F16S": 2}
    assert per_part["dflash"] == {"BF16": 26, "W8G32_F16S": 25}
    layouts = Counter(o.layout for o in spec.objects.values() if o.kind == "tensor")
    assert layouts == {"contiguous-le-v1": 548, "row-split-k128-v1": 386}


def test_layers_and_routed_down_precision(spec):
    assert [l for l, k in enumerate(spec.layer_kinds) if k == "attention"] == list(range(3, 40, 4))
    down = {l: spec.objects[f"text/layers/{l}/moe/routed_down"].format for l in range(40)}
    assert [l for l, f in down.items() if f == "Q6G64_F16S"] == [34, 38, 39]
    assert set(down.values()) == {"Q5G64_F16S", "Q6G64_F16S"}
    assert all(spec.objects[f"text/layers/{l}/moe/routed_gate_up"].format == "Q4G64_F16S" for l in range(40))
    assert spec.objects["mtp/layer/moe/routed_down"].format == "W8G32_F16S"
    assert spec.params["dflash_target_layers"] == [1, 6, 11, 16, 22, 27, 32, 37]
    assert spec.params["dflash_mask_row"] == 248077 == spec.params["token_ids"]


def test_writer_order(spec):
    names = list(spec.objects)
    assert names[6] == "text/token_embedding"
    assert [n.removeprefix("text/layers/0/") for n in names[7:21]] == [
        "input_norm", "gdn/a_log", "gdn/dt_bias", "gdn/convolution", "gdn/a_b_projection",
        "gdn/query_key_value_z", "gdn/norm", "gdn/output", "post_attention_norm", "moe/router_shared_gate",
        "moe/routed_gate_up", "moe/routed_down", "moe/shared_gate_up", "moe/shared_down"]
    start = names.index("text/layers/3/input_norm")
    assert [n.removeprefix("text/layers/3/") for n in names[start:start + 11]] == [
        "input_norm", "attention/query_key_gate_value", "attention/query_norm", "attention/key_norm",
        "attention/output", "post_attention_norm", "moe/router_shared_gate", "moe/routed_gate_up",
        "moe/routed_down", "moe/shared_gate_up", "moe/shared_down"]
    end = names.index("text/layers/39/moe/shared_down")
    assert names[end + 1:end + 6] == ["text/final_norm", "text/output_head", "text/draft_head",
                                      "text/draft_head_token_ids", "mtp/input_projection"]
    assert names[end + 19] == "mtp/final_norm" and names[end + 20] == "vision/patch_embedding"
    assert names.index("dflash/feature_projection") == names.index("vision/merger/norm/bias") + 1
    assert names[-9:] == [f"dflash/layers/5/{s}" for s in (
        "input_norm", "attention/query_key_value", "attention/query_norm", "attention/key_norm",
        "attention/output", "post_attention_norm", "mlp/gate_up", "mlp/down")] + ["dflash/final_norm"]


@pytest.mark.parametrize("name, shape, fmt", [
    ("text/token_embedding", (248320, 2048), "W8G32_F16S"),
    ("text/output_head", (248320, 2048), "Q6G64_F16S"),
    ("text/layers/3/attention/query_key_gate_value", (9216, 2048), "W8G32_F16S"),
    ("text/layers/3/attention/output", (2048, 4096), "W8G32_F16S"),
    ("text/layers/0/gdn/a_log", (32,), "FP32"),
    ("text/layers/0/gdn/convolution", (4, 8192), "BF16"),
    ("text/layers/0/gdn/a_b_projection", (64, 2048), "BF16"),
    ("text/layers/0/gdn/query_key_value_z", (12288, 2048), "W8G32_F16S"),
    ("text/layers/0/gdn/output", (2048, 4096), "W8G32_F16S"),
    ("text/layers/0/moe/router_shared_gate", (257, 2048), "BF16"),
    ("text/layers/0/moe/routed_gate_up", (262144, 2048), "Q4G64_F16S"),
    ("text/layers/0/moe/routed_down", (524288, 512), "Q5G64_F16S"),
    ("text/layers/34/moe/routed_down", (524288, 512), "Q6G64_F16S"),
    ("text/layers/0/moe/shared_gate_up", (1024, 2048), "W8G32_F16S"),
    ("text/layers/0/moe/shared_down", (2048, 512), "W8G32_F16S"),
    ("text/draft_head", (131072, 2048), "Q4G64_F16S"),
    ("mtp/input_projection", (2048, 4096), "W8G32_F16S"),
    ("mtp/layer/moe/router_shared_gate", (257, 2048), "BF16"),
    ("mtp/layer/moe/routed_gate_up", (262144, 2048), "W8G32_F16S"),
    ("vision/merger/fc2", (2048, 4608), "W8G32_F16S"),
    ("dflash/feature_projection", (2048, 16384), "W8G32_F16S"),
    ("dflash/layers/0/attention/query_key_value", (6144, 2048), "W8G32_F16S"),
    ("dflash/layers/5/mlp/gate_up", (12288, 2048), "W8G32_F16S"),
    ("dflash/layers/5/mlp/down", (2048, 6144), "W8G32_F16S"),
])
def test_object(spec, name, shape, fmt):
    assert spec.objects[name].shape == shape and spec.objects[name].format == fmt


def test_fused_row_views(spec):
    def rows(parent):
        return {r: (v.row_begin, v.row_begin + v.row_count) for r, v in spec.views_of(parent).items()}
    assert rows("text/layers/7/attention/query_key_gate_value") == {
        "query": (0, 4096), "key": (4096, 4608), "gate": (4608, 8704), "value": (8704, 9216)}
    assert rows("mtp/layer/attention/query_key_gate_value") == rows("text/layers/3/attention/query_key_gate_value")
    assert rows("text/layers/0/gdn/query_key_value_z") == {
        "query": (0, 2048), "key": (2048, 4096), "value": (4096, 8192), "z": (8192, 12288)}
    assert rows("text/layers/0/gdn/a_b_projection") == {"a": (0, 32), "b": (32, 64)}
    assert rows("text/layers/0/moe/router_shared_gate") == {"router": (0, 256), "shared_gate": (256, 257)}
    assert rows("text/layers/0/moe/shared_gate_up") == {"gate": (0, 512), "up": (512, 1024)}
    assert rows("dflash/layers/2/attention/query_key_value") == {
        "query": (0, 4096), "key": (4096, 5120), "value": (5120, 6144)}


def test_expert_banks(spec):
    assert len(spec.expert_banks) == 2 * 41  # gate/up and down, 40 text layers + MTP
    gu = spec.expert_banks["text/layers/5/moe/routed_gate_up"]
    down = spec.expert_banks["mtp/layer/moe/routed_down"]
    assert (gu.experts, gu.block_rows, down.block_rows) == (256, 1024, 2048)
    for e, p, r in [(0, 0, 0), (1, 0, 3), (17, 1, 511), (255, 1, 0)]:
        assert gu.row(e, ("gate", "up")[p], r) == e * 1024 + p * 512 + r
    for e, h in [(0, 0), (3, 2047), (255, 100)]:
        assert down.row(e, "down", h) == e * 2048 + h
    with pytest.raises(IndexError):
        gu.row(256, "gate", 0)
    with pytest.raises(IndexError):
        gu.row(0, "up", 512)
    # banks are not split into ordinary row views
    assert not spec.views_of("text/layers/5/moe/routed_gate_up")


def test_aliases(spec):
    assert spec.aliases["mtp/token_embedding"] == spec.aliases["dflash/token_embedding"] == "text/token_embedding"
    assert spec.aliases["dflash/draft_head"] == "text/draft_head"


def test_matching_and_damaged_fake_artifact(spec):
    check_artifact(fake_artifact(spec), spec)
    art = fake_artifact(spec)
    art.objects = [o for o in art.objects if o.name != "dflash/final_norm"]
    with pytest.raises(ContractError, match="1 missing"):
        check_artifact(art, spec)


# ---- schema errors of the new features --------------------------------------------------------

def _error(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ContractError) as info:
        load_contract(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path) + ":")
    return message


def test_layer_roles_out_of_range(tmp_path):
    msg = _error(tmp_path, TEXT.replace("moe_routed_down_precise: [34, 38]", "moe_routed_down_precise: [34, 40]"))
    assert "per_layer.gdn[11].layer_roles.moe_routed_down_precise" in msg and "0..39" in msg


def test_layer_roles_of_the_other_kind(tmp_path):
    msg = _error(tmp_path, TEXT.replace("moe_routed_down_precise: [34, 38]", "moe_routed_down_precise: [34, 39]"))
    assert "per_layer.gdn[11].layer_roles" in msg and "layer 39 is of kind attention, not gdn (the kind of this group)" in msg


def test_layer_roles_unknown_role(tmp_path):
    msg = _error(tmp_path, TEXT.replace("moe_routed_down_precise: [39]", "moe_routed_down_wider: [39]"))
    assert "layer_roles.moe_routed_down_wider" in msg and "has no entry in formats" in msg


def test_layer_roles_outside_per_layer(tmp_path):
    text = TEXT.replace("{name: text/final_norm, shape: [hidden], role: text_norm}",
                        "{name: text/final_norm, shape: [hidden], role: text_norm, layer_roles: {text_norm: [0]}}")
    assert "layer_roles applies to per_layer sections only" in _error(tmp_path, text)


def test_bank_must_split_into_experts(tmp_path):
    text = TEXT.replace("  - parent: \"text/layers/{l}/moe/routed_down\"\n    experts: experts",
                        "  - parent: \"text/layers/{l}/moe/routed_down\"\n    experts: 3")
    assert "do not split into 3 equal expert blocks" in _error(tmp_path, text)


def test_bank_block_must_be_tiled(tmp_path):
    text = TEXT.replace("      up: [expert_intermediate, 2*expert_intermediate]\n  - parent: \"text/layers/{l}/moe/routed_down\"",
                        "      up: [expert_intermediate, 2*expert_intermediate - 1]\n  - parent: \"text/layers/{l}/moe/routed_down\"")
    msg = _error(tmp_path, text)
    assert "one expert block of text/layers/0/moe/routed_gate_up" in msg and "cover rows [0, 1023) of 1024" in msg


def test_undeclared_part(tmp_path):
    text = TEXT.replace("  dflash: required ", "  # dflash undeclared ")
    assert "part 'dflash' is not declared under parts" in _error(tmp_path, text)


def test_sparse_header_artifact_checks(tmp_path, capsys):
    """`pack --synthetic qwen3.6-35b-a3b --sparse` then `check`, both through the CLI."""
    from ninfer_compile.cli import main

    out = tmp_path / "a35.ninfer"
    assert main(["pack", "--synthetic", "qwen3.6-35b-a3b", "--sparse", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "940 objects" in captured.out + captured.err
    assert main(["check", str(out)]) == 0
    assert "ok: qwen3.6-35b-a3b: 934 tensors, 6 resources match" in capsys.readouterr().out


def test_every_part_name_known():
    assert {"dflash", "dflash2"} <= set(PART_NAMES)


def test_render_keeps_layer_roles_and_refuses_out_of_range():
    """A contract rendered from tiny-moe keeps its per-layer role (and that role's format); with
    fewer layers the exception names a layer that no longer exists: one precise line."""
    from ninfer_compile.contracts import parse_contract, render_contract

    base = load_contract("tiny-moe")
    spec = base.resolve()
    text = render_contract(base, "tiny-moe-copy", spec.dims, base.params.model_dump(exclude_none=True))
    copy = parse_contract(text, "copy").resolve()
    assert copy.objects["text/layers/3/moe/routed_down"].format == "Q6G64_F16S"
    assert copy.objects["text/layers/2/moe/routed_down"].format == "Q5G64_F16S"
    with pytest.raises(ContractError) as info:
        params = {k: v for k, v in base.params.model_dump(exclude_none=True).items() if not k.startswith("dflash")}
        render_contract(base, "tiny-moe-2", {**spec.dims, "layers": 2}, params)
    assert "\n" not in str(info.value) and "must be distinct text layers 0..1" in str(info.value)


def test_dims_from_hf_moe_config():
    from ninfer_compile.contracts import dims_from_hf_config

    cfg = {"vocab_size": 320, "hidden_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
           "linear_num_value_heads": 4, "linear_value_head_dim": 24, "linear_conv_kernel_dim": 4,
           "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
           "shared_expert_intermediate_size": 48}
    dims, _, kinds = dims_from_hf_config({"text_config": cfg})
    assert "intermediate" not in dims and kinds == ["gdn", "gdn", "gdn", "attention"]
    assert (dims["experts"], dims["experts_per_token"], dims["expert_intermediate"],
            dims["shared_intermediate"]) == (8, 2, 32, 48)
    with pytest.raises(ContractError, match="moe_intermediate_size"):
        dims_from_hf_config({k: v for k, v in cfg.items() if k != "moe_intermediate_size"})
