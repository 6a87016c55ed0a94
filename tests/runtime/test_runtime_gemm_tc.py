"""End to end through the runtime with the tensor-core small-T GEMM `<f>_gemm_tc` (Q4/Q5/Q6/W8): HF
tiny model -> pack (default quantized recipe) -> compile with a table that sends every quantized
linear with T <= 64 to `<f>_gemm_tc` -> the emitted plan runs them. Under the interpreter their
launcher takes its small_t_mma fallback; on the GPU (marked test) the inline-PTX path, eager and in
CUDA graphs, batched (C = 2). Greedy tokens must match ninfer_compile.reference.
"""

from __future__ import annotations

import json

import pytest

from . import support as S

N_NEW = 4


@pytest.fixture(scope="module")
def gemm(tmp_path_factory):
    return S.quant_plan_with_rows(tmp_path_factory.mktemp("rtgemm"), lambda prefix, mma: [
        {"t": [1, 64], "route": f"{prefix}_gemm_tc", "params": {"num_warps": 2}},
        {"t": [65, "max"], "route": f"{prefix}_wide_mma"}], concurrency=(1, 2), skip=("bf16",))


def _used(plan):
    pj = json.loads((plan / "plan.json").read_text())
    return {L["route"] for x in pj["extents"].values() if x["phase"] == "decode"
            for L in x["launches"] if L["kind"] == "linear"}


def test_decode_through_gemm_tc_matches_reference(gemm):
    art, plan = gemm
    used = _used(plan)
    assert {r for r in used if r.endswith("_gemm_tc")}, used
    import ninfer_runtime as nr

    with nr.load(plan, art, progress=False) as eng:
        r = eng.generate(S.PROMPT, N_NEW, ignore_eos=True)
    assert len(r.tokens) == N_NEW
    bad = S.check_tokens_against(S.reference_logits_fn(art), S.PROMPT, r.tokens)
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
def test_gpu_decode_through_gemm_tc_asm_matches_reference(gemm):
    art, plan = gemm
    import ninfer_runtime as nr

    ref = S.reference_logits_fn(art)
    prompts = [S.PROMPT, S.PROMPT[:5]]
    with nr.load(plan, art, device="cuda", progress=False) as eng:
        graphs = [r.tokens for r in eng.generate(prompts, 8, ignore_eos=True)]
        eager = [r.tokens for r in eng.generate(prompts, 8, ignore_eos=True, use_graphs=False)]
    assert graphs == eager
    for p, toks in zip(prompts, graphs):
        bad = S.check_tokens_against(ref, p, toks)
        assert not bad, "\n".join(bad)
