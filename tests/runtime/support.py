"""Helpers for the runtime tests: tiny HF checkpoints, packing, compiling (with an
interpreter-friendly copy of the sm90 route table), kernel emission, and reference logits."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "runtime"
PY = sys.executable

TINY = dict(vocab_size=320, hidden_size=96, intermediate_size=160, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_key_head_dim=16,
            linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_conv_kernel_dim=4, rms_norm_eps=1e-6)
PROMPT = [5, 77, 301, 12, 9, 250, 64, 3, 199, 42, 128, 7]  # 12 tokens: two prefill chunks of 8


def _example():
    spec = importlib.util.spec_from_file_location("_make_tiny_ckpt", REPO / "examples" / "make_tiny_checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_hf_checkpoint(out: Path, seed: int = 0, tokenizer: bool = True):
    """A tiny random Qwen3_5ForCausalLM (eval, eager attention, bf16-exact params) saved to `out`
    with a real byte-level BPE tokenizer, chat template and generation config. Returns the model."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    rot = int(TINY["head_dim"] * 0.25)
    half = rot // 2
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
            "mrope_interleaved": True, "mrope_section": [half - 2 * (half // 4), half // 4, half // 4]}
    cfg = Qwen3_5TextConfig(**TINY, rope_parameters=rope, attn_implementation="eager", tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 4.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                p.copy_(0.25 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if tokenizer:
        ex = _example()
        tok, specials = ex.build_tokenizer(TINY["vocab_size"] - 16)
        eos = tok.token_to_id("<|im_end|>")
        tok.save(str(out / "tokenizer.json"))
        added = {str(tok.token_to_id(s)): {"content": s, "special": True} for s in specials}
        (out / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added,
                                                               "eos_token": "<|im_end|>"}, indent=2) + "\n")
        (out / "chat_template.jinja").write_text(ex.CHAT_TEMPLATE)
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, tok.token_to_id("<|endoftext|>")]}) + "\n")
    return model


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "ninfer_compile.cli", *args], capture_output=True, text=True, cwd=REPO)


def pack(hf_dir: Path, out: Path, recipe: str) -> Path:
    from ninfer_compile.cli import main

    rc = main(["pack", str(hf_dir), "-o", str(out), "--recipe", recipe])
    assert rc == 0, f"pack failed ({rc})"
    return out


def interp_table(dest: Path, sm: int = 90) -> Path:
    """routes/smN.yaml with linear params chosen for the Triton interpreter (few, wide programs)."""
    import yaml

    data = yaml.safe_load((REPO / "routes" / f"sm{sm}.yaml").read_text())
    mma = {"BLOCK_N": 128, "BLOCK_K": 128, "BLOCK_T": 16}
    for row in data.get("linear", []):
        prefix = row["routes"][0]["route"].split("_")[0]
        if prefix == "bf16":
            row["routes"] = [{"t": [1, "max"], "route": "bf16_tiled", "params": dict(mma)}]
        else:
            row["routes"] = [{"t": [1, 64], "route": f"{prefix}_small_t_mma", "params": dict(mma)},
                             {"t": [65, "max"], "route": f"{prefix}_wide_mma"}]
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def compile_plan(artifact: Path, out: Path, *, table: Path | None = None, chunk: int = 8, max_context: int = 64,
                 concurrency=(1, 2), sm: int = 90) -> Path:
    """Compile `artifact` into `out` and make sure it carries emitted kernels."""
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan

    opts = LowerOptions(prefill_chunk=chunk, concurrency=tuple(concurrency), max_context=max_context, sampling=False)
    c = compile_artifact(Path(artifact), sm, routes=table, opts=opts)
    write_plan(out, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    assert (out / "kernels" / "manifest.json").is_file()
    return out


def hf_logits(model, tokens: list[int]):
    """float32 logits [len(tokens), V] of the HF model (teacher forcing)."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def check_tokens_against(logits_fn, prompt: list[int], generated: list[int], tie: float = 0.02) -> list[str]:
    """Every generated token must be the reference's argmax for its prefix, or within `tie` x the
    logit spread of the max (a near-tie). Returns the failures (empty = pass)."""
    ref = logits_fn(prompt + generated[:-1])
    bad = []
    for i, tok in enumerate(generated):
        row = ref[len(prompt) - 1 + i]
        top = int(row.argmax())
        spread = float(row.max() - row.min())
        if tok != top and float(row[top] - row[tok]) > tie * spread:
            bad.append(f"step {i}: got {tok} ({float(row[tok]):.4f}), reference argmax {top} ({float(row[top]):.4f}), "
                       f"spread {spread:.4f}")
    return bad


def reference_logits_fn(artifact: Path):
    """Teacher-forced float32 logits of ninfer_compile.reference on `artifact` (quantized or not)."""
    from ninfer_compile.artifact import Artifact
    from ninfer_compile.contracts import find_contract
    from ninfer_compile.reference import ArtifactWeights, ReferenceModel

    art = Artifact.open(artifact)
    spec = find_contract(art.path, art.model_id, None).resolve_for(art)
    model = ReferenceModel(spec, ArtifactWeights(art))

    def fn(tokens):
        import torch

        with torch.no_grad():
            return model.prefill(list(tokens)).float()

    return fn
