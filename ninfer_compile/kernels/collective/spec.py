"""Family specs of the tensor-parallel collectives (passes/shard_tensor_parallel.py inserts them).

- `all_reduce(x[T, H]) -> out[T, H]`: out = the sum of x over the ranks of `group` (row-parallel
  projections: each rank holds a K slice of the weight and a partial product). One rank: a copy.
- `all_gather(x[R, N/G]) -> out[R, N]`: out[:, g*N/G:(g+1)*N/G] = x of rank g, G = the group's size
  (the vocabulary-parallel output head: each rank computes its rows' logits, every rank then holds
  the whole row, so sampling / spec_accept run replicated and pick the same token as one device).
- `all_argmax(x[R, N/G]) -> ids[R]`: the distributed greedy pick of the vocabulary-parallel head:
  each rank reduces its columns to (max, argmax + `vocab_begin`) per row, one all_gather exchanges
  those [R, 2] pairs, every rank picks the largest, ties to the lower rank (so to the lower id: the
  ranks hold the vocabulary in order) = torch.argmax of the whole row, the token one device picks.

Attribute `group` names the process group (binding kind `group`: the runtime binds the group it
created for that name, kernels never see a global the compiler set); `ranks` is its size (the
compiler's, for the shape rule). Light module: no torch / triton at import.
"""

from __future__ import annotations

from ..family import Attr, FamilySpec, Operand, OpView
from ..spec_util import VALUE, Bad, checker, eq

_M = "ninfer_compile.kernels.collective"
GROUP = "tensor_parallel"  # the one group a --tp N plan names: all N ranks


def _attrs() -> tuple[Attr, ...]:
    return (Attr("group", (str,), default=GROUP, binding="group",
                 doc="the process group, by name: the runtime binds the group it created for it"),
            Attr("ranks", (int,), to_launcher=False, doc="ranks in the group (the compiler's shape rule)"))


@checker
def _check_reduce(v: OpView) -> None:
    if v.attr("ranks", 0) < 1:
        raise Bad(f"ranks must be >= 1, got {v.attr('ranks')}")
    eq("out", v.shape("out", out=True), v.shape("x"))


@checker
def _check_gather(v: OpView) -> None:
    g = v.attr("ranks", 0)
    if g < 1:
        raise Bad(f"ranks must be >= 1, got {g}")
    x = v.shape("x")
    eq("out", v.shape("out", out=True), (x[0], x[1] * g))


@checker
def _check_argmax(v: OpView) -> None:
    if v.attr("ranks", 0) < 1:
        raise Bad(f"ranks must be >= 1, got {v.attr('ranks')}")
    if v.attr("vocab_begin", 0) < 0:
        raise Bad(f"vocab_begin must be >= 0, got {v.attr('vocab_begin')}")
    R, n = v.shape("x")
    if v.attr("vocab_begin", 0) + n > 1 << 24:
        raise Bad(f"ids up to {v.attr('vocab_begin', 0) + n} must stay below 2^24 (they travel as float32)")
    eq("ids", v.shape("ids", out=True), (R,))


def _match(v: OpView) -> dict:
    return {"format": "BF16"}


SPECS = (
    FamilySpec(
        name="all_reduce",
        operands=(Operand("x", roles=VALUE, dtypes=("bf16",), rank=2, doc="[T, H] this rank's partial sum"),
                  Operand("out", io="out", roles=VALUE, dtypes=("bf16",), rank=2, doc="[T, H] the sum over ranks")),
        attrs=_attrs(), t_operand="x", match=_match, check=_check_reduce,
        reference=f"{_M}.reference:all_reduce", torch_impl=f"{_M}.torch_impl:all_reduce",
        doc="sum over the ranks of the group (row-parallel outputs, the vocabulary-parallel embedding)",
    ),
    FamilySpec(
        name="all_gather",
        operands=(Operand("x", roles=VALUE, dtypes=("bf16",), rank=2, doc="[R, N/G] this rank's columns"),
                  Operand("out", io="out", roles=VALUE, dtypes=("bf16",), rank=2, doc="[R, N] every rank's columns")),
        attrs=_attrs(), t_operand="x", match=_match, check=_check_gather,
        reference=f"{_M}.reference:all_gather", torch_impl=f"{_M}.torch_impl:all_gather",
        doc="concatenate the ranks' column blocks in rank order (the vocabulary-parallel output head)",
    ),
    FamilySpec(
        name="all_argmax",
        operands=(Operand("x", roles=VALUE, dtypes=("bf16",), rank=2, doc="[R, N/G] this rank's logits columns"),
                  Operand("ids", io="out", roles=("activation", "output"), dtypes=("i32",), rank=1,
                          doc="[R] the argmax of the whole row (ties: the lowest id)")),
        attrs=(*_attrs(), Attr("vocab_begin", (int,), default=0, doc="the global id of this rank's column 0")),
        t_operand="x", match=_match, check=_check_argmax,
        reference=f"{_M}.reference:all_argmax", torch_impl=f"{_M}.torch_impl:all_argmax",
        doc="greedy pick over the ranks' vocabulary slices: one all_gather of (max, id) per row and rank",
    ),
)
