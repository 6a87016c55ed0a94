"""Execute an IR graph op by op with plain PyTorch float32 references.

Each family op runs its selected route's `reference` ("module:function", called with the op's
operands and attributes by name) once `select_routes` ran, or its family's reference
(`FamilySpec.reference`, in `kernels/<family>/reference.py`) before selection (or with
`use_routes=False`). Structural ops (split, concat, reshape, add, swiglu, select_rows, take) are built in. Activations are float32 throughout: this proves that
lowering and the passes preserve the model's semantics, not kernel numerics.

State is explicit: `ExecState.buffers` maps each persistent buffer name (`kv/3/k_cache`,
`gdn/0/recurrent_state`, ...) to a tensor of the buffer's shape; ops that update a state return
the new buffer contents, which replace the old.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import CompileError
from ..kernels.family import family_spec
from ..kernels.registry import load_callable
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
        if getattr(t, "shard", None) is not None:  # a --tp rank's copy of the object, then its view
            key = f"{key}{{{t.shard!r}}}"
        w = self._wcache.get(key)
        if w is None:
            if t.object is None:
                w = self.weights.get(t.logical)
                if t.logical_rows is not None:
                    _, b, c = t.logical_rows
                    w = w[b:b + c]
            else:
                w = self.weights.get(t.object)
                if getattr(t, "shard", None) is not None:
                    w = shard_copy(w, t.shard)
                if t.view is not None:
                    w = w[t.view.row_begin:t.view.row_begin + t.view.row_count]
            self._wcache[key] = w
        return w

    def _fn(self, op) -> Callable:
        if self.use_routes and op.route is not None and op.route.reference:
            ref = op.route.reference
        else:
            ref = family_spec(op.kind).reference
        fn = self._route_fns.get(ref)
        if fn is None:
            fn = self._route_fns[ref] = load_callable(ref)
        return fn

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
            elif k == "take":  # out[i] = table[index[i]] (the draft head's row -> token id)
                outs = [args["table"].reshape(-1)[args["index"].long()]]
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


def shard_copy(w: torch.Tensor, shard) -> torch.Tensor:
    """A tensor-parallel rank's copy of an object (ir/types.py WeightShard): its row ranges, then its
    column ranges, each concatenated in order."""
    if shard.rows is not None:
        w = torch.cat([w[b:b + c] for b, c in shard.rows], 0)
    if shard.cols is not None:
        w = torch.cat([w[:, b:b + c] for b, c in shard.cols], 1)
    return w


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
