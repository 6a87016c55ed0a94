"""End to end under the Triton interpreter with the fuse rule `rmsnorm_prologue` on: the tiny
model (default quantized recipe) compiled with a table whose decode linears at T <= 4 are the
GEMVs that take the prologue (q4_gemv_lowreg / q5,q6_gemv_packed at T = 1, <f>_gemv at T 2..4,
small_t_mma above). The plan folds every decode-extent rmsnorm (input_norm, mlp.post_norm,
final_norm) into its linears / gdn_gating_proj, keeps the prefill norms, and generates the same
greedy tokens as the plan compiled with the rule off — both the reference's argmax (near-ties
within 2% of the logit spread allowed, as in test_runtime_e2e.py)."""

from __future__ import annotations

import json

import pytest

from . import support as S

N_NEW = 8
_T1 = {"q4": "q4_gemv_lowreg", "q5": "q5_gemv_packed", "q6": "q6_gemv_packed"}


def _rows(prefix, mma):
    small = {"BLOCK_N": 16, "BLOCK_K": 128} if prefix in _T1 else {"BLOCK_N": 16, "BLOCK_K": 64}
    if prefix == "bf16":
        return [{"t": [1, 4], "route": "bf16_gemv", "params": {"BLOCK_N": 16, "BLOCK_K": 64}},
                {"t": [5, "max"], "route": "bf16_tiled", "params": dict(mma)}]
    first = [{"t": [1, 1], "route": _T1[prefix], "params": small},
             {"t": [2, 4], "route": f"{prefix}_gemv", "params": {"BLOCK_N": 16, "BLOCK_K": 64}}] if prefix in _T1 \
        else [{"t": [1, 4], "route": f"{prefix}_gemv", "params": small}]
    return first + [{"t": [5, 64], "route": f"{prefix}_small_t_mma", "params": dict(mma)},
                    {"t": [65, "max"], "route": f"{prefix}_wide_mma"}]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from ninfer_compile.passes import fuse

    d = tmp_path_factory.mktemp("normfold")
    S.make_hf_checkpoint(d / "hf")
    table = S.rewrite_quant_linear(d / "gemv90.yaml", S.interp_table(d / "interp90.yaml", fuse_on=("rmsnorm_prologue",)), _rows, skip=())
    art = S.pack(d / "hf", d / "tiny-q.ninfer", "default")
    on = S.compile_plan(art, d / "on.plan", table=table)
    mp = pytest.MonkeyPatch()
    rules = fuse.load_rules()
    mp.setattr(fuse, "load_rules", lambda *a, **k: tuple(
        {**r, "enabled": False} if r["name"] == "rmsnorm_prologue" else r for r in rules))
    try:
        off = S.compile_plan(art, d / "off.plan", table=table)
    finally:
        mp.undo()
    return art, on, off


def _launches(plan):
    pj = json.loads((plan / "plan.json").read_text())
    return {name: x["launches"] for name, x in pj["extents"].items()}, pj


def test_decode_norms_folded_prefill_kept(plans):
    _, on, off = plans
    lon, pj = _launches(on)
    loff, _ = _launches(off)
    phases = {name: x.get("phase") for name, x in pj["extents"].items()}
    n_layers = S.TINY["num_hidden_layers"]
    folded = 0
    for name, launches in lon.items():
        kinds_on = [L["kind"] for L in launches]
        kinds_off = [L["kind"] for L in loff[name]]
        norms_off = kinds_off.count("rmsnorm")
        if phases[name] == "decode":
            assert norms_off >= 2 * n_layers + 1, (name, norms_off)
            assert "rmsnorm" not in kinds_on, name
            assert len(kinds_on) == len(kinds_off) - norms_off, name
            with_norm = [L for L in launches if any(b["arg"] == "norm_weight" for b in L.get("bind", []))]
            assert {L["kind"] for L in with_norm} == {"linear", "gdn_gating_proj"}, name
            assert all(any(b["arg"] == "norm_eps" and "scalar" in b for b in L["bind"]) for L in with_norm)
            assert all(L["match"].get("prologue") == "rmsnorm" for L in with_norm)
            folded += 1
        elif phases[name] == "prefill":
            assert kinds_on == kinds_off, name  # the tiled prefill GEMMs take no prologue
    assert folded >= 2  # the C = 1 and C = 2 decode extents
    # rule off: no launch carries the prologue
    assert not any(b["arg"] in ("norm_weight", "norm_eps") for ls in loff.values() for L in ls
                   for b in L.get("bind", []))


def test_greedy_tokens_unchanged(plans):
    import ninfer_runtime as nr

    art, on, off = plans
    toks = {}
    for key, plan in (("on", on), ("off", off)):
        with nr.load(plan, art, progress=False, kernels="interpret") as eng:
            toks[key] = eng.generate(S.PROMPT, N_NEW, ignore_eos=True).tokens
    assert len(toks["on"]) == N_NEW
    assert toks["on"] == toks["off"]
    bad = S.check_tokens_against(S.reference_logits_fn(art), S.PROMPT, toks["on"])
    assert not bad, "\n".join(bad)
