"""`ninfer-compile pack HF_DIR`: tiny HF checkpoints → artifact → contract check → exact content."""

from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ninfer_compile.artifact import Artifact, quantize_maxabs
from ninfer_compile.contracts import check_artifact, find_contract
from ninfer_compile.convert.hf import convert_state_dict

from .conftest import cli, config_of, copy_ckpt, state_dict_of


def open_checked(path):
    art = Artifact.open(path)
    spec = find_contract(path, art.model_id).resolve_for(art)
    check_artifact(art, spec)
    return art, spec


def expected_objects(ckpt):
    return convert_state_dict(config_of(ckpt), state_dict_of(ckpt))


def assert_bf16_exact(art, spec, expected):
    for name, exp in spec.objects.items():
        if exp.kind == "resource":
            continue
        got = art.load(name)
        want = expected[name]
        assert exp.format in ("BF16", "FP32"), name
        want = want.to(torch.bfloat16 if exp.format == "BF16" else torch.float32)
        assert got.dtype == want.dtype and torch.equal(got, want), name


def test_pack_bf16_exact_and_resources(tiny_ckpt, tmp_path, capsys):
    out = tmp_path / "tiny.ninfer"
    assert cli(["pack", str(tiny_ckpt), "-o", str(out), "--recipe", "bf16", "--no-progress"]) == 0
    assert "wrote" in capsys.readouterr().err
    assert (tmp_path / "tiny.ninfer.contract.yaml").is_file()
    art, spec = open_checked(out)
    assert art.model_id == "hf-qwen3_5-96x4-bf16"
    assert_bf16_exact(art, spec, expected_objects(tiny_ckpt))
    names = [o.name for o in art.objects if o.kind == "resource"]
    # NInfer order, only the files present
    assert names == ["frontend/tokenizer.json", "frontend/tokenizer_config.json", "frontend/chat_template.jinja",
                     "frontend/generation_config.json"]
    for name in names:
        src = tiny_ckpt / name.split("/", 1)[1]
        assert art.resource_bytes(name) == src.read_bytes()
    # tokenizer-addressable ids narrowed from the tokenizer files (max id 252)
    assert spec.params["token_ids"] == 253


def test_pack_default_canonical_quantization(tiny_ckpt, tmp_path):
    out = tmp_path / "tiny_q.ninfer"
    assert cli(["pack", str(tiny_ckpt), "-o", str(out), "--no-progress"]) == 0
    art, spec = open_checked(out)
    assert art.model_id == "hf-qwen3_5-96x4"
    expected = expected_objects(tiny_ckpt)
    formats = {spec.objects[n].format for n in spec.objects if spec.objects[n].kind == "tensor"}
    assert {"Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "BF16", "FP32"} <= formats
    assert spec.objects["text/token_embedding"].format == "Q6G64_F16S"
    assert spec.objects["text/layers/3/attention/gate_value"].format == "Q5G64_F16S"
    for name, exp in spec.objects.items():
        if exp.kind == "resource":
            continue
        src = expected[name]
        if exp.format in ("BF16", "FP32"):
            assert torch.equal(art.load(name), src.to(art.load(name).dtype)), name
            continue
        q = art.load_quantized(name)
        codes, scales = quantize_maxabs(exp.format, src)  # the canonical encoder, bit-exact
        assert torch.equal(q.codes, codes) and torch.equal(q.scales.view(torch.int16), scales.view(torch.int16))
        g = 64 if exp.format != "W8G32_F16S" else 32
        step = q.scales.float().repeat_interleave(g, dim=1)[:, :src.shape[1]]
        err = (q.dequantize() - src.float()).abs()
        assert bool((err <= step * 0.5 + 1e-6).all()), name


def test_pack_sharded_8_layers(tiny8_sharded, tmp_path):
    assert (tiny8_sharded / "model.safetensors.index.json").is_file()
    assert len(list(tiny8_sharded.glob("*.safetensors"))) > 1
    out = tmp_path / "t8.ninfer"
    assert cli(["pack", str(tiny8_sharded), "-o", str(out), "--recipe", "bf16", "--model-id", "t8",
                "--no-progress"]) == 0
    art, spec = open_checked(out)
    assert art.model_id == "t8" and spec.layer_kinds.count("attention") == 2
    assert_bf16_exact(art, spec, expected_objects(tiny8_sharded))


def test_pack_multimodal_naming_with_mtp(tiny_ckpt, tmp_path):
    ckpt = copy_ckpt(tiny_ckpt, tmp_path / "mm")
    sd = load_file(str(ckpt / "model.safetensors"))
    mm = {("model.language_model." + k[6:] if k.startswith("model.") else k): v for k, v in sd.items()}
    for k, v in sd.items():
        if k.startswith("model.layers.3."):
            mm["mtp.layers.0." + k[len("model.layers.3."):]] = v.clone()
    mm["mtp.fc.weight"] = torch.randn(96, 192)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mm[f"mtp.{n}.weight"] = torch.randn(96)
    (ckpt / "model.safetensors").unlink()
    save_file(mm, str(ckpt / "model.safetensors"))
    text = config_of(tiny_ckpt)
    text["model_type"] = "qwen3_5_text"
    text["mtp_num_hidden_layers"] = 1
    (ckpt / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "tie_word_embeddings": False, "text_config": text}))
    out = tmp_path / "mm.ninfer"
    assert cli(["pack", str(ckpt), "-o", str(out), "--recipe", "bf16", "--no-progress"]) == 0
    art, spec = open_checked(out)
    assert spec.parts["mtp"] and spec.objects["mtp/layer/mlp/gate_up"].format == "BF16"
    want = convert_state_dict({"text_config": text}, mm)
    assert_bf16_exact(art, spec, want)
    # the default recipe stores MTP matrices in W8
    out2 = tmp_path / "mm_q.ninfer"
    assert cli(["pack", str(ckpt), "-o", str(out2), "--no-progress"]) == 0
    art2, spec2 = open_checked(out2)
    assert spec2.objects["mtp/layer/attention/query_key_gate_value"].format == "W8G32_F16S"
    assert spec2.objects["mtp/layer/attention/query_key_gate_value"].shape == (2 * 128 + 2 * 64, 96)


def test_draft_head_from_ranking(tiny_ckpt, tmp_path):
    counts = np.random.default_rng(3).integers(0, 1000, size=256).astype("<i8")
    ranking = tmp_path / "rank.i64"
    ranking.write_bytes(counts.tobytes())
    out = tmp_path / "d.ninfer"
    assert cli(["pack", str(tiny_ckpt), "-o", str(out), "--recipe", "bf16", "--draft-ranking", str(ranking),
                "--draft-rows", "64", "--no-progress"]) == 0
    art, spec = open_checked(out)
    ids = art.load("text/draft_head_token_ids")
    assert ids.dtype == torch.int32 and ids.shape == (64,) and len(set(ids.tolist())) == 64
    assert {250, 251} <= set(ids.tolist())  # special ids are forced in
    assert torch.equal(art.load("text/draft_head"), art.load("text/output_head")[ids.long()])


def err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_missing_config_field(tiny_ckpt, tmp_path, capsys):
    ckpt = copy_ckpt(tiny_ckpt, tmp_path / "c")
    cfg = config_of(ckpt)
    del cfg["hidden_size"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert cli(["pack", str(ckpt), "-o", str(tmp_path / "x.ninfer")]) == 2
    line = err_line(capsys)
    assert "config.json" in line and "hidden_size" in line
    assert not (tmp_path / "x.ninfer").exists()


def test_missing_tensor(tiny_ckpt, tmp_path, capsys):
    ckpt = copy_ckpt(tiny_ckpt, tmp_path / "m")
    sd = load_file(str(ckpt / "model.safetensors"))
    del sd["model.layers.1.linear_attn.in_proj_z.weight"]
    save_file(sd, str(ckpt / "model.safetensors"))
    assert cli(["pack", str(ckpt), "-o", str(tmp_path / "x.ninfer")]) == 2
    assert "model.layers.1.linear_attn.in_proj_z.weight" in err_line(capsys)
    assert not (tmp_path / "x.ninfer").exists()


def test_bad_architecture_and_refusals(tiny_ckpt, tmp_path, capsys):
    ckpt = copy_ckpt(tiny_ckpt, tmp_path / "a")
    cfg = config_of(ckpt)
    (ckpt / "config.json").write_text(json.dumps(dict(cfg, model_type="llama", architectures=["LlamaForCausalLM"])))
    assert cli(["pack", str(ckpt), "-o", str(tmp_path / "x.ninfer")]) == 2
    assert "llama" in err_line(capsys)
    # a registered model id keeps its recipe
    assert cli(["pack", str(tiny_ckpt), "-o", str(tmp_path / "x.ninfer"), "--model-id", "qwen3.6-27b",
                "--recipe", "bf16"]) == 2
    assert "--model-id" in err_line(capsys)
    # the registered 27B contract requires the draft head, which needs a ranking file
    assert cli(["pack", str(tiny_ckpt), "-o", str(tmp_path / "x.ninfer"), "--model-id", "qwen3.6-27b"]) == 2
    assert "--draft-ranking" in err_line(capsys)


def test_shape_mismatch_against_contract(tiny_ckpt, tiny8_sharded, tmp_path, capsys):
    out = tmp_path / "t.ninfer"
    assert cli(["pack", str(tiny_ckpt), "-o", str(out), "--recipe", "bf16", "--no-progress"]) == 0
    contract = tmp_path / "t.ninfer.contract.yaml"
    capsys.readouterr()
    assert cli(["pack", str(tiny8_sharded), "-o", str(tmp_path / "y.ninfer"), "--contract", str(contract)]) == 2
    line = err_line(capsys)
    assert "contract" in line and "expects" in line


def test_registered_tiny_contract(tiny_ckpt, tmp_path, capsys):
    """tiny-qwen3.5 in graphs/ has exactly these dims: no contract is written beside."""
    out = tmp_path / "r.ninfer"
    assert cli(["pack", str(tiny_ckpt), "-o", str(out), "--model-id", "tiny-qwen3.5", "--no-progress"]) == 0
    assert "frontend resources not packed" in capsys.readouterr().err  # optional, all or nothing
    assert not (tmp_path / "r.ninfer.contract.yaml").exists()
    art, spec = open_checked(out)
    assert art.model_id == "tiny-qwen3.5" and not spec.parts["frontend"]


def test_full_product_image_tiny(full_mm_ckpt, tmp_path, capsys):
    """Every part (text, draft head, MTP, vision, six resources) against graphs/tiny-qwen3.6-full."""
    counts = np.random.default_rng(9).integers(0, 10**6, size=384).astype("<i8")
    ranking = tmp_path / "rank.i64"
    ranking.write_bytes(counts.tobytes())
    out = tmp_path / "full.ninfer"
    args = ["pack", str(full_mm_ckpt), "-o", str(out), "--model-id", "tiny-qwen3.6-full", "--no-progress"]
    assert cli(args) == 2
    assert "--draft-ranking" in err_line(capsys)
    assert cli(args + ["--draft-ranking", str(ranking)]) == 0
    art, spec = open_checked(out)
    assert all(spec.parts.values()) and len(art.objects) == len(spec.objects)
    assert [o.name for o in art.objects][:6] == [f"frontend/{f}" for f in (
        "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
        "preprocessor_config.json", "video_preprocessor_config.json")]
    sd = state_dict_of(full_mm_ckpt)
    # vision: patch embedding reshaped [48, 3*2*4*4], quantized Q6; merger W8
    q = art.load_quantized("vision/patch_embedding")
    assert q.format == "Q6G64_F16S"
    codes, scales = quantize_maxabs("Q6G64_F16S", sd["model.visual.patch_embed.proj.weight"].reshape(48, -1))
    assert torch.equal(q.codes, codes)
    assert spec.objects["vision/merger/fc1"].format == "W8G32_F16S"
    assert torch.equal(art.load("vision/layers/1/norm2/bias"),
                       sd["model.visual.blocks.1.norm2.bias"].to(torch.bfloat16))
    ids = art.load("text/draft_head_token_ids")
    assert ids.shape == (96,) and int(ids.max()) < 370
    # a generated contract for the same checkpoint keeps vision + MTP + frontend, no draft head
    out2 = tmp_path / "gen.ninfer"
    assert cli(["pack", str(full_mm_ckpt), "-o", str(out2), "--recipe", "bf16", "--no-progress"]) == 0
    art2, spec2 = open_checked(out2)
    assert spec2.parts["vision"] and spec2.parts["mtp"] and spec2.parts["frontend"]
    assert not spec2.parts["draft_head"]
    assert {k: v for k, v in spec2.dims.items() if k.startswith("vision")} == \
        {k: v for k, v in spec.dims.items() if k.startswith("vision")}
    assert len(art2.objects) == len(art.objects) - 2
