"""End to end through the runtime with the tensor-core decode GEMVs `<f>_gemv_tc` (Triton
interpreter): HF tiny model -> pack (default quantized recipe) -> compile with a table that sends
every quantized linear with T <= 16 to `<f>_gemv_tc` (W8 has none: small_t_mma) -> the emitted
plan runs them (under the interpreter their launcher takes its small_t_mma fallback; the asm path
is checked by the warp emulation and the GPU tests in tests/kernels/linear/test_gemv_tc.py).
Tokens must match ninfer_compile.reference.
"""

from __future__ import annotations

import json

import pytest

from . import support as S

N_NEW = 4


@pytest.fixture(scope="module")
def tc(tmp_path_factory):
    return S.quant_plan_with_rows(tmp_path_factory.mktemp("rttc"), lambda prefix, mma: [
        {"t": [1, 16], "route": f"{prefix}_gemv_tc", "params": {"num_warps": 2}},
        {"t": [17, 64], "route": f"{prefix}_small_t_mma", "params": mma},
        {"t": [65, "max"], "route": f"{prefix}_wide_mma"}], concurrency=(1, 2), skip=("bf16", "w8"))


def test_decode_through_gemv_tc_matches_reference(tc):
    art, plan = tc
    pj = json.loads((plan / "plan.json").read_text())
    used = {L["route"] for x in pj["extents"].values() if x["phase"] == "decode"
            for L in x["launches"] if L["kind"] == "linear"}
    assert {r for r in used if r.endswith("_gemv_tc")}, used
    import ninfer_runtime as nr

    with nr.load(plan, art, progress=False, kernels="interpret") as eng:
        r = eng.generate(S.PROMPT, N_NEW, ignore_eos=True)
    assert len(r.tokens) == N_NEW
    bad = S.check_tokens_against(S.reference_logits_fn(art), S.PROMPT, r.tokens)
    assert not bad, "\n".join(bad)
