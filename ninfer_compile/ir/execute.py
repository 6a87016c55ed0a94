"""Execute an IR graph op by op with plain PyTorch float32 references.

Each family op runs its selected route's `reference` ("module:function", called with the op's
operands and attributes by name) once `select_routes` ran, or the built-in reference of its family
below before selection (or with `use_routes=False`). Structural ops (split, concat, reshape, add,
swiglu, select_rows) have built-ins only. Activations are float32 throughout: this proves that
lowering and the passes preserve the model's semantics, not kernel numerics.

State is explicit: `ExecState.buffers` maps each persistent buffer name (`kv/3/k_cache`,
`gdn/0/recurrent_state`, ...) to a tensor of the buffer's shape; ops that update a state return
the new buffer contents, which replace the old.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import CompileError
# KV append and attention (the int8-g64 cache codec included) are the kernel families' fp32 references.
from ..kernels.attention.reference import attention as b_attention
from ..kernels.kv_cache.reference import kv_append as b_kv_append
from .graph import Graph

_TORCH_DTYPE = {"bf16": torch.float32, "f16": torch.float16, "f32": torch.float32, "i32": torch.int32,
                "i8": torch.int8, "u8": torch.uint8}


@dataclass
class ExecState:
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def zeros(cls, graphs: list[Graph] | Graph) -> ExecState:
        """Zero state for every persistent buffer the graphs name (float32 for bf16 buffers)."""
        st = cls()
        for g in graphs if isinstance(graphs, list) else [graphs]:
            for t in g.tensors.values():
                if t.role == "state" and t.buffer == t.name and t.name not in st.buffers:
                    st.buffers[t.name] = torch.zeros(t.shape, dtype=_TORCH_DTYPE[t.dtype])
        return st


# ------------------------------------------------------------------------------ built-ins


def _rms(x, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def b_embedding(ids, table):
    return table[ids.long()]


def b_rmsnorm(x, weight, eps):
    return _rms(x, eps) * (1.0 + weight.float())


def b_head_rmsnorm(x, weight, eps):
    return _rms(x, eps) * (1.0 + weight.float())


def b_gated_rmsnorm(x, z, weight, eps):
    out = _rms(x, eps) * weight.float() * F.silu(z.float())
    return out.reshape(x.shape[0], -1)


def b_linear(x, weight, epilogue="none", residual=None, norm_weight=None, eps=None, prologue=None):
    if prologue == "rmsnorm":
        x = b_rmsnorm(x, norm_weight, eps)
    acc = x.float() @ weight.float().t()
    if epilogue == "residual":
        return residual.float() + acc
    if epilogue == "swiglu":
        n = acc.shape[1] // 2
        return F.silu(acc[:, :n]) * acc[:, n:]
    return acc


def b_rope(x, positions, rotary_dim, theta):
    half = rotary_dim // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float64) * 2.0 / rotary_dim))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
    x = x.float()
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    x1, x2 = rot[..., :half], rot[..., half:]
    rot = rot * cos + torch.cat([-x2, x1], -1) * sin
    return torch.cat([rot, rest], -1)


def b_conv1d(x, weight, conv_state, positions, slots, activation="silu"):
    T, C = x.shape
    K = weight.shape[0]
    new = conv_state.float().clone()
    out = torch.empty(T, C)
    for t in range(T):
        s, p = int(slots[t]), int(positions[t])
        hist = new[s]
        if p == 0:
            hist = torch.zeros_like(hist)
        window = torch.cat([hist, x[t:t + 1].float()], 0)  # [K, C]
        out[t] = F.silu((window * weight.float()).sum(0))
        new[s] = window[1:] if K > 1 else hist
    return out, new


def b_gdn_gating(a, b, a_log, dt_bias):
    return -torch.exp(a_log.float()) * F.softplus(a.float() + dt_bias.float()), torch.sigmoid(b.float())


def b_gdn_gating_proj(x, a_weight, b_weight, a_log, dt_bias):
    return b_gdn_gating(b_linear(x, a_weight), b_linear(x, b_weight), a_log, dt_bias)


def b_gated_delta_rule(q, k, v, g, beta, state, positions, slots, scale=None, l2_eps=1e-6):
    T, Hk, Dk = q.shape
    Hv = v.shape[1]
    scale = 1.0 / math.sqrt(Dk) if scale is None else scale
    l2 = lambda x: x.float() * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) + l2_eps)  # noqa: E731
    qn = l2(q).repeat_interleave(Hv // Hk, 1)
    kn = l2(k).repeat_interleave(Hv // Hk, 1)
    S_all = state.float().clone()
    o = torch.empty(T, Hv, v.shape[2])
    for t in range(T):
        s = int(slots[t])
        if int(positions[t]) == 0:
            S_all[s] = 0.0
        S = S_all[s] * torch.exp(g[t].float())[:, None, None]
        u = beta[t].float()[:, None] * (v[t].float() - torch.einsum("hkv,hk->hv", S, kn[t]))
        S = S + kn[t][:, :, None] * u[:, None, :]
        o[t] = torch.einsum("hkv,hk->hv", S, qn[t]) * scale
        S_all[s] = S
    return o, S_all


def b_qk_norm_rope(q, k, q_weight, k_weight, positions, eps, rotary_dim, theta):
    return (b_rope(b_head_rmsnorm(q, q_weight, eps), positions, rotary_dim, theta),
            b_rope(b_head_rmsnorm(k, k_weight, eps), positions, rotary_dim, theta))


def b_l2norm(x, eps=1e-6):
    return x.float() * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) + eps)


def b_sampling(logits, mode="greedy"):
    return logits.float().argmax(-1).to(torch.int32)


BUILTINS: dict[str, Callable] = {
    "embedding": b_embedding, "rmsnorm": b_rmsnorm, "head_rmsnorm": b_head_rmsnorm,
    "gated_rmsnorm": b_gated_rmsnorm, "linear": b_linear, "rope": b_rope, "kv_append": b_kv_append,
    "attention": b_attention, "conv1d": b_conv1d, "gdn_gating": b_gdn_gating,
    "gated_delta_rule": b_gated_delta_rule, "sampling": b_sampling, "qk_norm_rope": b_qk_norm_rope,
    "l2norm": b_l2norm, "gdn_gating_proj": b_gdn_gating_proj,
}


def _call(fn: Callable, kwargs: dict[str, Any]) -> Any:
    """Call `fn` with the kwargs it declares (operands and attributes by name)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn(**kwargs)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in sig.parameters and v is not None})


# ------------------------------------------------------------------------------ executor


class Executor:
    """Runs graphs over a weight source (`get(object_name) -> float32 tensor`)."""

    def __init__(self, weights, *, use_routes: bool = True):
        self.weights = weights
        self.use_routes = use_routes
        self._route_fns: dict[str, Callable] = {}
        self._wcache: dict[str, torch.Tensor] = {}

    def weight(self, t) -> torch.Tensor:
        key = t.name if t.object is None else f"{t.object}[{t.view.row_begin}:{t.view.row_count}]" if t.view else t.object
        w = self._wcache.get(key)
        if w is None:
            if t.object is None:
                w = self.weights.get(t.logical)
                if t.logical_rows is not None:
                    _, b, c = t.logical_rows
                    w = w[b:b + c]
            else:
                w = self.weights.get(t.object)
                if t.view is not None:
                    w = w[t.view.row_begin:t.view.row_begin + t.view.row_count]
            self._wcache[key] = w
        return w

    def _fn(self, op) -> Callable:
        if self.use_routes and op.route is not None and op.route.reference:
            fn = self._route_fns.get(op.route.reference)
            if fn is None:
                from ..kernels.registry import load_callable

                fn = self._route_fns[op.route.reference] = load_callable(op.route.reference)
            return fn
        return BUILTINS[op.kind]

    def run(self, graph: Graph, inputs: Mapping[str, torch.Tensor], state: ExecState) -> dict[str, torch.Tensor]:
        """Execute `graph`; `inputs` by input tensor name; returns the `output` op's operands."""
        vals: dict[str, torch.Tensor] = {}
        tensors = graph.tensors
        result: dict[str, torch.Tensor] = {}

        def get(name: str) -> torch.Tensor:
            t = tensors[name]
            if t.role == "weight":
                return self.weight(t)
            if t.role == "state":
                return state.buffers[t.buffer]
            return vals[name]

        for op in graph.ops():
            k = op.kind
            if k == "input":
                for n in op.outputs.values():
                    if n not in inputs:
                        raise CompileError(f"execute {graph.extent.name}: missing input {n}")
                    x = torch.as_tensor(inputs[n])
                    if tuple(x.shape) != tuple(tensors[n].shape):
                        raise CompileError(f"execute: input {n} has shape {list(x.shape)}, "
                                           f"graph wants {list(tensors[n].shape)}")
                    vals[n] = x
                continue
            if k == "output":
                result = {operand: get(t) for operand, t in op.inputs.items()}
                continue
            args = {operand: get(t) for operand, t in op.inputs.items()}
            if k == "reshape":
                outs = [args["x"].reshape(tensors[op.outputs["out"]].shape)]
            elif k == "split":
                outs = list(torch.split(args["x"], op.attrs["sizes"], dim=op.attrs.get("axis", 1)))
            elif k == "concat":
                outs = [torch.cat([args[f"x{i}"].float() for i in range(len(args))], dim=op.attrs.get("axis", 1))]
            elif k == "add":
                outs = [args["a"].float() + args["b"].float()]
            elif k == "swiglu":
                outs = [F.silu(args["gate"].float()) * args["up"].float()]
            elif k == "select_rows":
                outs = [args["x"][args["rows"].long()]]
            else:
                base = op.attrs.get("parts_of")
                if base:  # an input given as ranges of its last axis (fuse rewriter concat_into): join it
                    args[base] = torch.cat([args.pop(n) for n in op.parts(base)], -1)
                res = _call(self._fn(op), {**args, **op.attrs})
                outs = list(res) if isinstance(res, (tuple, list)) else [res]
            for (operand, name), val in zip(op.outputs.items(), outs):
                tt = tensors[name]
                if val is None:
                    raise CompileError(f"execute: op {op.name} returned no value for {operand}")
                if tt.role == "state":
                    state.buffers[tt.buffer] = val.reshape(tt.shape)
                else:
                    vals[name] = val.reshape(tt.shape) if tt.dtype != "i32" else val.to(torch.int32).reshape(tt.shape)
        return result


def step_inputs(graph: Graph, ids, start: int = 0, slot: int = 0, **extra) -> dict[str, torch.Tensor]:
    """Inputs for one sequence's columns `ids` at positions start.. in `slot`."""
    ids = torch.as_tensor(ids, dtype=torch.int32)
    T = ids.shape[0]
    out = {"ids": ids, "positions": torch.arange(start, start + T, dtype=torch.int32),
           "slots": torch.full((T,), slot, dtype=torch.int32)}
    if "logit_rows" in graph.tensors:
        out["logit_rows"] = torch.tensor([T - 1], dtype=torch.int32)
    for name in ("temperature", "top_k", "top_p", "seed", "sample_pos"):  # sampling: greedy rows
        t = graph.tensors.get(name)
        if t is not None and t.role == "input":
            out[name] = torch.zeros(t.shape, dtype=torch.float32 if t.dtype == "f32" else torch.int32)
    out.update(extra)
    return out
