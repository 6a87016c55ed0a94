"""graphs/qwen3.6-27b.yaml is the exact NInfer inventory (artifact reference sections 4-9)."""

from collections import Counter

import pytest

from ninfer_compile.contracts import load_contract


@pytest.fixture(scope="module")
def spec():
    return load_contract("qwen3.6-27b").resolve()


def test_counts(spec):
    assert spec.tensor_count == 1118 and spec.resource_count == 6
    formats = Counter(o.format for o in spec.objects.values() if o.kind == "tensor")
    assert formats == {"BF16": 582, "FP32": 96, "I32": 1, "Q4G64_F16S": 183, "Q5G64_F16S": 246,
                       "Q6G64_F16S": 3, "W8G32_F16S": 7}
    by_part = Counter(o.part for o in spec.objects.values() if o.kind == "tensor")
    assert by_part == {"text": 771, "draft_head": 2, "mtp": 12, "vision": 333}
    layouts = Counter(o.layout for o in spec.objects.values() if o.kind == "tensor")
    assert layouts == {"contiguous-le-v1": 679, "row-split-k128-v1": 439}
    # per-part format table (section 9.2)
    text_formats = Counter(o.format for o in spec.objects.values() if o.part == "text")
    assert text_formats == {"BF16": 353, "FP32": 96, "Q4G64_F16S": 128, "Q5G64_F16S": 192, "Q6G64_F16S": 2}
    vision_formats = Counter(o.format for o in spec.objects.values() if o.part == "vision")
    assert vision_formats == {"BF16": 222, "Q4G64_F16S": 54, "Q5G64_F16S": 54, "Q6G64_F16S": 1, "W8G32_F16S": 2}


def test_layer_pattern_and_params(spec):
    attention = [l for l, k in enumerate(spec.layer_kinds) if k == "attention"]
    assert attention == list(range(3, 64, 4))
    assert spec.layer_kinds.count("gdn") == 48
    assert spec.params["mrope_section"] == [11, 11, 10] and spec.params["mrope_interleaved"] is True
    assert spec.params["rope_theta"] == 1e7 and spec.params["rms_eps"] == 1e-6
    assert spec.params["token_ids"] == 248077 and spec.params["partial_rotary_factor"] == 0.25
    assert all(spec.parts.values())


def test_writer_order(spec):
    names = list(spec.objects)
    assert names[:7] == [
        "frontend/tokenizer.json", "frontend/tokenizer_config.json", "frontend/chat_template.jinja",
        "frontend/generation_config.json", "frontend/preprocessor_config.json",
        "frontend/video_preprocessor_config.json", "text/token_embedding"]
    gdn0 = [n.removeprefix("text/layers/0/") for n in names[7:20]]
    assert gdn0 == ["input_norm", "gdn/a_log", "gdn/dt_bias", "gdn/convolution", "gdn/a_projection",
                    "gdn/b_projection", "gdn/query_key", "gdn/value_z", "gdn/norm", "gdn/output",
                    "post_attention_norm", "mlp/gate_up", "mlp/down"]
    start = names.index("text/layers/3/input_norm")
    assert [n.removeprefix("text/layers/3/") for n in names[start:start + 9]] == [
        "input_norm", "attention/query_key", "attention/gate_value", "attention/query_norm",
        "attention/key_norm", "attention/output", "post_attention_norm", "mlp/gate_up", "mlp/down"]
    assert names[start - 1] == "text/layers/2/mlp/down" and names[start + 9] == "text/layers/4/input_norm"
    last_layer = names.index("text/layers/63/mlp/down")
    assert names[last_layer + 1:last_layer + 5] == ["text/final_norm", "text/output_head", "text/draft_head",
                                                    "text/draft_head_token_ids"]
    assert names[last_layer + 5] == "mtp/input_projection" and names[last_layer + 16] == "mtp/final_norm"
    assert names[last_layer + 17:last_layer + 21] == ["vision/patch_embedding", "vision/patch_embedding_bias",
                                                      "vision/position_embedding", "vision/layers/0/attention/qkv"]
    assert names[-7] == "vision/layers/26/norm2/bias" and names[-1] == "vision/merger/norm/bias"
    assert len(names) == 1124


@pytest.mark.parametrize("name, shape, fmt", [
    ("text/token_embedding", (248320, 5120), "Q6G64_F16S"),
    ("text/layers/3/attention/query_key", (7168, 5120), "Q4G64_F16S"),
    ("text/layers/63/attention/gate_value", (7168, 5120), "Q5G64_F16S"),
    ("text/layers/3/attention/output", (5120, 6144), "Q5G64_F16S"),
    ("text/layers/3/attention/query_norm", (256,), "BF16"),
    ("text/layers/0/gdn/a_log", (48,), "FP32"),
    ("text/layers/62/gdn/dt_bias", (48,), "FP32"),
    ("text/layers/0/gdn/convolution", (4, 10240), "BF16"),
    ("text/layers/0/gdn/a_projection", (48, 5120), "BF16"),
    ("text/layers/0/gdn/query_key", (4096, 5120), "Q4G64_F16S"),
    ("text/layers/0/gdn/value_z", (12288, 5120), "Q5G64_F16S"),
    ("text/layers/0/gdn/norm", (128,), "BF16"),
    ("text/layers/0/gdn/output", (5120, 6144), "Q5G64_F16S"),
    ("text/layers/0/mlp/gate_up", (34816, 5120), "Q4G64_F16S"),
    ("text/layers/0/mlp/down", (5120, 17408), "Q5G64_F16S"),
    ("text/output_head", (248320, 5120), "Q6G64_F16S"),
    ("text/draft_head", (131072, 5120), "Q4G64_F16S"),
    ("text/draft_head_token_ids", (131072,), "I32"),
    ("mtp/input_projection", (5120, 10240), "W8G32_F16S"),
    ("mtp/layer/attention/query_key_gate_value", (14336, 5120), "W8G32_F16S"),
    ("mtp/layer/mlp/down", (5120, 17408), "W8G32_F16S"),
    ("mtp/final_norm", (5120,), "BF16"),
    ("vision/patch_embedding", (1152, 1536), "Q6G64_F16S"),
    ("vision/position_embedding", (2304, 1152), "BF16"),
    ("vision/layers/26/attention/qkv", (3456, 1152), "Q4G64_F16S"),
    ("vision/layers/0/mlp/fc2", (1152, 4304), "Q5G64_F16S"),
    ("vision/layers/0/mlp/fc1_bias", (4304,), "BF16"),
    ("vision/merger/fc1", (4608, 4608), "W8G32_F16S"),
    ("vision/merger/fc2", (5120, 4608), "W8G32_F16S"),
    ("vision/merger/norm/weight", (1152,), "BF16"),
])
def test_shapes_and_formats(spec, name, shape, fmt):
    obj = spec.objects[name]
    assert (obj.kind, obj.shape, obj.format) == ("tensor", shape, fmt)


def test_resources(spec):
    resources = [o for o in spec.objects.values() if o.kind == "resource"]
    assert all(o.part == "frontend" and o.shape is None and o.format is None for o in resources)


def test_views(spec):
    def rows(parent, role):
        v = spec.views[(parent, role)]
        return v.row_begin, v.row_count, v.shape

    qk = "text/layers/3/attention/query_key"
    assert rows(qk, "query") == (0, 6144, (6144, 5120))
    assert rows(qk, "key") == (6144, 1024, (1024, 5120))
    assert rows("text/layers/7/attention/gate_value", "gate") == (0, 6144, (6144, 5120))
    assert rows("text/layers/0/gdn/query_key", "key") == (2048, 2048, (2048, 5120))
    assert rows("text/layers/0/gdn/value_z", "z") == (6144, 6144, (6144, 5120))
    assert rows("text/layers/5/mlp/gate_up", "up") == (17408, 17408, (17408, 5120))
    mtp = "mtp/layer/attention/query_key_gate_value"
    assert [(v.role, v.row_begin, v.row_count) for v in spec.views_of(mtp).values()] == [
        ("query", 0, 6144), ("key", 6144, 1024), ("gate", 7168, 6144), ("value", 13312, 1024)]
    assert rows("mtp/layer/mlp/gate_up", "gate") == (0, 17408, (17408, 5120))
    assert ("text/layers/3/gdn/query_key", "query") not in spec.views  # layer 3 is attention
    assert len(spec.views) == 16 * 4 + 48 * 4 + 64 * 2 + 4 + 2


def test_aliases(spec):
    assert spec.aliases == {
        "mtp/token_embedding": "text/token_embedding",
        "mtp/output_head": "text/output_head",
        "mtp/draft_head": "text/draft_head",
        "mtp/draft_head_token_ids": "text/draft_head_token_ids",
    }


def test_text_layer_objects(spec):
    gdn = spec.text_layer_objects(0)
    assert len(gdn) == 13 and gdn["gdn/value_z"] == "text/layers/0/gdn/value_z"
    attention = spec.text_layer_objects(63)
    assert len(attention) == 9 and attention["attention/query_key"] == "text/layers/63/attention/query_key"
    with pytest.raises(Exception, match="no text layer 64"):
        spec.text_layer_objects(64)


def test_spec_is_frozen(spec):
    with pytest.raises(Exception):
        spec.model_id = "other"
    with pytest.raises(Exception):
        spec.objects["text/final_norm"].shape = (1,)
