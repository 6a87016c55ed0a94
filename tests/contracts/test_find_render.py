"""find_contract's search order; render_contract / write_contract round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ninfer_compile.contracts import (
    CONTRACT_SUFFIX, GRAPHS_DIR, attention_interval, find_contract, load_contract, parse_contract,
    render_contract, write_contract,
)
from ninfer_compile.errors import ContractError

from .tiny_definitions import TINY_TEXT_DIMS

PARAMS = dict(rms_eps=1e-6, rope_theta=10000.0, partial_rotary_factor=0.25, token_ids=256)
TEXT_ONLY = dict(mtp="absent", draft_head="absent", vision="absent", frontend="absent")


def test_find_contract_order(tmp_path):
    artifact = tmp_path / "m.ninfer"
    explicit = tmp_path / "explicit.yaml"
    explicit.write_text(render_contract("tiny-qwen3.5", "my-model", TINY_TEXT_DIMS, PARAMS), encoding="utf-8")
    beside = Path(str(artifact) + CONTRACT_SUFFIX)
    beside.write_text(render_contract("tiny-qwen3.5", "beside-model", TINY_TEXT_DIMS, PARAMS), encoding="utf-8")

    # 1. --contract wins, whatever the model id
    assert find_contract(artifact, "tiny-qwen3.5", explicit).model_id == "my-model"
    # 2. graphs/<model_id>.yaml before the file beside the artifact
    found = find_contract(artifact, "tiny-qwen3.5", None)
    assert found.model_id == "tiny-qwen3.5" and found.source == str(Path(GRAPHS_DIR) / "tiny-qwen3.5.yaml")
    # 3. <artifact>.contract.yaml
    found = find_contract(artifact, "beside-model", None)
    assert found.model_id == "beside-model" and found.source == str(beside)
    # none: the error names every place looked
    beside.unlink()
    with pytest.raises(ContractError) as info:
        find_contract(artifact, "beside-model", None)
    message = str(info.value)
    assert str(Path(GRAPHS_DIR) / "beside-model.yaml") in message and str(beside) in message
    assert "--contract" in message
    with pytest.raises(ContractError, match="does not exist"):
        find_contract(artifact, "tiny-qwen3.5", tmp_path / "nope.yaml")
    # a model id is never used as a path
    with pytest.raises(ContractError, match="looked for"):
        find_contract(artifact, "../graphs/qwen3.6-27b", None)


def test_load_contract_by_id_checks_model_id(tmp_path, monkeypatch):
    import ninfer_compile.contracts.loader as loader

    (tmp_path / "alias.yaml").write_text(render_contract("tiny-qwen3.5", "other", TINY_TEXT_DIMS, PARAMS))
    monkeypatch.setattr(loader, "GRAPHS_DIR", tmp_path)
    with pytest.raises(ContractError, match=r"alias.yaml:\d+: model_id: 'other' in a file named for 'alias'"):
        load_contract("alias")
    with pytest.raises(ContractError, match="no contract for model id 'missing'"):
        load_contract("missing")


def test_render_round_trip(tmp_path):
    dims = dict(TINY_TEXT_DIMS, hidden=64, layers=6, intermediate=96, full_attention_interval=3)
    text = render_contract("qwen3.6-27b", "new-model", dims, PARAMS,
                           formats_override={"mlp_down": "W8G32_F16S", "token_embedding": "BF16"},
                           parts=dict(TEXT_ONLY, frontend="optional"))
    contract = parse_contract(text, "<t>")
    again = parse_contract(render_contract(contract, "new-model", dims, PARAMS), "<t2>")
    assert contract.model_dump() == again.model_dump()

    path = tmp_path / ("m.ninfer" + CONTRACT_SUFFIX)
    written = write_contract(path, "qwen3.6-27b", "new-model", dims, PARAMS,
                             {"mlp_down": "W8G32_F16S", "token_embedding": "BF16"}, dict(TEXT_ONLY, frontend="optional"))
    assert written.model_dump() == contract.model_dump() and written.source == str(path)
    assert path.read_text() == text

    spec = written.resolve()
    assert spec.layer_kinds == ["gdn", "gdn", "attention"] * 2
    assert spec.objects["text/layers/0/mlp/down"].format == "W8G32_F16S"
    assert spec.objects["text/token_embedding"].format == "BF16"
    assert spec.objects["text/layers/0/mlp/gate_up"].shape == (192, 64)
    # everything that only served absent parts is gone from the file
    data = yaml.safe_load(text)
    assert {s["part"] for s in data["inventory"]} == {"text", "frontend"}
    assert "aliases" not in data and all(not v["parent"].startswith("mtp/") for v in data["views"])
    assert not any(role.startswith(("mtp_", "vision_", "draft_")) for role in data["formats"])


def test_render_layer_kinds():
    kinds = ["attention", "gdn", "gdn", "attention"]
    dims = {k: v for k, v in TINY_TEXT_DIMS.items() if k != "full_attention_interval"}
    text = render_contract("tiny-qwen3.5", "irregular", dims, PARAMS, layer_kinds=kinds)
    assert yaml.safe_load(text)["layers"] == {"count": "layers", "kinds": kinds}
    assert parse_contract(text).resolve().layer_kinds == kinds

    regular = ["gdn", "attention"] * 2
    text = render_contract("tiny-qwen3.5", "every2", dict(dims, full_attention_interval=2), PARAMS, layer_kinds=regular)
    assert yaml.safe_load(text)["layers"] == {"count": "layers", "attention_every": "full_attention_interval"}
    text = render_contract("tiny-qwen3.5", "every2", dims, PARAMS, layer_kinds=regular)
    assert yaml.safe_load(text)["layers"] == {"count": "layers", "attention_every": 2}
    assert parse_contract(text).resolve().layer_kinds == regular


def test_render_errors():
    with pytest.raises(ContractError, match="format override for unknown role 'mtp_matrix'"):
        render_contract("tiny-qwen3.5", "x", TINY_TEXT_DIMS, PARAMS, formats_override={"mtp_matrix": "BF16"})
    with pytest.raises(ContractError, match="missing dimension"):  # vision required but no vision dims
        render_contract("qwen3.6-27b", "x", TINY_TEXT_DIMS, PARAMS, parts=dict(TEXT_ONLY, vision="required"))
    with pytest.raises(ContractError, match="unknown part"):
        render_contract("tiny-qwen3.5", "x", TINY_TEXT_DIMS, PARAMS, parts={"audio": "required"})


@pytest.mark.parametrize("kinds, every", [
    (["gdn", "gdn", "gdn", "attention"], 4), (["attention"] * 3, 1), (["gdn"] * 3, None),
    (["attention", "gdn"], None), (["gdn", "gdn", "attention", "gdn"], 3), (["gdn", "attention", "attention"], None),
])
def test_attention_interval(kinds, every):
    assert attention_interval(kinds) == every
