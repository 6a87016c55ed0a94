"""End to end through the runtime with the `<f>_dequant_gemm` prefill routes (`kernels="interpret"`: the
plan's Triton kernels under the interpreter, not the CPU's torch path):
HF tiny model -> pack (default quantized recipe) -> compile with a table that sends every
quantized linear of the prefill extent (T = 8) to `<f>_dequant_gemm` and decode (T = 1) to
`<f>_small_t_mma` -> ninfer_runtime generate. The 12-token prompt runs as a chunk of 8 and a tail
of 4 (the same launches narrowed to 4 columns). Tokens must match ninfer_compile.reference; the
compiler's memory report must count the workspace the runtime allocates.
"""

from __future__ import annotations

import json

import pytest

from . import support as S

N_NEW = 4


@pytest.fixture(scope="module")
def dq(tmp_path_factory):
    return S.quant_plan_with_rows(tmp_path_factory.mktemp("rtdq"), lambda prefix, mma: [
        {"t": [1, 4], "route": f"{prefix}_small_t_mma", "params": mma},
        {"t": [5, "max"], "route": f"{prefix}_dequant_gemm", "params": {"BLOCK_N": 64, "BLOCK_K": 128}}],
        concurrency=(1,))


def test_prefill_through_dequant_gemm_matches_reference(dq):
    art, plan = dq
    pj = json.loads((plan / "plan.json").read_text())
    routes = {name: {L["route"] for L in x["launches"] if L["kind"] == "linear"} for name, x in pj["extents"].items()}
    prefill = next(n for n, x in pj["extents"].items() if x["phase"] == "prefill")
    assert {r for r in routes[prefill] if r.endswith("_dequant_gemm")}, routes[prefill]
    assert all(not r.endswith("_dequant_gemm") for n, rs in routes.items() if n != prefill for r in rs)
    mem = pj["memory"]
    assert mem["route_workspace_by_extent"].get(prefill, 0) > 0 and mem["route_workspace_bytes"] > 0
    assert "route ws  R" in (plan / "memory.txt").read_text()

    import ninfer_runtime as nr

    with nr.load(plan, art, progress=False, kernels="interpret") as eng:
        # the runtime allocates exactly what the compiler accounted for the prefill extent
        assert eng.prefill_runner.workspace is not None
        assert eng.prefill_runner.workspace.numel() * 4 == mem["route_workspace_by_extent"][prefill]
        r = eng.generate(S.PROMPT, N_NEW, ignore_eos=True)
    assert len(r.tokens) == N_NEW
    bad = S.check_tokens_against(S.reference_logits_fn(art), S.PROMPT, r.tokens)
    assert not bad, "\n".join(bad)
