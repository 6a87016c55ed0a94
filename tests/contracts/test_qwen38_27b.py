"""graphs/qwen3.8-27b.yaml: NInfer's `groupwise-int` Qwen3.8-27B artifact (reference section 13):
the 27B base inventory with W8G32 vocabulary matrices, plus the optional 66-object DFlash2 suffix."""

from collections import Counter

import pytest

from ninfer_compile.contracts import PART_NAMES, artifact_problems, check_artifact, load_contract

from .conftest import fake_artifact


@pytest.fixture(scope="module")
def base():
    return load_contract("qwen3.8-27b").resolve()


@pytest.fixture(scope="module")
def full():
    return load_contract("qwen3.8-27b").resolve(present=PART_NAMES)


def _formats(spec):
    return Counter(o.format for o in spec.objects.values() if o.kind == "tensor")


def test_counts(base, full):
    assert base.tensor_count == 1118 and full.tensor_count == 1184 and full.resource_count == 6
    # the complete groupwise artifact's format and layout counts (reference section 13)
    assert _formats(full) == {"BF16": 627, "FP32": 96, "I32": 1, "Q4G64_F16S": 183, "Q5G64_F16S": 246,
                              "Q6G64_F16S": 1, "W8G32_F16S": 30}
    layouts = Counter(o.layout for o in full.objects.values() if o.kind == "tensor")
    assert layouts == {"contiguous-le-v1": 724, "row-split-k128-v1": 460}
    dflash2 = Counter(o.format for o in full.objects.values() if o.part == "dflash2")
    assert dflash2 == {"BF16": 45, "W8G32_F16S": 21}


def test_base_is_the_27b_with_w8_vocabulary(base):
    q27 = load_contract("qwen3.6-27b").resolve()
    assert list(base.objects) == list(q27.objects) and base.layer_kinds == q27.layer_kinds
    differ = {n for n in base.objects if base.objects[n] != q27.objects[n]}
    assert differ == {"text/token_embedding", "text/output_head"}
    for n in differ:
        assert base.objects[n].format == "W8G32_F16S" and q27.objects[n].format == "Q6G64_F16S"
        assert base.objects[n].shape == q27.objects[n].shape == (248320, 5120)
    assert {k: v for k, v in base.dims.items() if not k.startswith("dflash2")} == q27.dims
    assert base.views == q27.views


@pytest.mark.parametrize("name, shape, fmt", [
    ("dflash2/feature_projection", (5120, 25600), "W8G32_F16S"),
    ("dflash2/layers/0/attention_conv/base_kernel", (2, 2, 5120), "BF16"),
    ("dflash2/layers/0/attention_conv/kernel_projection", (1280, 5120), "BF16"),
    ("dflash2/layers/4/attention/query_key_value", (6144, 5120), "W8G32_F16S"),
    ("dflash2/layers/4/attention/output", (5120, 4096), "W8G32_F16S"),
    ("dflash2/layers/2/mlp_conv/kernel_projection", (1280, 5120), "BF16"),
    ("dflash2/layers/2/mlp/gate_up", (34816, 5120), "W8G32_F16S"),
    ("dflash2/candidate_selector/hidden_projection", (256, 5120), "BF16"),
    ("dflash2/candidate_selector/successor_codebook", (248320, 256), "BF16"),
])
def test_dflash2_objects(full, name, shape, fmt):
    assert full.objects[name].shape == shape and full.objects[name].format == fmt


def test_dflash2_order_views_aliases(full):
    names = list(full.objects)
    assert names.index("dflash2/feature_projection") == names.index("vision/merger/norm/bias") + 1
    assert names[-4:] == ["dflash2/final_norm", "dflash2/candidate_selector/hidden_projection",
                          "dflash2/candidate_selector/predecessor_codebook",
                          "dflash2/candidate_selector/successor_codebook"]
    qkv = full.views_of("dflash2/layers/3/attention/query_key_value")
    assert {r: (v.row_begin, v.row_count) for r, v in qkv.items()} == {
        "query": (0, 4096), "key": (4096, 1024), "value": (5120, 1024)}
    assert full.aliases["dflash2/output_head"] == "text/output_head"
    assert full.params["dflash_target_layers"] == [5, 19, 33, 47, 61] and full.params["dflash_mask_row"] == 248070


def test_artifacts_with_and_without_dflash2(base, full):
    contract = load_contract("qwen3.8-27b")
    old = fake_artifact(base)  # written before DFlash2: the base objects only
    check_artifact(old, contract.resolve_for(old))
    current = fake_artifact(full)
    check_artifact(current, contract.resolve_for(current))
    partial = fake_artifact(full)
    partial.objects = [o for o in partial.objects if not o.name.startswith("dflash2/layers/4/")]
    problems = artifact_problems(partial, contract.resolve_for(partial))
    assert len(problems) == 12 and all(p.startswith("missing tensor dflash2/layers/4/") for p in problems)
