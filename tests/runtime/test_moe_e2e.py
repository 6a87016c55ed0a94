"""Sparse MoE end to end on the CPU (issue 32): a tiny random Qwen3_5MoeForCausalLM (+ its MTP
tensors) -> pack -> compile --sm 90 -> ninfer_runtime. The torch CPU path's greedy tokens are
transformers' argmax for the bf16 recipe and ninfer_compile.reference's for the default (Q4 / Q5
expert banks) recipe, and a few tokens under the Triton interpreter are too (near-ties within 2% of
the logit spread allowed, as the dense end-to-end tests)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from reference.hf_tiny_moe import make_hf_moe_model, per_expert, random_moe_mtp

from . import support as S

PROMPT = S.PROMPT  # 12 tokens
N_NEW = 8


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(HF model, checkpoint directory, interpreter route table)."""
    d = tmp_path_factory.mktemp("moe_rt")
    model = make_hf_moe_model(seed=2)
    sd = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    sd.update({k: v.to(torch.bfloat16) for k, v in random_moe_mtp(model.config).items()})
    ckpt = d / "hf"
    ckpt.mkdir()
    cfg = {**model.config.to_dict(), "mtp_num_hidden_layers": 1}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in per_expert(sd).items()}, str(ckpt / "model.safetensors"))
    return model, ckpt, S.interp_table(d / "interp90.yaml")


def _plan(moe, tmp_path_factory, recipe: str, chunk: int):
    """chunk 24: the prompt in one prefill of T = 24 > 16 (the grouped expert GEMM); chunk 8: two
    chunks of 8 (the expert GEMV at prefill too, cheaper under the interpreter)."""
    _, ckpt, table = moe
    d = tmp_path_factory.mktemp(f"moe_{recipe}")
    art = S.pack(ckpt, d / f"moe-{recipe}.ninfer", recipe)
    return art, S.compile_plan(art, d / f"moe-{recipe}.sm90.plan", table=table, chunk=chunk, concurrency=(1,))


def _generate(art, plan, n: int, kernels: str | None = None) -> list[int]:
    import ninfer_runtime as nr

    with nr.load(plan, art, progress=False, kernels=kernels) as eng:
        return eng.generate(PROMPT, n, ignore_eos=True).tokens


def test_bf16_moe_plan_generates_transformers_argmax(moe, tmp_path_factory):
    model = moe[0]
    art, plan = _plan(moe, tmp_path_factory, "bf16", 24)
    launches = [L for x in json.loads((plan / "plan.json").read_text())["extents"].values() for L in x["launches"]]
    routes = {L["route"] for L in launches}
    assert {"moe_router_split", "moe_experts_gemv", "moe_experts_grouped_gemm"} <= routes, routes
    tokens = _generate(art, plan, N_NEW)
    assert len(tokens) == N_NEW
    with torch.no_grad():
        bad = S.check_tokens_against(lambda t: S.hf_logits(model, t), PROMPT, tokens)
    assert not bad, "\n".join(bad)


def test_quantized_moe_plan_matches_reference_on_torch_and_interpreter(moe, tmp_path_factory):
    art, plan = _plan(moe, tmp_path_factory, "default", 8)
    ref = S.reference_logits_fn(art)
    torch_tokens = _generate(art, plan, N_NEW)
    interp_tokens = _generate(art, plan, 2, kernels="interpret")
    for toks in (torch_tokens, interp_tokens):
        bad = S.check_tokens_against(ref, PROMPT, toks)
        assert not bad, "\n".join(bad)


@pytest.mark.gpu
def test_moe_plans_on_the_gpu_generate_the_argmax(moe, tmp_path_factory):
    """On a GPU the Triton kernels run (CUDA graphs at decode); chunk 24 takes the prompt through the
    grouped expert GEMM's tl.dot in bf16. Both recipes against ninfer's fp32 reference on the CPU
    (near-ties allowed; the bf16 reference equals transformers' argmax in the CPU test above, and
    transformers itself is not run here: on the GPU machine its fla kernels refuse CPU tensors)."""
    import ninfer_runtime as nr

    for recipe in ("bf16", "default"):
        art, plan = _plan(moe, tmp_path_factory, recipe, 24)
        with nr.load(plan, art, device="cuda", progress=False) as eng:
            assert eng.graphs, "decode extents should be captured"
            tokens = eng.generate(PROMPT, N_NEW, ignore_eos=True).tokens
        bad = S.check_tokens_against(S.reference_logits_fn(art), PROMPT, tokens)
        assert not bad, f"{recipe}: " + "\n".join(bad)
