"""Family spec of `embedding`: the token-embedding lookup (no torch / triton imports).

Attribute `vocab_begin` (optional, set only by passes/shard_tensor_parallel.py): the table holds
vocabulary rows [vocab_begin, vocab_begin + V) of a vocabulary-parallel embedding; a token outside
them gives a zero row (the ranks' rows then sum to the one-device row in the `all_reduce` that
follows). Unset: the table is the whole vocabulary.
"""

from ..family import Attr, FamilySpec, OpView, Operand
from ..spec_util import INDEX, VALUE, checker, eq


@checker
def _check(v: OpView) -> None:
    ids, table = v.shape("ids"), v.shape("table")
    eq("out", v.shape("out", out=True), (ids[0], table[1]))


def _model_matches(contract, tables) -> list[tuple[dict, str]]:
    from ..linear.spec import objects_note, weight_objects

    return [({"format": fmt, "n": n, "k": k}, objects_note(names))
            for (fmt, n, k), names in sorted(weight_objects(contract)[1].items())]


def _match(v: OpView) -> dict:
    n, k = v.shape("table")
    return {"format": v.format("table"), "n": int(n), "k": int(k)}


SPECS = (FamilySpec(
    name="embedding",
    operands=(
        Operand("ids", roles=INDEX, dtypes=("i32",), rank=1, doc="[T] token ids"),
        Operand("table", roles=("weight",), rank=2, doc="[V, H] embedding table"),
        Operand("out", io="out", roles=VALUE, rank=2, doc="[T, H]"),
    ),
    attrs=(Attr("vocab_begin", (int,), None, optional=True,
                doc="first vocabulary row of the table (a rank's slice); ids outside it give zero rows"),),
    t_operand="ids",
    match=_match,
    check=_check,
    reference="ninfer_compile.kernels.embedding.reference:embedding",
    torch_impl="ninfer_compile.kernels.embedding.torch_impl:embedding",
    model_matches=_model_matches,
    doc="out[t] = table[ids[t] - vocab_begin] (a zero row outside the table's rows)",
),)
