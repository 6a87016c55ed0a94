"""Helpers for the runtime tests: tiny HF checkpoints, packing, compiling (with an
interpreter-friendly copy of the sm90 route table), kernel emission, and reference logits."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import reference.hf_tiny as _tiny
from ninfer_compile.reference.greedy_check import NEAR_TIE, VIOLATION, judge_greedy

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "runtime"
PY = sys.executable

# The reference tests' tiny model (tests/reference/hf_tiny.py; `tests/` is on sys.path, as for
# `compile.support`) with 4 GDN V heads and an untied LM head.
TINY_OVERRIDES = dict(linear_num_value_heads=4, tie_word_embeddings=False)
TINY = {**_tiny.TINY, **TINY_OVERRIDES}
PROMPT = _tiny.PROMPT  # 12 tokens: two prefill chunks of 8
hf_logits = _tiny.hf_logits  # float32 logits [len(tokens), V] of the HF model (teacher forcing)


# Python source for a `python -c` child: makes ninfer_compile (and its submodules) unimportable.
BLOCK_NINFER_COMPILE = """import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ninfer_compile" or name.startswith("ninfer_compile."):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
"""


def _example():
    spec = importlib.util.spec_from_file_location("_make_tiny_ckpt", REPO / "examples" / "make_tiny_checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_hf_checkpoint(out: Path, seed: int = 0, tokenizer: bool = True):
    """A tiny random Qwen3_5ForCausalLM (eval, eager attention, bf16-exact params) saved to `out`
    with a real byte-level BPE tokenizer, chat template and generation config. Returns the model."""
    model = _tiny.make_hf_model(seed, **TINY_OVERRIDES)
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


def make_hf_mtp_checkpoint(out: Path):
    """make_hf_checkpoint + the random MTP tensors of tests/reference/hf_tiny.py (bf16). Returns the model."""
    import torch
    from safetensors.torch import load_file, save_file

    model = make_hf_checkpoint(out)
    sd = load_file(str(out / "model.safetensors"))
    sd.update({k: v.to(torch.bfloat16) for k, v in _tiny.random_hf_mtp(model.config).items()})
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return model


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "ninfer_compile.cli", *args], capture_output=True, text=True, cwd=REPO)


def pack(hf_dir: Path, out: Path, recipe: str) -> Path:
    from ninfer_compile.cli import main

    rc = main(["pack", str(hf_dir), "-o", str(out), "--recipe", recipe])
    assert rc == 0, f"pack failed ({rc})"
    return out


def interp_table(dest: Path, sm: int = 90, fuse_on: tuple[str, ...] = ()) -> Path:
    """routes/smN.yaml with linear params chosen for the Triton interpreter (few, wide programs);
    `fuse_on`: fusion rules taken out of the table's `fuse_off:` (they fire again)."""
    import yaml

    data = yaml.safe_load((REPO / "routes" / f"sm{sm}.yaml").read_text())
    off = {k: v for k, v in (data.pop("fuse_off", None) or {}).items() if k not in fuse_on}
    if off:
        data["fuse_off"] = off
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


def rewrite_quant_linear(dest: Path, base: Path, rows, skip=("bf16",)) -> Path:
    """`base` table with every quantized linear group's rows replaced by `rows(prefix, mma_params)`
    (prefix q4 / q5 / q6 / w8; groups whose prefix is in `skip` keep theirs), written to `dest`."""
    import yaml

    data = yaml.safe_load(base.read_text())
    mma = {"BLOCK_N": 128, "BLOCK_K": 128, "BLOCK_T": 16}
    for row in data.get("linear", []):
        prefix = row["routes"][0]["route"].split("_")[0]
        if prefix not in skip:
            row["routes"] = rows(prefix, dict(mma))
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def quant_plan_with_rows(d: Path, rows, *, concurrency, skip=("bf16",)) -> tuple[Path, Path]:
    """The tiny HF model packed with the default (quantized) recipe and compiled under the
    interpreter table whose quantized linear rows are `rows(prefix, mma_params)`: (artifact, plan)."""
    make_hf_checkpoint(d / "hf")
    table = rewrite_quant_linear(d / "rows90.yaml", interp_table(d / "interp90.yaml"), rows, skip=skip)
    art = pack(d / "hf", d / "tiny-q.ninfer", "default")
    return art, compile_plan(art, d / "tiny-q.sm90.plan", table=table, concurrency=concurrency)


def compile_plan(artifact: Path, out: Path, *, table: Path | None = None, chunk: int = 8, max_context: int = 64,
                 concurrency=(1, 2), sm: int = 90, sampling: bool = True) -> Path:
    """Compile `artifact` into `out` and make sure it carries emitted kernels."""
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan

    opts = LowerOptions(prefill_chunk=chunk, concurrency=tuple(concurrency), max_context=max_context,
                        sampling=sampling)
    c = compile_artifact(Path(artifact), sm, routes=table, opts=opts)
    write_plan(out, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    assert (out / "kernels" / "manifest.json").is_file()
    return out


def seal_plan_dir(plan_dir: Path, plan: dict | None = None) -> dict:
    """Write `plan` (default: the current plan.json) back with its integrity record re-computed from
    the files on disk: what a careless or hostile edit that also fixes the hash produces (tests
    use it to reach the loader's own validation). Returns the plan written."""
    import os

    from ninfer_runtime.integrity import INTEGRITY_KEY, integrity_record

    plan_dir = Path(plan_dir)
    if plan is None:
        plan = json.loads((plan_dir / "plan.json").read_text())
    body = {k: v for k, v in plan.items() if k != INTEGRITY_KEY}
    files = {}
    for dirpath, dirnames, filenames in os.walk(plan_dir):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            p = Path(dirpath) / f
            rel = p.relative_to(plan_dir).as_posix()
            if rel != "plan.json":
                files[rel] = p.read_bytes()
    sealed = {**body, INTEGRITY_KEY: integrity_record(body, files)}
    (plan_dir / "plan.json").write_text(json.dumps(sealed))
    return sealed


def check_tokens_against(logits_fn, prompt: list[int], generated: list[int], tie: float = NEAR_TIE) -> list[str]:
    """Every generated token must be the reference's argmax for its prefix, or within `tie` x the
    logit spread of the max (a near-tie; ninfer_compile.reference.greedy_check). Returns the
    failures (empty = pass)."""
    return [v.describe() for v in judge_greedy(logits_fn, prompt, generated, tie) if v.kind == VIOLATION]


def reference_logits_fn(artifact: Path, kv_dtype: str | None = None):
    """Teacher-forced float32 logits of ninfer_compile.reference on `artifact` (quantized or not);
    `kv_dtype`: its KV cache keeps what that format gives back (quantize -> dequantize of K / V)."""
    from ninfer_compile.artifact import Artifact
    from ninfer_compile.contracts import find_contract
    from ninfer_compile.reference import ArtifactWeights, ReferenceModel

    art = Artifact.open(artifact)
    spec = find_contract(art.path, art.model_id, None).resolve_for(art)
    model = ReferenceModel(spec, ArtifactWeights(art), kv_dtype=kv_dtype)

    def fn(tokens):
        import torch

        with torch.no_grad():
            return model.prefill(list(tokens)).float()

    return fn
