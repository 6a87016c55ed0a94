"""Family specs of the tensor-parallel collectives (passes/shard_tensor_parallel.py inserts them).

- `all_reduce(x[T, H]) -> out[T, H]`: out = the sum of x over the ranks of `group` (row-parallel
  projections: each rank holds a K slice of the weight and a partial product). One rank: a copy.
- `all_gather(x[R, N/G]) -> out[R, N]`: out[:, g*N/G:(g+1)*N/G] = x of rank g, G = the group's size
  (the vocabulary-parallel output head: each rank computes its rows' logits, every rank then holds
  the whole row, so sampling / spec_accept run replicated and pick the same token as one device).

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
)
