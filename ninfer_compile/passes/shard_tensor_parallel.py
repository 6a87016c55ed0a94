"""shard_tensor_parallel — rewrite one extent's graph for rank r of a `--tp N` plan (Megatron-style
tensor parallelism; one graph per rank, `PassContext.options` `tp` = N, `rank` = r; N = 1: unchanged).

Requires: bound weights (`bind_weights`: `object` and, for a role of a fused parent, `view`), the
  unfused model schedule of ir/lower.py (one linear per projection, residual adds and the SwiGLU
  product as structural ops), no collective yet.
Guarantees, for rank r:
  - column-parallel projections hold the rank's rows: attention query / gate (its heads), key /
    value (its KV heads: split when N divides them, else replicated as vLLM does when they divide
    N), GDN query / key (its key heads), value / z, a / b, a_log, dt_bias (its value heads), MLP gate
    / up (its intermediate rows), the GDN convolution (the columns of its q, k and v channels). A fused parent
    (attention/query_key, mlp/gate_up, ...) becomes ONE rank-local copy (`TensorType.shard`: the
    parent's rows of every part, concatenated in part order) and each part a row view of that copy,
    so the fuse pass still merges sibling projections into one launch;
  - row-parallel outputs (attention and GDN o_proj, MLP down) hold the rank's K columns
    (`shard.cols`) and are followed by an `all_reduce` (kernels/collective/) before the residual add;
  - every activation between them, the KV cache (its KV heads), the GDN conv state (its channels)
    and recurrent state (its value heads), and a verify extent's per-column states, have the rank's
    shapes; split sizes and reshape targets follow;
  - the output head (text/output_head, the MTP shortlist text/draft_head) is vocabulary-parallel: the
    rank's rows, then an `all_gather` of the logits, so sampling / spec_accept / take run replicated
    on the whole row and pick the token one device picks (bit for bit the row one device has:
    per-row sampling with top-k / top-p and the runtime's logits rows need it); in a greedy twin
    (`Extent.head` "argmax") the head's rank columns feed `all_argmax` instead (its `ranks`, and
    `vocab_begin` = the rank's first row): 2 float32 per row cross the group, not the row;
  - the token embedding (text/token_embedding, main and MTP graphs) is vocabulary-parallel: the
    rank's rows with `vocab_begin`, a zero row for a token of another rank, then an `all_reduce`
    (one non-zero term per token: the sum is the one-device row exactly);
  - a degree that splits neither a head count nor (KV heads) its replication, or a K slice of a
    grouped-format weight that does not start and end on a scale group, is refused in one line.
Every rank's runtime produces its `shard` copies at upload (rows: the row spans of each plane;
columns of a row-split format: a re-laid row-split of K' = the slice, codes and scales copied).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contracts.dims import HybridDims
from ..errors import CompileError
from ..ir.graph import Graph
from ..ir.types import Op, RowView, WeightShard
from ..kernels.collective.spec import GROUP
from .context import PassContext

NAME = "shard_tensor_parallel"
DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True)
class HeadSplit:
    """Rank r's heads of a head group: heads [first, first + count) of `heads`, `unit` rows each."""

    heads: int
    unit: int
    first: int
    count: int

    @property
    def rows(self) -> int:
        return self.count * self.unit

    @property
    def begin(self) -> int:
        return self.first * self.unit


def head_split(what: str, heads: int, unit: int, n: int, r: int, model: str, replicate: bool = False) -> HeadSplit:
    if heads % n == 0:
        c = heads // n
        return HeadSplit(heads, unit, r * c, c)
    if replicate and n % heads == 0:  # more ranks than KV heads: each head serves N / heads ranks
        return HeadSplit(heads, unit, r // (n // heads), 1)
    if replicate:
        raise CompileError(f"--tp {n}: {n} divides neither the {heads} {what} of {model} nor their replication "
                           f"({n} is not a multiple of {heads})")
    raise CompileError(f"--tp {n}: {n} does not divide the {heads} {what} of {model}")


class Layout:
    """The head groups of one model split for rank r of N."""

    def __init__(self, spec, n: int, r: int):
        d = HybridDims.from_spec(spec)
        m = spec.model_id
        self.n, self.r, self.d = n, r, d
        self.q = head_split("attention heads", d.attn_heads, d.head_dim, n, r, m)
        self.kv = head_split("attention KV heads", d.kv_heads, d.head_dim, n, r, m, replicate=True)
        self.gk = head_split("GDN key heads", d.gdn_k_heads, d.gdn_k_dim, n, r, m)
        self.gv = head_split("GDN value heads", d.gdn_v_heads, d.gdn_v_dim, n, r, m)
        self.mlp = head_split("MLP intermediate rows", d.intermediate, 1, n, r, m)
        self.vocab = head_split("vocabulary rows", d.vocab_rows, 1, n, r, m)
        rows = (getattr(spec, "dims", None) or {}).get("draft_rows")
        self.draft = head_split("draft head rows", int(rows), 1, n, r, m) if rows else None
        conv = 2 * self.gk.rows + self.gv.rows
        conv_global = d.conv_channels
        # per region: a global width / head count on axis 1 -> the rank's (refused where ambiguous)
        self.regions = {
            "attention": _subs([(d.q_width, self.q.rows), (d.kv_width, self.kv.rows), (d.attn_heads, self.q.count),
                                (d.kv_heads, self.kv.count)], "attention", m),
            "gdn": _subs([(d.gdn_k_width, self.gk.rows), (d.gdn_v_width, self.gv.rows), (conv_global, conv),
                          (d.gdn_k_heads, self.gk.count), (d.gdn_v_heads, self.gv.count)], "GDN", m),
            "mlp": {d.intermediate: self.mlp.rows},
        }
        self.conv_channels = conv

    def classify(self, obj: str, role: str | None):
        """(kind, region, split): kind col | row | conv | vocab; None = replicated."""
        if obj.endswith(("/attention/query_key", "/attention/gate_value", "/attention/query_key_gate_value")):
            return ("col", "attention", self.q if role in ("query", "gate") else self.kv)
        if obj.endswith("/gdn/query_key"):
            return ("col", "gdn", self.gk)
        if obj.endswith("/gdn/value_z") or obj.endswith(("/gdn/a_projection", "/gdn/b_projection",
                                                          "/gdn/a_log", "/gdn/dt_bias")):
            return ("col", "gdn", self.gv if obj.endswith("/gdn/value_z") else _per_head(self.gv))
        if obj.endswith("/mlp/gate_up"):
            return ("col", "mlp", self.mlp)
        if obj.endswith("/gdn/convolution"):
            return ("conv", "gdn", None)
        if obj.endswith("/attention/output"):
            return ("row", "attention", self.q)
        if obj.endswith("/gdn/output"):
            return ("row", "gdn", self.gv)
        if obj.endswith("/mlp/down"):
            return ("row", "mlp", self.mlp)
        if obj in ("text/output_head", "text/token_embedding"):
            return ("vocab", None, self.vocab)
        if obj == "text/draft_head" and self.draft is not None:
            return ("vocab", None, self.draft)
        return None


def _per_head(s: HeadSplit) -> HeadSplit:
    return HeadSplit(s.heads, 1, s.first, s.count)


def _subs(pairs: list[tuple[int, int]], what: str, model: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for g, l in pairs:
        if out.get(g, l) != l:
            raise CompileError(f"shard_tensor_parallel: {model}: two {what} quantities of size {g} shard differently "
                               f"({out[g]} vs {l}); this model cannot be sharded by shape")
        out[g] = l
    return out


def _group(fmt: str) -> int | None:
    from ..artifact.formats import FORMATS

    f = FORMATS.get(fmt)
    return getattr(f, "group", None) if f is not None and f.kind == "grouped" else None


def applies(ctx: PassContext) -> bool:
    """Only a --tp N > 1 compile runs the pass (pipeline.APPLIES)."""
    return int(ctx.options.get("tp", 1) or 1) > 1


def run(graph: Graph, ctx: PassContext) -> Graph:
    n = int(ctx.options.get("tp", 1) or 1)
    r = int(ctx.options.get("rank", 0) or 0)
    if n == 1:
        return graph
    if n not in DEGREES or not 0 <= r < n:
        raise CompileError(f"--tp must be one of {', '.join(map(str, DEGREES))} (rank {r}), got {n}")
    lay = Layout(ctx.spec, n, r)
    g = graph.copy()
    where = f"{NAME}: {g.extent.name}"
    weight_kind: dict[str, tuple] = {}
    _shard_weights(g, lay, weight_kind, where)
    _shard_states(g, lay)
    sharded: dict[str, str] = {}  # activation -> region
    reduces = 0
    for op in g.ops():
        if op.kind == "embedding" and weight_kind.get(op.inputs["table"], ("",))[0] == "vocab":
            op = g.replace_op(op.model_copy(update={"attrs": {**op.attrs, "vocab_begin": lay.vocab.begin}}))
            _insert_collective(g, op, "all_reduce", g.tensors[op.outputs["out"]].shape, n)
            reduces += 1
            continue
        w = op.inputs.get("weight") if op.kind == "linear" else None
        kind = weight_kind.get(w) if w is not None else None
        if kind is not None and kind[0] == "col":
            out = op.outputs["out"]
            t = g.tensors[out]
            g.set_tensor(t.model_copy(update={"shape": (t.shape[0], g.tensors[w].shape[0])}))
            sharded[out] = kind[1]
            continue
        if kind is not None and kind[0] == "row":
            if op.inputs["x"] not in sharded:
                raise CompileError(f"{where}: op {op.name}: row-parallel input {op.inputs['x']} is not sharded")
            _insert_collective(g, op, "all_reduce", g.tensors[op.outputs["out"]].shape, n)
            reduces += 1
            continue
        if kind is not None and kind[0] == "vocab":
            local = (g.tensors[op.outputs["out"]].shape[0], g.tensors[w].shape[0])
            picks = [o for o in g.ops() if o.kind == "all_argmax" and o.inputs["x"] == op.outputs["out"]]
            if not picks:
                _insert_collective(g, op, "all_gather", local, n)
                continue
            t = g.tensors[op.outputs["out"]]  # a greedy twin: the rank's columns feed the distributed argmax
            g.set_tensor(t.model_copy(update={"shape": local}))
            for p in picks:
                g.replace_op(p.model_copy(update={"attrs": {**p.attrs, "ranks": n, "vocab_begin": kind[2].begin}}))
            continue
        regions = {sharded[t] for t in op.inputs.values() if t in sharded}
        if not regions:
            continue
        if len(regions) > 1:
            raise CompileError(f"{where}: op {op.name} mixes sharded regions {sorted(regions)}")
        region = regions.pop()
        _shard_outputs(g, op, region, lay, sharded, where)
    g.meta["tensor_parallel"] = {"degree": n, "rank": r, "all_reduce": reduces}
    return g


def _shard_weights(g: Graph, lay: Layout, weight_kind: dict, where: str) -> None:
    """Every sharded weight becomes the rank's copy of its object (+ a view of that copy)."""
    children: dict[str, list] = {}
    for t in g.tensors.values():
        if t.role != "weight" or t.object is None:
            continue
        role = t.logical_rows[0] if t.logical_rows else None
        c = lay.classify(t.object, role)
        if c is None:
            continue
        weight_kind[t.name] = c
        if c[0] in ("col", "vocab"):
            b, cnt = (t.view.row_begin, t.view.row_count) if t.view is not None else (0, t.shape[0])
            children.setdefault(t.object, []).append((b, cnt, c[2], t.name))
    for obj, kids in children.items():
        ranges, local = [], {}
        pos = 0
        for b, cnt, split, name in sorted(set(kids), key=lambda k: k[0]):
            if cnt != split.heads * split.unit:
                raise CompileError(f"{where}: {name}: {cnt} rows are not {split.heads} x {split.unit}")
            rb = (b + split.begin, split.rows)
            if rb not in ranges:
                ranges.append(rb)
                local[rb] = pos
                pos += split.rows
        for b, cnt, split, name in kids:
            t = g.tensors[name]
            rb = (b + split.begin, split.rows)
            whole = len(ranges) == 1
            view = None if whole else RowView(parent=obj, row_begin=local[rb], row_count=split.rows)
            g.set_tensor(t.model_copy(update={"shard": WeightShard(rows=tuple(ranges)), "view": view,
                                              "shape": (split.rows, *t.shape[1:])}))
    d = lay.d
    for name, c in weight_kind.items():
        t = g.tensors[name]
        if c[0] == "conv":
            kw = d.gdn_k_width  # [kernel, C]: the rank's q, k and v channels are columns
            cols = ((lay.gk.begin, lay.gk.rows), (kw + lay.gk.begin, lay.gk.rows), (2 * kw + lay.gv.begin, lay.gv.rows))
            g.set_tensor(t.model_copy(update={"shard": WeightShard(cols=cols), "view": None,
                                              "shape": (t.shape[0], lay.conv_channels)}))
        elif c[0] == "row":
            split = c[2]
            cols = (split.begin, split.rows)
            grp = _group(t.format)
            if grp and (cols[0] % grp or cols[1] % grp):
                raise CompileError(f"--tp {lay.n}: {t.object} ({t.format}, K {t.shape[1]}): rank {lay.r}'s K slice "
                                   f"[{cols[0]},{cols[0] + cols[1]}) does not lie on its {grp}-column scale groups")
            g.set_tensor(t.model_copy(update={"shard": WeightShard(cols=(cols,)), "view": None,
                                              "shape": (t.shape[0], split.rows)}))


def _shard_states(g: Graph, lay: Layout) -> None:
    for t in list(g.tensors.values()):
        if t.role != "state":
            continue
        s = list(t.shape)
        buf = t.buffer or t.name
        if buf.startswith(("kv/", "mtp_kv/")):
            s[2] = lay.kv.count  # [slots, ctx, Hkv, width]
        elif buf.endswith("/conv_state"):
            s[2] = lay.conv_channels  # [slots, kernel - 1, C]
        elif buf.endswith("/recurrent_state"):
            s[1] = lay.gv.count  # [slots, Hv, Dk, Dv]
        else:
            continue
        g.set_tensor(t.model_copy(update={"shape": tuple(s)}))


_COLUMN_OUTPUTS = {"conv_state_columns": "conv_state", "state_columns": "state"}


def _shard_outputs(g: Graph, op: Op, region: str, lay: Layout, sharded: dict, where: str) -> None:
    table = lay.regions[region]
    attrs = dict(op.attrs)
    for operand, name in op.outputs.items():
        t = g.tensors[name]
        if t.role == "state":
            continue
        if operand in _COLUMN_OUTPUTS:  # [rows, K, *state per slot]
            st = g.tensors[op.inputs[_COLUMN_OUTPUTS[operand]]]
            shape = (*t.shape[:2], *st.shape[1:])
        else:
            if len(t.shape) < 2 or t.shape[1] not in table:
                raise CompileError(f"{where}: op {op.name}: cannot shard {name} {list(t.shape)} ({region})")
            shape = (t.shape[0], table[t.shape[1]], *t.shape[2:])
        g.set_tensor(t.model_copy(update={"shape": shape}))
        sharded[name] = region
    if op.kind == "split":
        attrs["sizes"] = [table[s] for s in attrs["sizes"]]
    if op.kind == "reshape":
        attrs["shape"] = list(g.tensors[op.outputs["out"]].shape)
    if attrs != op.attrs:
        g.replace_op(op.model_copy(update={"attrs": attrs}))


def _insert_collective(g: Graph, op: Op, kind: str, local_shape: tuple, n: int) -> None:
    """op's output becomes `<out>.rank` (this rank's part); a collective writes the old output."""
    out = op.outputs["out"]
    t = g.tensors[out]
    part = g.fresh_name(f"{out}.rank")
    g.set_tensor(t.model_copy(update={"name": part, "shape": tuple(local_shape), "role": "activation"}))
    g.replace_op(op.model_copy(update={"outputs": {**op.outputs, "out": part}}))
    g.add_op(Op(name=g.fresh_name(f"{op.name}.{kind}"), kind=kind, inputs={"x": part}, outputs={"out": out},
                attrs={"group": GROUP, "ranks": n}, seq=op.seq + 0.5))
