"""Tiny Hugging Face Qwen3.5 checkpoints (random weights, CPU) for converter tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

TINY = dict(vocab_size=256, hidden_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, linear_num_key_heads=2, linear_key_head_dim=16, linear_num_value_heads=4,
            linear_value_head_dim=24, intermediate_size=160)
TINY8 = dict(TINY, hidden_size=160, num_hidden_layers=8)

FRONTEND = {
    "tokenizer.json": b'{"version":"1.0","model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":249},"merges":[]},'
                      b'"added_tokens":[{"id":250,"content":"<|im_end|>","special":true}]}\n',
    "tokenizer_config.json": b'{"added_tokens_decoder":{"251":{"content":"<x>","special":true},'
                             b'"252":{"content":"y","special":false}}}',
    "chat_template.jinja": "{{ messages }} \u00e9\n".encode(),
}


def make_model(config: dict, seed: int = 0):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**config))
    # HF initialises norms to 0/1 and dt_bias to 1: make every tensor distinctive.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "dt_bias" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    return model


def save_checkpoint(path: Path, config: dict, *, seed: int = 0, frontend: bool = True, **save_kwargs) -> Path:
    model = make_model(config, seed)
    model.save_pretrained(path, **save_kwargs)
    if frontend:
        for name, data in FRONTEND.items():
            (path / name).write_bytes(data)
    return path


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("hf") / "tiny", TINY)


@pytest.fixture(scope="session")
def tiny8_sharded(tmp_path_factory) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("hf") / "tiny8", TINY8, seed=1, max_shard_size="100KB")


def copy_ckpt(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def state_dict_of(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def config_of(ckpt: Path) -> dict:
    return json.loads((ckpt / "config.json").read_text())


def cli(argv: list[str]) -> int:
    """The real entry point: `ninfer_compile.cli.main(argv)`."""
    from ninfer_compile.cli import main

    return main(argv)


FULL_TEXT = dict(vocab_size=384, hidden_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=1,
                 head_dim=32, linear_num_key_heads=2, linear_key_head_dim=32, linear_num_value_heads=6,
                 linear_value_head_dim=24, intermediate_size=192, mtp_num_hidden_layers=1,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                  "mrope_section": [2, 1, 1], "mrope_interleaved": True})
FULL_VISION = dict(depth=2, hidden_size=48, intermediate_size=80, num_heads=4, patch_size=4, temporal_patch_size=2,
                   in_channels=3, spatial_merge_size=2, out_hidden_size=128, num_position_embeddings=64)


@pytest.fixture(scope="session")
def full_mm_ckpt(tmp_path_factory) -> Path:
    """A multimodal Qwen3_5ForConditionalGeneration matching graphs/tiny-qwen3.6-full.yaml, plus an
    MTP layer (HF does not model it; tensors added under `mtp.*`) and all six frontend files."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(5)
    path = tmp_path_factory.mktemp("hf") / "full"
    Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=FULL_TEXT, vision_config=FULL_VISION)) \
        .save_pretrained(path)
    sd = load_file(str(path / "model.safetensors"))
    p = "model.language_model.layers.3."
    for k, v in list(sd.items()):
        if k.startswith(p):
            sd["mtp.layers.0." + k[len(p):]] = torch.randn_like(v) * 0.05
    sd["mtp.fc.weight"] = torch.randn(128, 256) * 0.05
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        sd[f"mtp.{n}.weight"] = torch.randn(128) * 0.1
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    for name, data in FRONTEND.items():
        (path / name).write_bytes(data)
    (path / "preprocessor_config.json").write_bytes(b'{"patch_size": 4}')
    (path / "video_preprocessor_config.json").write_bytes(b'{"fps": 2}')
    return path
