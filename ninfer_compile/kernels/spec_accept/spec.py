"""Family spec of `spec_accept`: the acceptance rule of a speculative verify round, on the device.

A verify extent runs C rows of W = K + 1 token columns each (T = C * W): row r's columns
r*W .. r*W + W - 1 hold, at consecutive positions of one sequence, the row's last accepted token
followed by its K drafts (`ids[r*W + j + 1]` is draft j + 1). `n_drafts[r]` says how many of those K
drafts are real (a prompt-lookup drafter may propose fewer; drafts past it are never accepted).

Per row, with p_j the target's distribution at column j (greedy rows: its argmax):
- greedy (temperature <= 0): accept the longest prefix of drafts equal to the target's argmax at the
  column before each; then the target's argmax at the first mismatch (the correction), or at column K
  after all K were accepted (the bonus);
- sampling: the drafts are greedy, so the proposal is one-hot: accept draft d = ids[r*W + j + 1] with
  probability p_j(d); at the first rejection draw from the residual (p_j with d removed,
  renormalised); after all accepted drafts draw the bonus from p_K. p_j is the sampling family's
  distribution (temperature, top-k, top-p: kernels/sampling/reference.py:filtered_probs), the
  randomness a seeded counter of (seed[j], sample_pos[j]) as the sampling kernels use.
Outputs: `accepted[r]` in 0..n_drafts[r]; `tokens[r*W + j]` for j <= accepted[r] are the emitted
tokens (the accepted drafts, then the target's own token); entries past that are unspecified.
The per-column parameter inputs are the sampling family's (one row per column; `sample_pos[j]` is
the position the token chosen at column j takes, i.e. positions[j] + 1).
Light module: no torch / triton at import.
"""

from __future__ import annotations

from ..family import FamilySpec, Operand, OpView
from ..sampling.sizing import PARAM_DTYPES
from ..sampling.spec import PARAM_OPERANDS
from ..spec_util import VALUE, Bad, checker, eq

_M = "ninfer_compile.kernels.spec_accept"
_IN = ("input",)


@checker
def _check(v: OpView) -> None:
    lg = v.shape("logits")
    if len(lg) != 2:
        raise Bad(f"logits must be [T, V], got {list(lg)}")
    T, V = lg
    if V >= 1 << 24:
        raise Bad(f"vocabulary {V} must be < 2^24")
    (C,) = v.shape("n_drafts")
    if C < 1 or T % C or T // C < 2:
        raise Bad(f"logits rows {T} must be C x W with W >= 2 for n_drafts [{C}]")
    eq("ids", v.shape("ids"), (T,))
    want = {"temperature": (T,), "top_k": (T,), "top_p": (T,), "seed": (T, 2), "sample_pos": (T,)}
    for name, shape in want.items():
        eq(name, v.shape(name), shape)
        if v.dtype(name) != PARAM_DTYPES[name]:
            raise Bad(f"{name} must be {PARAM_DTYPES[name]}, got {v.dtype(name)}")
    eq("tokens", v.shape("tokens", out=True), (T,))
    eq("accepted", v.shape("accepted", out=True), (C,))


def _match(v: OpView) -> dict:
    return {"format": "BF16", "n": int(v.shape("logits")[1])}


SPECS = (FamilySpec(
    name="spec_accept",
    operands=(
        Operand("logits", roles=("activation", "output"), dtypes=("bf16", "f32"), rank=2, doc="[T, V] target logits"),
        Operand("ids", roles=_IN, dtypes=("i32",), rank=1, doc="[T] the verify columns' tokens (drafts at r*W + 1..)"),
        Operand("n_drafts", roles=_IN, dtypes=("i32",), rank=1, doc="[C] real drafts per row (0..W-1)"),
        *PARAM_OPERANDS,  # one row per column
        Operand("tokens", io="out", roles=("activation", "output"), dtypes=("i32",), rank=1,
                doc="[T]: row r's emitted tokens at r*W .. r*W + accepted[r]"),
        Operand("accepted", io="out", roles=("activation", "output"), dtypes=("i32",), rank=1,
                doc="[C]: accepted drafts per row"),
    ),
    t_operand="logits",
    match=_match,
    check=_check,
    reference=f"{_M}.reference:spec_accept",
    torch_impl="ninfer_compile.kernels.spec_accept.torch_impl:spec_accept",
    doc="speculative acceptance per verify row: greedy prefix match, or speculative sampling (one-hot proposal)",
),)
