"""IR value types: tensors, ops, extents (pydantic models, immutable).

A `TensorType` is a named value of concrete shape. Roles:

- `activation`: produced by one op, lives in the activation arena;
- `input`: produced by an `input` op (token ids, positions, slots);
- `output`: consumed by the `output` op (logits, sampled ids);
- `weight`: never produced; names an artifact object or a row view of one (`object`, `view`,
  `format`). Before `bind_weights` a weight only carries its logical reference (`logical`);
- `state`: persistent per-slot state (KV cache, GDN conv / recurrent state). Every version of one
  state (before and after an update) names the same persistent `buffer`; an op that updates a
  state consumes the old version and produces the new one, which orders readers after writers.

An `Op` names a route family (a `FamilySpec` declared in `kernels/<family>/spec.py`; its operand
names are the spec's) or a structural op (`input`, `output`, `add`, `split`, `concat`, `reshape`,
`swiglu`, `select_rows`, `take`: out[i] = table[index[i]], the MTP shortlist head's row -> token id).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..kernels.family import family_names, is_family as _is_family

Role = Literal["activation", "weight", "state", "input", "output"]

# Element sizes of activation / state dtypes. Weight dtypes are artifact formats (sized by the
# artifact's encoded object size, not here).
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i8": 1, "u8": 1}


def __getattr__(name: str) -> Any:
    # FAMILIES: the declared families (kernels/*/spec.py), loaded on first use.
    if name == "FAMILIES":
        return family_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

STRUCTURAL: tuple[str, ...] = (
    "input", "output", "add", "split", "concat", "reshape", "swiglu", "select_rows", "take",
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RowView(_Frozen):
    """Rows [row_begin, row_begin + row_count) of a stored parent object (a fused row view)."""

    parent: str
    row_begin: int
    row_count: int


class WeightShard(_Frozen):
    """One tensor-parallel rank's copy of a stored object, produced by the runtime at upload
    (passes/shard_tensor_parallel.py): the rows `rows` and, of a 2-D object, the columns `cols`
    ((begin, count) ranges, concatenated in order; None = all). A weight's `view` then counts rows
    of this copy."""

    rows: tuple[tuple[int, int], ...] | None = None
    cols: tuple[tuple[int, int], ...] | None = None

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        n = shape[0] if self.rows is None else sum(c for _, c in self.rows)
        rest = tuple(shape[1:])
        if self.cols is not None:
            rest = (sum(c for _, c in self.cols), *rest[1:])
        return (n, *rest)


class TensorType(_Frozen):
    name: str
    shape: tuple[int, ...]
    dtype: str  # bf16|f32|i32|... for values; the artifact format for weights
    role: Role
    # weights
    logical: str | None = None  # the artifact object (parent) lowering asked for
    logical_rows: tuple[str, int, int] | None = None  # (role, row_begin, row_count) of a row view
    object: str | None = None  # bound artifact object (the parent of a view)
    view: RowView | None = None
    shard: WeightShard | None = None  # a --tp rank's copy of `object` (views count its rows)
    format: str | None = None
    # state
    buffer: str | None = None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    def ref(self) -> str:
        """Short human reference (printer)."""
        if self.role == "weight":
            if self.object is None:
                rows = f"[{self.logical_rows[0]}]" if self.logical_rows else ""
                return f"@?{self.logical}{rows}"
            obj = self.object if self.shard is None else f"{self.object}{{{shard_text(self.shard)}}}"
            if self.view is not None:
                return f"@{obj}[{self.view.row_begin}:{self.view.row_begin + self.view.row_count}]"
            return f"@{obj}"
        if self.role == "state":
            return f"${self.name}"
        return f"%{self.name}"


def shard_text(s: WeightShard) -> str:
    def ranges(rs):
        return "+".join(f"{b}:{b + c}" for b, c in rs) if rs is not None else ":"
    return ranges(s.rows) + ("," + ranges(s.cols) if s.cols is not None else "")


class RouteChoice(_Frozen):
    """What select_routes recorded for one op."""

    route: str
    params: dict[str, Any] = Field(default_factory=dict)
    source: str  # "sm90.yaml:LINE"
    t_range: tuple[int, int | None]
    match: dict[str, Any] = Field(default_factory=dict)
    reference: str | None = None  # "module:function" of the route's fp32 reference


class Op(_Frozen):
    name: str
    kind: str
    inputs: dict[str, str] = Field(default_factory=dict)  # operand -> tensor name
    outputs: dict[str, str] = Field(default_factory=dict)
    attrs: dict[str, Any] = Field(default_factory=dict)
    route: RouteChoice | None = None
    seq: float = 0.0  # stable order key among ready ops

    @property
    def is_family(self) -> bool:
        return _is_family(self.kind)

    def parts(self, base: str) -> list[str]:
        """Operand names `<base>0, <base>1, ..` in order: an input given as ranges along its last
        axis (attr `parts_of` names `base`; fuse rewriter `concat_into`)."""
        return sorted((n for n in self.inputs if n.startswith(base) and n[len(base):].isdigit()),
                      key=lambda n: int(n[len(base):]))


class Extent(_Frozen):
    """One compiled step shape: T token columns."""

    name: str  # prefill_t1024, decode_c4_k0, mtp_decode_c4_k0, ...
    graph: Literal["text", "mtp"] = "text"
    phase: Literal["prefill", "decode", "verify"]
    t: int
    concurrency: int = 1
    draft_tokens: int = 0
    # "argmax": the greedy twin of a decode extent (--tp N > 1, LowerOptions.argmax_decode): no
    # sampling rows, no logits output; its ids are the distributed argmax (collective all_argmax)
    head: Literal["sample", "argmax"] = "sample"
