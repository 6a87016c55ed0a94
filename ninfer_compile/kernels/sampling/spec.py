"""Family spec of token selection (`sampling`): one launch picks every logits row's next token
on the device, greedy or sampled, with parameters per row (so one CUDA graph serves slots with
different settings).

Operands: `logits` [R, V] (bf16 / f32), the per-row parameter inputs `temperature` f32 [R]
(<= 0: greedy), `top_k` i32 [R] (0: off), `top_p` f32 [R] (>= 1: off), `seed` i32 [R, 2] (the
64-bit seed, low word first), `sample_pos` i32 [R] (the position the sampled token takes: the
noise counter), and the output `ids` i32 [R]. Attribute `mode` (compiler-only: the table's match
key; `per_slot` is the one mode lowering emits). Light module: no torch / triton at import.
"""

from __future__ import annotations

from ..family import Attr, FamilySpec, Operand, OpView
from .sizing import PARAM_DTYPES, block, workspace_elems  # noqa: F401  (re-exported)

_M = "ninfer_compile.kernels.sampling"
PARAMS = ("temperature", "top_k", "top_p", "seed", "sample_pos")  # the per-row parameter inputs, in order


def workspace_numel(view: OpView, params) -> int:
    """`Route.workspace` hook of the sampling routes."""
    R, V = view.shape("logits")[:2]
    return workspace_elems(R, V)


def _check(view: OpView) -> str | None:
    lg = view.shape("logits")
    if len(lg) != 2:
        return f"logits must be [R, V], got {list(lg)}"
    R, V = lg
    if V >= 1 << 24:
        return f"vocabulary {V} must be < 2^24 (token ids travel as float32 in the workspace)"
    want = {"temperature": (R,), "top_k": (R,), "top_p": (R,), "seed": (R, 2), "sample_pos": (R,)}
    for name, shape in want.items():
        if view.shape(name) != shape:
            return f"{name} must be {list(shape)} (one per logits row), got {list(view.shape(name))}"
        if view.dtype(name) != PARAM_DTYPES[name]:
            return f"{name} must be {PARAM_DTYPES[name]}, got {view.dtype(name)}"
    if view.shape("ids", out=True) != (R,):
        return f"ids: shape {list(view.shape('ids', out=True))}, expected {[R]}"
    return None


def _match(view: OpView) -> dict:
    return {"format": "BF16", "n": int(view.shape("logits")[1]), "mode": view.attr("mode", "per_slot")}


_IN = ("input",)
# The per-row parameter inputs, one row per logits row (shared with kernels/spec_accept/spec.py).
PARAM_OPERANDS = (
    Operand("temperature", roles=_IN, dtypes=("f32",), rank=1, doc="[R]; <= 0: greedy"),
    Operand("top_k", roles=_IN, dtypes=("i32",), rank=1, doc="[R]; 0: off"),
    Operand("top_p", roles=_IN, dtypes=("f32",), rank=1, doc="[R]; >= 1: off"),
    Operand("seed", roles=_IN, dtypes=("i32",), rank=2, doc="[R, 2]: 64-bit seed, low word first"),
    Operand("sample_pos", roles=_IN, dtypes=("i32",), rank=1, doc="[R]: position of the chosen token"),
)
SPECS = (FamilySpec(
    name="sampling",
    operands=(
        Operand("logits", roles=("activation", "output"), dtypes=("bf16", "f32"), rank=2, doc="[R, V]"),
        *PARAM_OPERANDS,
        Operand("ids", io="out", roles=("activation", "output"), dtypes=("i32",), rank=1, doc="[R] next ids"),
    ),
    attrs=(Attr("mode", (str,), "per_slot", to_launcher=False, doc="table match key"),),
    t_operand="logits",
    match=_match,
    check=_check,
    match_keys=("mode",),
    reference=f"{_M}.reference:sample",
    torch_impl="ninfer_compile.kernels.sampling.torch_impl:sampling",
    doc="next token per logits row: greedy, or temperature / top-k / top-p with a seed, per row",
),)
