"""`ninfer-compile pack` of Hugging Face `qwen3_5_moe` checkpoints: per-expert (as `save_pretrained`
writes them) and fused (as the official checkpoint stores them) expert names, the `bf16` and
`default` recipes, a rendered contract and the registered `tiny-moe` one (with its per-layer
routed-down exception)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer_compile.artifact import Artifact, quantize_maxabs
from ninfer_compile.contracts import check_artifact, find_contract, load_contract
from ninfer_compile.convert.hf import convert_state_dict
from tests.reference.hf_tiny_moe import make_hf_moe_model, per_expert, random_moe_mtp

from .conftest import FRONTEND, cli


def _write(path, config: dict, tensors: dict, frontend: bool = True):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    if frontend:
        for name, data in FRONTEND.items():
            (path / name).write_bytes(data)
    return path


@pytest.fixture(scope="module")
def moe_model():
    return make_hf_moe_model(seed=2)


@pytest.fixture(scope="module")
def fused_sd(moe_model):
    """The in-memory state dict (fused expert banks) plus MoE MTP tensors."""
    sd = {k: v.detach().to(torch.bfloat16) for k, v in moe_model.state_dict().items()}
    sd.update({k: v.to(torch.bfloat16) for k, v in random_moe_mtp(moe_model.config).items()})
    return sd


@pytest.fixture(scope="module")
def text_config(moe_model):
    cfg = moe_model.config.to_dict()
    cfg["mtp_num_hidden_layers"] = 1
    return cfg


@pytest.fixture(scope="module")
def per_expert_ckpt(moe_model, fused_sd, text_config, tmp_path_factory):
    """A text-only checkpoint as `save_pretrained` writes it (one tensor per expert projection)."""
    d = tmp_path_factory.mktemp("moe") / "per_expert"
    moe_model.save_pretrained(d)
    saved = load_file(str(d / "model.safetensors"))
    assert "model.layers.0.mlp.experts.7.down_proj.weight" in saved  # transformers' saved names
    tensors = {**saved, **per_expert({k: v for k, v in fused_sd.items() if k.startswith("mtp.")})}
    (d / "model.safetensors").unlink()
    return _write(d.parent / "per_expert_mtp", text_config, tensors)


@pytest.fixture(scope="module")
def fused_multimodal_ckpt(fused_sd, text_config, tmp_path_factory):
    """The official layout: `model.language_model.*` names, fused expert banks, a text_config."""
    tensors = {("model.language_model." + k[6:] if k.startswith("model.") else k): v for k, v in fused_sd.items()}
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
              "tie_word_embeddings": False, "text_config": {**text_config, "model_type": "qwen3_5_moe_text"}}
    return _write(tmp_path_factory.mktemp("moe") / "fused", config, tensors)


def _open_checked(path):
    art = Artifact.open(path)
    spec = find_contract(path, art.model_id).resolve_for(art)
    check_artifact(art, spec)
    return art, spec


def test_pack_bf16_exact_from_per_expert_names(per_expert_ckpt, fused_sd, text_config, tmp_path):
    out = tmp_path / "moe-bf16.ninfer"
    assert cli(["pack", str(per_expert_ckpt), "-o", str(out), "--recipe", "bf16", "--no-progress"]) == 0
    art, spec = _open_checked(out)
    assert art.model_id == "hf-qwen3_5_moe-96x4-bf16" and spec.family == "qwen3_5_moe"
    assert spec.parts == {"text": True, "mtp": True, "draft_head": False, "vision": False,
                          "frontend": True, "dflash": False}
    # the fused in-memory banks and the per-expert files give the same objects
    want = convert_state_dict(text_config, fused_sd)
    assert set(want) == {n for n, o in spec.objects.items() if o.kind == "tensor"}
    for name, exp in spec.objects.items():
        if exp.kind == "tensor":
            dtype = torch.bfloat16 if exp.format == "BF16" else torch.float32
            assert exp.format in ("BF16", "FP32") and torch.equal(art.load(name), want[name].to(dtype)), name
    # the bank layout, row by row, against the per-expert source tensors
    src = load_file(str(per_expert_ckpt / "model.safetensors"))
    for prefix, source in (("text/layers/1", "model.layers.1."), ("mtp/layer", "mtp.layers.0.")):
        gate_up, down = art.load(f"{prefix}/moe/routed_gate_up"), art.load(f"{prefix}/moe/routed_down")
        gu_bank, down_bank = spec.expert_banks[f"{prefix}/moe/routed_gate_up"], spec.expert_banks[f"{prefix}/moe/routed_down"]
        for e in (0, 5, 7):
            for role in ("gate", "up"):
                rows = [gu_bank.row(e, role, r) for r in range(32)]
                assert torch.equal(gate_up[rows], src[f"{source}mlp.experts.{e}.{role}_proj.weight"])
            rows = [down_bank.row(e, "down", h) for h in range(96)]
            assert torch.equal(down[rows], src[f"{source}mlp.experts.{e}.down_proj.weight"])
        router = art.load(f"{prefix}/moe/router_shared_gate")
        assert torch.equal(router[:8], src[f"{source}mlp.gate.weight"])
        assert torch.equal(router[8:], src[f"{source}mlp.shared_expert_gate.weight"])


def test_pack_default_rendered_contract(per_expert_ckpt, fused_sd, text_config, tmp_path):
    out = tmp_path / "moe-q.ninfer"
    assert cli(["pack", str(per_expert_ckpt), "-o", str(out), "--no-progress"]) == 0
    art, spec = _open_checked(out)
    assert art.model_id == "hf-qwen3_5_moe-96x4"
    rendered = load_contract(str(out) + ".contract.yaml")
    assert rendered.part_status()["dflash"] == "absent"
    assert "layer_roles" not in (tmp_path / "moe-q.ninfer.contract.yaml").read_text()
    fmt = {n: o.format for n, o in spec.objects.items() if o.kind == "tensor"}
    assert fmt["text/token_embedding"] == "W8G32_F16S" and fmt["text/output_head"] == "Q6G64_F16S"
    assert {fmt[f"text/layers/{l}/moe/routed_down"] for l in range(4)} == {"Q5G64_F16S"}
    assert fmt["text/layers/0/moe/routed_gate_up"] == "Q4G64_F16S"
    assert fmt["text/layers/0/moe/router_shared_gate"] == "BF16"
    assert fmt["mtp/layer/moe/routed_gate_up"] == fmt["mtp/layer/moe/routed_down"] == "W8G32_F16S"
    want = convert_state_dict(text_config, fused_sd)
    for name in ("text/layers/1/moe/routed_gate_up", "text/layers/2/moe/routed_down",
                 "text/layers/0/gdn/query_key_value_z", "mtp/layer/moe/routed_down"):
        q = art.load_quantized(name)
        codes, scales = quantize_maxabs(fmt[name], want[name])  # the canonical encoder, bit-exact
        assert torch.equal(q.codes, codes) and torch.equal(q.scales.view(torch.int16), scales.view(torch.int16))


def test_pack_registered_tiny_moe_with_layer_roles(fused_multimodal_ckpt, per_expert_ckpt, tmp_path):
    """The official fused layout under the registered contract: routed down Q6 on layers 0 and 3."""
    out = tmp_path / "tiny-moe.ninfer"
    assert cli(["pack", str(fused_multimodal_ckpt), "-o", str(out), "--model-id", "tiny-moe",
                "--no-progress"]) == 0
    art, spec = _open_checked(out)
    assert art.model_id == "tiny-moe" and not (tmp_path / "tiny-moe.ninfer.contract.yaml").exists()
    down = {l: spec.objects[f"text/layers/{l}/moe/routed_down"].format for l in range(4)}
    assert down == {0: "Q6G64_F16S", 1: "Q5G64_F16S", 2: "Q5G64_F16S", 3: "Q6G64_F16S"}
    assert all(o.format == f for o, f in ((art.by_name[n], spec.objects[n].format) for n in spec.objects
                                          if spec.objects[n].kind == "tensor"))
    # the per-expert checkpoint packs to the same bytes
    other = tmp_path / "tiny-moe-2.ninfer"
    assert cli(["pack", str(per_expert_ckpt), "-o", str(other), "--model-id", "tiny-moe", "--no-progress"]) == 0
    with Artifact.open(other) as art2:
        for name in ("text/layers/3/moe/routed_down", "text/layers/0/moe/routed_gate_up", "text/output_head"):
            assert torch.equal(art.load_quantized(name).codes, art2.load_quantized(name).codes), name


def test_missing_expert_is_one_line(per_expert_ckpt, tmp_path, capsys):
    tensors = load_file(str(per_expert_ckpt / "model.safetensors"))
    del tensors["model.layers.2.mlp.experts.6.up_proj.weight"]
    config = json.loads((per_expert_ckpt / "config.json").read_text())
    bad = _write(tmp_path / "bad", config, tensors, frontend=False)
    assert cli(["pack", str(bad), "-o", str(tmp_path / "bad.ninfer"), "--no-progress"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.layers.2.mlp.experts.6.up_proj.weight" in err[0]
    assert "text/layers/2/moe/routed_gate_up" in err[0]


def _dflash_dir(path, hidden=96, layers=2, heads=4, kv_heads=2, head_dim=16, inter=64, features=2):
    g = torch.Generator().manual_seed(11)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)
    tensors = {"fc.weight": t(hidden, features * hidden), "hidden_norm.weight": t(hidden), "norm.weight": t(hidden)}
    for l in range(layers):
        s = f"layers.{l}."
        tensors.update({
            s + "input_layernorm.weight": t(hidden), s + "post_attention_layernorm.weight": t(hidden),
            s + "self_attn.q_proj.weight": t(heads * head_dim, hidden),
            s + "self_attn.k_proj.weight": t(kv_heads * head_dim, hidden),
            s + "self_attn.v_proj.weight": t(kv_heads * head_dim, hidden),
            s + "self_attn.o_proj.weight": t(hidden, heads * head_dim),
            s + "self_attn.q_norm.weight": t(head_dim), s + "self_attn.k_norm.weight": t(head_dim),
            s + "mlp.gate_proj.weight": t(inter, hidden), s + "mlp.up_proj.weight": t(inter, hidden),
            s + "mlp.down_proj.weight": t(hidden, inter)})
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    return path, tensors


def test_pack_with_the_dflash_companion(fused_multimodal_ckpt, per_expert_ckpt, tmp_path, capsys):
    dflash, src = _dflash_dir(tmp_path / "dflash")
    out = tmp_path / "tiny-moe-dflash.ninfer"
    assert cli(["pack", str(fused_multimodal_ckpt), "-o", str(out), "--model-id", "tiny-moe",
                "--dflash", str(dflash), "--no-progress"]) == 0
    art, spec = _open_checked(out)
    assert spec.parts["dflash"] and sum(o.part == "dflash" for o in spec.objects.values()) == 19
    names = [o.name for o in art.objects]
    assert names[-19] == "dflash/feature_projection" and names[-1] == "dflash/final_norm"
    assert torch.equal(art.load("dflash/layers/1/attention/query_norm"), src["layers.1.self_attn.q_norm.weight"])
    qkv = torch.cat([src[f"layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    codes, _ = quantize_maxabs("W8G32_F16S", qkv)
    assert torch.equal(art.load_quantized("dflash/layers/1/attention/query_key_value").codes, codes)
    # a contract without the part refuses --dflash; a missing companion tensor is one line
    capsys.readouterr()
    assert cli(["pack", str(per_expert_ckpt), "-o", str(tmp_path / "x.ninfer"), "--dflash", str(dflash),
                "--no-progress"]) != 0
    assert "--dflash: contract hf-qwen3_5_moe-96x4 has no dflash part" in capsys.readouterr().err
    (dflash / "model.safetensors").unlink()
    save_file({k: v for k, v in src.items() if k != "layers.0.mlp.up_proj.weight"}, str(dflash / "model.safetensors"))
    assert cli(["pack", str(fused_multimodal_ckpt), "-o", str(tmp_path / "y.ninfer"), "--model-id", "tiny-moe",
                "--dflash", str(dflash), "--no-progress"]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning:")]
    assert len(err) == 1 and "layers.0.mlp.up_proj.weight" in err[0] and "dflash/layers/0/mlp/gate_up" in err[0]
