"""Lowering: a resolved `ModelSpec` → one IR graph per extent.

An extent is the number of token columns T one step processes:

- prefill: one chunk of `prefill_chunk` columns of one sequence (phase `prefill`);
- decode: concurrency C columns (one per sequence), one extent per requested C;
- verify (draft window K > 0, docs/SPECULATIVE.md): C rows of W = K + 1 columns, T = C * W, one
  extent per C: logits for every column, `spec_accept` instead of `sampling`, the GDN ops write
  their per-column states and `state_select` rolls each state back to the accepted column.
- the greedy twin of a decode extent (`decode_c{C}_k0_argmax`, `argmax_decode`: --tp N > 1 plans):
  no sampling rows, no logits output; its ids come from `all_argmax` (the distributed argmax).

The text model is lowered per extent; when the contract has the MTP part the MTP draft head is
lowered as its own graph for the same extents (`mtp_<extent>`), fed by the text graph's `hidden`
output (the CLI lowers it only with a draft window K > 0: it serves drafting only). Lowering emits
the *unfused* model schedule (model doc §3-§7) in logical form: every
projection is its own `linear` over a logical weight (a whole object or a role of a fused parent),
residual adds and the SwiGLU product are structural ops, and weights are not yet bound to artifact
objects (`bind_weights` does that). Persistent state (KV cache, GDN conv / recurrent state) appears
as `state` tensors: an updating op consumes version n and produces version n+1 of one buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..contracts.dims import HybridDims
from ..errors import CompileError
from ..kernels.collective.spec import GROUP
from ..kernels.kv_cache.formats import FORMATS as KV_FORMATS
from ..kernels.kv_cache.formats import KV_DTYPES, cache_buffers, format_problem
from .graph import Graph
from .lower_moe import attention_projections, gdn_projection_weights, moe_block
from .types import Extent, Op, TensorType

# The sampling op's per-row parameter inputs (kernels/sampling/spec.py): name -> (trailing dims, dtype).
SAMPLING_INPUTS = {"temperature": ((), "f32"), "top_k": ((), "i32"), "top_p": ((), "f32"),
                   "seed": ((2,), "i32"), "sample_pos": ((), "i32")}
MAX_DRAFT_TOKENS = 8
DRAFT_HEADS = ("shortlist", "full")
# the optimized draft head of an artifact (contract part draft_head): rows + their token ids
DRAFT_HEAD, DRAFT_HEAD_IDS = "text/draft_head", "text/draft_head_token_ids"


@dataclass(frozen=True)
class LowerOptions:
    prefill_chunk: int = 1024
    concurrency: tuple[int, ...] = (1,)
    draft_tokens: int = 0
    max_context: int = 4096
    kv_dtype: str = "bf16"
    # "last": the prefill head evaluates only the rows named by the `logit_rows` input (one row,
    # the chunk's last live column); "all": every column (parity tests compare full logits).
    prefill_logits: str = "last"
    sampling: bool = True
    mtp: bool = True  # lower the MTP graph when the contract has the part
    # the MTP graphs' output head: "shortlist" (text/draft_head + a `take` of its token ids), "full"
    # (text/output_head), None: shortlist when the artifact has the draft head, else full
    draft_head: str | None = None
    argmax_decode: bool = False  # the greedy decode twins (above; compile_cli: --tp N > 1 only)

    @property
    def slots(self) -> int:
        return max(self.concurrency)


# The dimension record lowering reads (shared with the reference model).
Dims = HybridDims


# ------------------------------------------------------------------------------ extents


def plan_extents(spec, opts: LowerOptions) -> list[Extent]:
    """The extents to compile (validated): prefill first, then decode by concurrency; with a draft
    window K > 0 also verify by concurrency, and the MTP head's copies when the artifact has it."""
    if opts.prefill_chunk < 1:
        raise CompileError(f"--prefill-chunk must be >= 1, got {opts.prefill_chunk}")
    if opts.draft_tokens < 0 or opts.draft_tokens > MAX_DRAFT_TOKENS:
        raise CompileError(f"--draft-tokens must be in 0..{MAX_DRAFT_TOKENS}, got {opts.draft_tokens}")
    if not opts.concurrency:
        raise CompileError("--concurrency needs at least one value")
    for c in opts.concurrency:
        if c < 1:
            raise CompileError(f"--concurrency values must be >= 1, got {c}")
    bad_kv = format_problem(opts.kv_dtype)  # the formats are data: kernels/kv_cache/formats.py
    if bad_kv:
        raise CompileError(bad_kv)
    if opts.max_context < 1:
        raise CompileError(f"--max-context must be >= 1, got {opts.max_context}")
    if opts.prefill_chunk > opts.max_context:
        raise CompileError(f"prefill chunk {opts.prefill_chunk} exceeds --max-context {opts.max_context}")
    k = opts.draft_tokens
    if k + 1 > opts.max_context:
        raise CompileError(f"draft window {k}+1 exceeds --max-context {opts.max_context}")
    dims = Dims.from_spec(spec)
    mtp = dims.has_mtp and opts.mtp
    if mtp and k > 0:
        draft_head(spec, opts)  # refuse a shortlist head the artifact lacks before any lowering
    out = [Extent(name=f"prefill_t{opts.prefill_chunk}", phase="prefill", t=opts.prefill_chunk)]
    cs = sorted(set(opts.concurrency))
    out += [_step_extent("decode", c, 0, opts) for c in cs]  # K = 0: exactly the plans before drafting
    if k > 0:
        out += [_step_extent("verify", c, k, opts) for c in cs]
    if mtp:
        out += [e.model_copy(update={"name": f"mtp_{e.name}", "graph": "mtp"}) for e in list(out)]
    if opts.argmax_decode:
        out += [Extent(name=f"decode_c{c}_k0_argmax", phase="decode", t=c, concurrency=c, head="argmax") for c in cs]
    return out


def _step_extent(phase: str, c: int, k: int, opts: LowerOptions) -> Extent:
    t = c * (k + 1)
    if t > opts.prefill_chunk:
        raise CompileError(
            f"{phase} extent C={c} x (K={k}+1) = T {t} exceeds the prefill chunk "
            f"{opts.prefill_chunk} (the widest extent the workspace is planned for)")
    name = f"decode_c{c}_k0" if phase == "decode" else f"verify_c{c}_k{k}"
    return Extent(name=name, phase=phase, t=t, concurrency=c, draft_tokens=k)


def draft_head(spec, opts: LowerOptions) -> str:
    """The MTP graphs' output head: "shortlist" | "full" (opts.draft_head, or the default: shortlist
    when the artifact has text/draft_head + text/draft_head_token_ids)."""
    objects = getattr(spec, "objects", None) or {}
    has = DRAFT_HEAD in objects and DRAFT_HEAD_IDS in objects
    want = opts.draft_head
    if want is None:
        return "shortlist" if has else "full"
    if want not in DRAFT_HEADS:
        raise CompileError(f"--draft-head must be one of {', '.join(DRAFT_HEADS)}, got {want!r}")
    if want == "shortlist" and not has:
        raise CompileError(f"--draft-head shortlist: the artifact ({spec.model_id}) has no {DRAFT_HEAD} + "
                           f"{DRAFT_HEAD_IDS}; use --draft-head full")
    return want


# ------------------------------------------------------------------------------ builder


class _Builder:
    def __init__(self, spec, dims: Dims, extent: Extent, opts: LowerOptions):
        self.spec = spec
        self.d = dims
        self.T = extent.t
        self.opts = opts
        self.g = Graph(extent, meta={"model_id": spec.model_id, "passes": [], "kv_dtype": opts.kv_dtype,
                                     "max_context": opts.max_context, "slots": opts.slots})
        self._state_version: dict[str, int] = {}
        # verify extents: W = K + 1 columns per row; the per-column states to roll back after
        # spec_accept: (op name, state buffer, columns tensor)
        self.W = extent.draft_tokens + 1 if extent.phase == "verify" else 0
        self.rollback: list[tuple[str, str, str]] = []

    # tensors
    def act(self, name: str, shape: tuple[int, ...], dtype: str = "bf16", role: str = "activation") -> str:
        self.g.add_tensor(TensorType(name=name, shape=tuple(shape), dtype=dtype, role=role))
        return name

    def weight(self, obj: str, role: str | None = None, rows: tuple[int, int] | None = None) -> str:
        exp = (getattr(self.spec, "objects", None) or {}).get(obj)
        if exp is None:
            raise CompileError(f"contract {self.spec.model_id}: no object {obj}")
        shape = tuple(exp.shape)
        logical_rows = None
        if role is not None:
            b, c = _row_view(self.spec, obj, role, rows)
            logical_rows = (role, b, c)
            shape = (c, *shape[1:])
        name = f"w:{obj}" + (f"[{role}]" if role else "")
        self.g.add_tensor(TensorType(name=name, shape=shape, dtype=exp.format, role="weight",
                                     logical=obj, logical_rows=logical_rows))
        return name

    def state(self, buffer: str, shape: tuple[int, ...], dtype: str) -> str:
        """The current version of a persistent buffer (the root on first use)."""
        v = self._state_version.get(buffer)
        if v is None:
            self._state_version[buffer] = 0
            self.g.add_tensor(TensorType(name=buffer, shape=shape, dtype=dtype, role="state", buffer=buffer))
            return buffer
        return buffer if v == 0 else f"{buffer}@{v}"

    def next_state(self, buffer: str) -> str:
        cur = self.g.tensors[self.state(buffer, (), "")]
        v = self._state_version[buffer] + 1
        self._state_version[buffer] = v
        name = f"{buffer}@{v}"
        self.g.add_tensor(cur.model_copy(update={"name": name}))
        return name

    def op(self, kind: str, name: str, inputs: dict[str, str], outputs: dict[str, str], **attrs: Any) -> Op:
        return self.g.add_op(Op(name=name, kind=kind, inputs=inputs, outputs=outputs, attrs=attrs))

    # composite pieces ----------------------------------------------------------------
    def linear(self, name: str, x: str, w: str, out_n: int, out: str | None = None) -> str:
        out = out or f"{name}.out"
        self.act(out, (self.T, out_n))
        self.op("linear", name, {"x": x, "weight": w}, {"out": out}, epilogue="none")
        return out

    def rmsnorm(self, name: str, x: str, w: str) -> str:
        out = self.act(f"{name}.out", self.g.tensors[x].shape)
        self.op("rmsnorm", name, {"x": x, "weight": w}, {"out": out}, eps=self.d.rms_eps)
        return out

    def add(self, name: str, a: str, b: str) -> str:
        out = self.act(f"{name}.out", self.g.tensors[a].shape)
        self.op("add", name, {"a": a, "b": b}, {"out": out})
        return out

    def reshape(self, name: str, x: str, shape: tuple[int, ...]) -> str:
        out = self.act(f"{name}.out", shape, self.g.tensors[x].dtype)
        self.op("reshape", name, {"x": x}, {"out": out}, shape=list(shape))
        return out

    def attention_layer(self, p: str, tag: str, x: str, h: str, qkgv: list[tuple[str, str]], kv: str) -> str:
        """Gated full attention. `qkgv` = [(object, role)] for query, key, gate, value."""
        d, T = self.d, self.T
        widths = [d.q_width, d.kv_width, d.q_width, d.kv_width]
        offs = _offsets(qkgv, widths)
        ws = [self.weight(o, r, rows) for (o, r), rows in zip(qkgv, offs)]
        q = self.linear(f"{tag}.q_proj", h, ws[0], d.q_width)
        k = self.linear(f"{tag}.k_proj", h, ws[1], d.kv_width)
        gate = self.linear(f"{tag}.gate_proj", h, ws[2], d.q_width)
        v = self.linear(f"{tag}.v_proj", h, ws[3], d.kv_width)
        q3 = self.reshape(f"{tag}.q_heads", q, (T, d.attn_heads, d.head_dim))
        k3 = self.reshape(f"{tag}.k_heads", k, (T, d.kv_heads, d.head_dim))
        g3 = self.reshape(f"{tag}.gate_heads", gate, (T, d.attn_heads, d.head_dim))
        v3 = self.reshape(f"{tag}.v_heads", v, (T, d.kv_heads, d.head_dim))
        qn = self.act(f"{tag}.q_norm.out", self.g.tensors[q3].shape)
        self.op("head_rmsnorm", f"{tag}.q_norm", {"x": q3, "weight": self.weight(f"{p}/attention/query_norm")},
                {"out": qn}, eps=d.rms_eps)
        kn = self.act(f"{tag}.k_norm.out", self.g.tensors[k3].shape)
        self.op("head_rmsnorm", f"{tag}.k_norm", {"x": k3, "weight": self.weight(f"{p}/attention/key_norm")},
                {"out": kn}, eps=d.rms_eps)
        qr = self.act(f"{tag}.q_rope.out", self.g.tensors[qn].shape)
        self.op("rope", f"{tag}.q_rope", {"x": qn, "positions": "positions"}, {"out": qr},
                rotary_dim=d.rotary_dim, theta=d.rope_theta)
        kr = self.act(f"{tag}.k_rope.out", self.g.tensors[kn].shape)
        self.op("rope", f"{tag}.k_rope", {"x": kn, "positions": "positions"}, {"out": kr},
                rotary_dim=d.rotary_dim, theta=d.rope_theta)
        # KV cache: the format's buffers (kernels/kv_cache/formats.py), codes + scales per layer
        kvd = self.opts.kv_dtype
        bad_kv = format_problem(kvd, d.head_dim, self.spec.model_id)
        if bad_kv:
            raise CompileError(bad_kv)
        ins, outs = {}, {}
        for n, shape, dtype in cache_buffers(KV_FORMATS[kvd], self.opts.slots, self.opts.max_context,
                                             d.kv_heads, d.head_dim):
            buf = f"{kv}/{n}"
            self.state(buf, shape, dtype)
            ins[n] = self.state(buf, (), "")
            outs[n] = self.next_state(buf)
        self.op("kv_append", f"{tag}.kv_append",
                {"k": kr, "v": v3, "positions": "positions", "slots": "slots", **ins}, outs, kv_dtype=kvd)
        a = self.act(f"{tag}.attention.out", (T, d.q_width))
        self.op("attention", f"{tag}.attention",
                {"q": qr, "gate": g3, **outs, "positions": "positions", "slots": "slots"}, {"out": a},
                scale=1.0 / math.sqrt(d.head_dim), kv_dtype=kvd, **({"window": self.W} if self.W else {}))
        o = self.linear(f"{tag}.o_proj", a, self.weight(f"{p}/attention/output"), d.hidden)
        return self.add(f"{tag}.residual", x, o)

    def gdn_layer(self, p: str, tag: str, x: str, h: str, layer: int) -> str:
        d, T = self.d, self.T
        wq, wk, wv, wz, wa, wb = gdn_projection_weights(self, p)
        q = self.linear(f"{tag}.q_proj", h, wq, d.gdn_k_width)
        k = self.linear(f"{tag}.k_proj", h, wk, d.gdn_k_width)
        v = self.linear(f"{tag}.v_proj", h, wv, d.gdn_v_width)
        z = self.linear(f"{tag}.z_proj", h, wz, d.gdn_v_width)
        a = self.linear(f"{tag}.a_proj", h, wa, d.gdn_v_heads)
        b = self.linear(f"{tag}.b_proj", h, wb, d.gdn_v_heads)
        C = d.conv_channels
        qkv = self.act(f"{tag}.qkv", (T, C))
        self.op("concat", f"{tag}.qkv_concat", {"x0": q, "x1": k, "x2": v}, {"out": qkv}, axis=1)
        buf = f"gdn/{layer}/conv_state"
        self.state(buf, (self.opts.slots, d.conv_kernel - 1, C), "bf16")
        cin = self.state(buf, (), "")
        cout = self.next_state(buf)
        conv = self.act(f"{tag}.conv.out", (T, C))
        conv_outs, conv_attrs = {"out": conv, "conv_state": cout}, {}
        if self.W:  # verify: the last K-1 inputs after each of a row's first K columns
            cols = self.act(f"{tag}.conv.columns", (T // self.W, self.W - 1, d.conv_kernel - 1, C))
            conv_outs["conv_state_columns"] = cols
            conv_attrs["window"] = self.W
            self.rollback.append((f"{tag}.conv_state_select", buf, cols))
        self.op("conv1d", f"{tag}.conv", {"x": qkv, "weight": self.weight(f"{p}/gdn/convolution"),
                                          "conv_state": cin, "positions": "positions", "slots": "slots"},
                conv_outs, activation="silu", **conv_attrs)
        qc, kc, vc = (self.act(f"{tag}.conv.{n}", (T, w)) for n, w in
                      (("q", d.gdn_k_width), ("k", d.gdn_k_width), ("v", d.gdn_v_width)))
        self.op("split", f"{tag}.conv_split", {"x": conv}, {"out0": qc, "out1": kc, "out2": vc},
                axis=1, sizes=[d.gdn_k_width, d.gdn_k_width, d.gdn_v_width])
        q3 = self.reshape(f"{tag}.q_heads", qc, (T, d.gdn_k_heads, d.gdn_k_dim))
        k3 = self.reshape(f"{tag}.k_heads", kc, (T, d.gdn_k_heads, d.gdn_k_dim))
        v3 = self.reshape(f"{tag}.v_heads", vc, (T, d.gdn_v_heads, d.gdn_v_dim))
        g = self.act(f"{tag}.gating.g", (T, d.gdn_v_heads), "f32")
        beta = self.act(f"{tag}.gating.beta", (T, d.gdn_v_heads), "f32")
        self.op("gdn_gating", f"{tag}.gating",
                {"a": a, "b": b, "a_log": self.weight(f"{p}/gdn/a_log"), "dt_bias": self.weight(f"{p}/gdn/dt_bias")},
                {"g": g, "beta": beta})
        sbuf = f"gdn/{layer}/recurrent_state"
        self.state(sbuf, (self.opts.slots, d.gdn_v_heads, d.gdn_k_dim, d.gdn_v_dim), "f32")
        sin = self.state(sbuf, (), "")
        sout = self.next_state(sbuf)
        o = self.act(f"{tag}.delta_rule.out", (T, d.gdn_v_heads, d.gdn_v_dim))
        rule_outs, rule_attrs = {"out": o, "state": sout}, {}
        if self.W:  # verify: the recurrent state after each of a row's first K columns (f32)
            cols = self.act(f"{tag}.delta_rule.columns",
                            (T // self.W, self.W - 1, d.gdn_v_heads, d.gdn_k_dim, d.gdn_v_dim), "f32")
            rule_outs["state_columns"] = cols
            rule_attrs["window"] = self.W
            self.rollback.append((f"{tag}.state_select", sbuf, cols))
        self.op("gated_delta_rule", f"{tag}.delta_rule",
                {"q": q3, "k": k3, "v": v3, "g": g, "beta": beta, "state": sin, "positions": "positions",
                 "slots": "slots"},
                rule_outs, scale=1.0 / math.sqrt(d.gdn_k_dim), l2_eps=d.l2_eps, **rule_attrs)
        z3 = self.reshape(f"{tag}.z_heads", z, (T, d.gdn_v_heads, d.gdn_v_dim))
        on = self.act(f"{tag}.gated_norm.out", (T, d.gdn_v_width))
        self.op("gated_rmsnorm", f"{tag}.gated_norm", {"x": o, "z": z3, "weight": self.weight(f"{p}/gdn/norm")},
                {"out": on}, eps=d.rms_eps)
        out = self.linear(f"{tag}.o_proj", on, self.weight(f"{p}/gdn/output"), d.hidden)
        return self.add(f"{tag}.residual", x, out)

    def mlp(self, p: str, tag: str, x: str) -> str:
        """The feed-forward block: a dense SwiGLU MLP, or the sparse-MoE block (lower_moe.py)."""
        d = self.d
        h = self.rmsnorm(f"{tag}.post_norm", x, self.weight(f"{p}/post_attention_norm"))
        if d.is_moe:
            return moe_block(self, p, tag, x, h)
        gu = f"{p}/mlp/gate_up"
        gate = self.linear(f"{tag}.gate_proj", h, self.weight(gu, "mlp_gate", (0, d.intermediate)), d.intermediate)
        up = self.linear(f"{tag}.up_proj", h, self.weight(gu, "mlp_up", (d.intermediate, d.intermediate)),
                         d.intermediate)
        act = self.act(f"{tag}.swiglu.out", (self.T, d.intermediate))
        self.op("swiglu", f"{tag}.swiglu", {"gate": gate, "up": up}, {"out": act})
        down = self.linear(f"{tag}.down_proj", act, self.weight(f"{p}/mlp/down"), d.hidden)
        return self.add(f"{tag}.mlp_residual", x, down)

    def inputs(self, extra: dict[str, tuple[tuple[int, ...], str]] | None = None) -> None:
        T = self.T
        outs = {"ids": self.act("ids", (T,), "i32", "input"),
                "positions": self.act("positions", (T,), "i32", "input"),
                "slots": self.act("slots", (T,), "i32", "input")}
        for n, (shape, dt) in (extra or {}).items():
            outs[n] = self.act(n, shape, dt, "input")
        if self.W and self.g.extent.graph == "text":  # verify: real drafts per row (spec_accept)
            outs["n_drafts"] = self.act("n_drafts", (T // self.W,), "i32", "input")
        if (self.opts.sampling and self.g.extent.head == "sample") or "n_drafts" in outs:  # one row per logits row: 1 for a last-column
            # prefill head, else T (verify: per column, spec_accept reads them)
            R = 1 if self.g.extent.phase == "prefill" and self.opts.prefill_logits == "last" else T
            for n, (rest, dt) in SAMPLING_INPUTS.items():
                outs[n] = self.act(n, (R, *rest), dt, "input")
        self.op("input", "inputs", {}, outs)

    def head(self, x: str, final_norm: str, extra_outputs: dict[str, str], *, shortlist: bool = False) -> None:
        """Final norm, output head over the selected rows, sampling (verify: spec_accept, then the
        state rollback), outputs. `shortlist`: the head is text/draft_head and a `take` maps the
        sampled row to its token id (the MTP graphs' draft head)."""
        d, T = self.d, self.T
        hidden = self.rmsnorm("final_norm", x, self.weight(final_norm))
        rows_in = hidden
        if self.g.extent.phase == "prefill" and self.opts.prefill_logits == "last":
            rows_in = self.act("head_rows", (1, d.hidden))
            self.op("select_rows", "select_rows", {"x": hidden, "rows": "logit_rows"}, {"out": rows_in})
        R = self.g.tensors[rows_in].shape[0]
        head_w = self.weight(DRAFT_HEAD if shortlist else "text/output_head")
        argmax = self.g.extent.head == "argmax"  # the greedy twin: ids only, no logits rows
        logits = self.act("logits", (R, self.g.tensors[head_w].shape[0]), "bf16", "activation" if argmax else "output")
        self.op("linear", "lm_head", {"x": rows_in, "weight": head_w}, {"out": logits}, epilogue="none")
        outs = {} if argmax else {"logits": logits}
        verify = bool(self.W) and self.g.extent.graph == "text"
        if argmax:
            outs["ids"] = self.act("next_ids", (R,), "i32", "output")
            self.op("all_argmax", "greedy_ids", {"x": logits}, {"ids": outs["ids"]}, group=GROUP, ranks=1)
        elif verify:
            # C rows of W columns: the accepted drafts and the target's token per row
            tokens = self.act("tokens", (T,), "i32", "output")
            accepted = self.act("accepted", (T // self.W,), "i32", "output")
            self.op("spec_accept", "spec_accept",
                    {"logits": logits, "ids": "ids", "n_drafts": "n_drafts", **{n: n for n in SAMPLING_INPUTS}},
                    {"tokens": tokens, "accepted": accepted})
            for name, buf, cols in self.rollback:  # state[slot of row r] = columns[r, accepted[r]]
                sin = self.state(buf, (), "")
                self.op("state_select", name, {"state": sin, "columns": cols, "accepted": accepted,
                                               "slots": "slots"}, {"state": self.next_state(buf)})
            outs.update({"tokens": tokens, "accepted": accepted})
        elif self.opts.sampling:
            ids = (self.act("next_rows", (R,), "i32") if shortlist  # a draft head row, mapped by `take`
                   else self.act("next_ids", (R,), "i32", "output"))
            self.op("sampling", "sampling", {"logits": logits, **{n: n for n in SAMPLING_INPUTS}}, {"ids": ids},
                    mode="per_slot")
            if shortlist:  # draft head row -> token id
                tid = self.act("next_ids", (R,), "i32", "output")
                self.op("take", "draft_ids", {"table": self.weight(DRAFT_HEAD_IDS), "index": ids}, {"out": tid})
                ids = tid
            outs["ids"] = ids
        for k, v in extra_outputs.items():
            outs[k] = v if k != "hidden" else hidden
        self.op("output", "outputs", outs, {})


# Role spellings a contract may use for each slice lowering asks for (NInfer's wording first).
_ROLE_NAMES = {
    "query": ("query", "q"), "key": ("key", "k"), "gate": ("output_gate", "gate", "attention_gate"),
    "value": ("value", "v"), "z": ("z", "output_z"), "mlp_gate": ("gate", "mlp_gate"), "mlp_up": ("up", "mlp_up"),
}


def _row_view(spec, parent: str, role: str, rows: tuple[int, int]) -> tuple[int, int]:
    """Rows of `role` in `parent`: the contract's view when it declares one (it must agree with the
    dimensions' fused row order), else the default from the dimensions."""
    views = getattr(spec, "views", None) or {}
    for name in _ROLE_NAMES.get(role, (role,)):
        v = views.get((parent, name))
        if v is None:
            continue
        got = (int(v.row_begin), int(v.row_count))
        if got != tuple(rows):
            if role in ("gate", "mlp_gate") and name == "gate":
                continue  # "gate" is both the attention output gate and the MLP gate: match by range
            raise CompileError(f"{parent}: contract view {name!r} is rows [{got[0]},{got[0] + got[1]}), the "
                               f"model's fused row order puts {role} at [{rows[0]},{rows[0] + rows[1]})")
        return got
    return tuple(rows)


def _offsets(parts: list[tuple[str, str]], widths: list[int]) -> list[tuple[int, int]]:
    """Default row ranges of consecutive roles within their parents (NInfer fused row order)."""
    out, pos = [], {}
    for (obj, _), w in zip(parts, widths):
        b = pos.get(obj, 0)
        out.append((b, w))
        pos[obj] = b + w
    return out


# ------------------------------------------------------------------------------ entry points


def lower_text(spec, extent: Extent, opts: LowerOptions, dims: Dims | None = None) -> Graph:
    d = dims or Dims.from_spec(spec)
    b = _Builder(spec, d, extent, opts)
    extra = {"logit_rows": ((1,), "i32")} if extent.phase == "prefill" and opts.prefill_logits == "last" else {}
    b.inputs(extra)
    x = b.act("embed.out", (extent.t, d.hidden))
    b.op("embedding", "embed", {"ids": "ids", "table": b.weight("text/token_embedding")}, {"out": x})
    for layer, kind in enumerate(d.layer_kinds):
        p, tag = f"text/layers/{layer}", f"l{layer}"
        h = b.rmsnorm(f"{tag}.input_norm", x, b.weight(f"{p}/input_norm"))
        if kind == "attention":
            x = b.attention_layer(p, f"{tag}.attn", x, h, attention_projections(spec, p), f"kv/{layer}")
        else:
            x = b.gdn_layer(p, f"{tag}.gdn", x, h, layer)
        x = b.mlp(p, f"{tag}.mlp", x)
    b.head(x, "text/final_norm", {"hidden": "hidden"} if (d.has_mtp and opts.mtp) else {})
    return b.g


def lower_mtp(spec, extent: Extent, opts: LowerOptions, dims: Dims | None = None) -> Graph:
    d = dims or Dims.from_spec(spec)
    if not d.has_mtp:
        raise CompileError(f"contract {spec.model_id} has no MTP part")
    b = _Builder(spec, d, extent, opts)
    T = extent.t
    extra = {"hidden": ((T, d.hidden), "bf16")}
    if extent.phase == "prefill" and opts.prefill_logits == "last":
        extra["logit_rows"] = ((1,), "i32")
    b.inputs(extra)
    e = b.act("embed.out", (T, d.hidden))
    b.op("embedding", "embed", {"ids": "ids", "table": b.weight("text/token_embedding")}, {"out": e})
    en = b.rmsnorm("mtp.embedding_norm", e, b.weight("mtp/embedding_norm"))
    hn = b.rmsnorm("mtp.hidden_norm", "hidden", b.weight("mtp/hidden_norm"))
    cat = b.act("mtp.concat.out", (T, 2 * d.hidden))
    b.op("concat", "mtp.concat", {"x0": en, "x1": hn}, {"out": cat}, axis=1)
    x = b.linear("mtp.input_projection", cat, b.weight("mtp/input_projection"), d.hidden)
    p = "mtp/layer"
    h = b.rmsnorm("mtp.input_norm", x, b.weight(f"{p}/input_norm"))
    qkgv = f"{p}/attention/query_key_gate_value"
    x = b.attention_layer(p, "mtp.attn", x, h, [(qkgv, "query"), (qkgv, "key"), (qkgv, "gate"), (qkgv, "value")],
                          "mtp_kv")
    x = b.mlp(p, "mtp.mlp", x)
    # every phase returns its hidden rows (after mtp/final_norm): the next chained draft step's input
    b.head(x, "mtp/final_norm", {"hidden": "hidden"}, shortlist=draft_head(spec, opts) == "shortlist")
    return b.g


def lower(spec, extent: Extent, opts: LowerOptions, dims: Dims | None = None) -> Graph:
    return (lower_mtp if extent.graph == "mtp" else lower_text)(spec, extent, opts, dims)


def lower_all(spec, opts: LowerOptions) -> list[Graph]:
    dims = Dims.from_spec(spec)
    return [lower(spec, e, opts, dims) for e in plan_extents(spec, opts)]


__all__ = ["Dims", "KV_DTYPES", "LowerOptions", "lower", "lower_all", "lower_mtp", "lower_text",
           "plan_extents"]
