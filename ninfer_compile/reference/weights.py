"""Weight sources for the reference model.

A `WeightSource` hands out NInfer logical tensors by canonical object name
(`text/layers/3/attention/query_key`, ...). Every floating tensor comes back as float32 in its
logical shape (grouped formats dequantized as scale x code, BF16/FP32 widened exactly); I32
tensors stay int32. Row views (`query = query_key[0:Q]`) are taken by the model, not here, so a
source only ever deals with whole physical objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from ..contracts.dims import HybridDims
from ..errors import ArtifactError
from .moe import MoEWeights, load_moe_weights


@runtime_checkable
class WeightSource(Protocol):
    """Anything that returns a logical tensor for a NInfer object name."""

    def get(self, name: str) -> torch.Tensor:  # float32 (I32 objects: int32)
        ...


def _as_reference_dtype(name: str, t: torch.Tensor) -> torch.Tensor:
    """float32 for every floating tensor; int32 stays int32 (e.g. draft-head token ids)."""
    if t.dtype == torch.int32:
        return t
    if t.dtype in (torch.int64, torch.int16, torch.int8, torch.uint8):
        raise ArtifactError(f"{name}: integer tensor of dtype {t.dtype} is not a NInfer logical tensor")
    return t.to(torch.float32)


class DictWeights:
    """Weights held in memory: `{ninfer_name: tensor}` (e.g. from `convert_state_dict`)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]):
        self._tensors = {k: _as_reference_dtype(k, v.detach()) for k, v in tensors.items()}

    def get(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise ArtifactError(f"weights: no object named {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def names(self) -> list[str]:
        return list(self._tensors)


class ArtifactWeights:
    """Weights read from an open `Artifact` (dequantized on first use, then cached).

    `cache=False` re-reads on every `get`; the reference model keeps the tensors it resolved, so
    that only matters for callers who want to bound memory on large artifacts. `device` places
    each tensor there as it is read (object by object: no full host copy of the model).
    """

    def __init__(self, artifact, *, cache: bool = True, device=None):
        self.artifact = artifact
        self.device = torch.device(device) if device is not None else None
        self._cache: dict[str, torch.Tensor] | None = {} if cache else None

    def load(self, name: str) -> torch.Tensor:
        """Object `name` decoded (uncached) as a reference tensor on `self.device`."""
        t = _as_reference_dtype(name, self.artifact.load(name))
        return t if self.device is None else t.to(self.device)

    def get(self, name: str) -> torch.Tensor:
        if self._cache is not None and name in self._cache:
            return self._cache[name]
        t = self.load(name)
        if self._cache is not None:
            self._cache[name] = t
        return t

    def __contains__(self, name: str) -> bool:
        return name in self.artifact.by_name


# ---------------------------------------------------------------------------------------------
# Model layout: object names, fused row views (the dimensions are `contracts.dims.HybridDims`).
#
# Both the torch reference (model.py, mtp.py) and the float64 oracle (oracle_jax.py) read their
# weights through `load_text_weights` / `load_mtp_weights`, so the two implementations share the
# binding (which rows of which object mean what) and nothing of the math.
# ---------------------------------------------------------------------------------------------

# Role names of the contract's row views (graphs/*.yaml `views:`), per logical slice.
_ROLE_NAMES = {
    "query": ("query",),
    "key": ("key",),
    "gate": ("gate", "output_gate"),
    "value": ("value",),
    "z": ("z",),
    "mlp_gate": ("gate",),
    "mlp_up": ("up",),
}


def row_slice(spec, parent: str, role: str, begin: int, count: int) -> tuple[int, int]:
    """Rows `[begin, begin+count)` of `parent` for `role`, checked against the contract's views.

    The default comes from the dimensions (NInfer's fused row order); when the contract declares a
    view for this parent/role (`spec.views[(parent, role)]`) it must agree, otherwise the binding
    here would be wrong for that model.
    """
    views = getattr(spec, "views", None) or {}
    for name in _ROLE_NAMES.get(role, (role,)):
        view = views.get((parent, name))
        if view is None:
            continue
        vb, vc = int(view.row_begin), int(view.row_count)
        if (vb, vc) != (begin, count):
            raise ArtifactError(
                f"{parent}: contract view {name!r} is rows [{vb},{vb + vc}), the reference expects "
                f"[{begin},{begin + count})")
        return vb, vc
    return begin, count


def _rows(source: WeightSource, spec, parent: str, slices: list[tuple[str, int]]):
    """Split `parent` along rows into consecutive logical slices `[(role, count), ...]`."""
    t = source.get(parent)
    total = sum(c for _, c in slices)
    if t.dim() != 2 or t.shape[0] != total:
        raise ArtifactError(f"{parent}: shape {tuple(t.shape)}, expected {total} rows")
    out, begin = {}, 0
    for role, count in slices:
        b, c = row_slice(spec, parent, role, begin, count)
        out[role] = t[b:b + c]
        begin += count
    return out


def _vec(source: WeightSource, name: str, n: int) -> torch.Tensor:
    t = source.get(name)
    if tuple(t.shape) != (n,):
        raise ArtifactError(f"{name}: shape {tuple(t.shape)}, expected ({n},)")
    return t


def _mat(source: WeightSource, name: str, n: int, k: int) -> torch.Tensor:
    t = source.get(name)
    if tuple(t.shape) != (n, k):
        raise ArtifactError(f"{name}: shape {tuple(t.shape)}, expected ({n}, {k})")
    return t


@dataclass
class AttentionWeights:
    """One full-attention mixer in logical form (all [N, K] row-major, float32)."""

    query: torch.Tensor   # [Hq*D, H]
    key: torch.Tensor     # [Hkv*D, H]
    gate: torch.Tensor    # [Hq*D, H]   per-head output gate
    value: torch.Tensor   # [Hkv*D, H]
    query_norm: torch.Tensor  # [D]  zero-centred (1+w)
    key_norm: torch.Tensor    # [D]  zero-centred (1+w)
    output: torch.Tensor  # [H, Hq*D]


@dataclass
class GDNWeights:
    """One Gated DeltaNet mixer in logical form."""

    query: torch.Tensor      # [Hk*Dk, H]
    key: torch.Tensor        # [Hk*Dk, H]
    value: torch.Tensor      # [Hv*Dv, H]
    z: torch.Tensor          # [Hv*Dv, H]
    a: torch.Tensor          # [Hv, H]
    b: torch.Tensor          # [Hv, H]
    a_log: torch.Tensor      # [Hv]
    dt_bias: torch.Tensor    # [Hv]
    convolution: torch.Tensor  # [kernel, C] tap-major, C = [q | k | v] channels
    norm: torch.Tensor       # [Dv]  plain weight (no 1+w)
    output: torch.Tensor     # [H, Hv*Dv]


@dataclass
class LayerWeights:
    kind: str                                   # "attention" | "gdn"
    input_norm: torch.Tensor                    # [H]  (1+w)
    post_attention_norm: torch.Tensor           # [H]  (1+w)
    # the feed-forward block: a dense SwiGLU MLP, or (family qwen3_5_moe) a sparse MoE block
    mlp_gate: torch.Tensor | None = None        # [I, H]
    mlp_up: torch.Tensor | None = None          # [I, H]
    mlp_down: torch.Tensor | None = None        # [H, I]
    attention: AttentionWeights | None = None
    gdn: GDNWeights | None = None
    moe: MoEWeights | None = None


@dataclass
class TextWeights:
    embedding: torch.Tensor     # [V, H]
    final_norm: torch.Tensor    # [H]  (1+w)
    output_head: torch.Tensor   # [V, H]
    layers: list[LayerWeights] = field(default_factory=list)


@dataclass
class MTPWeights:
    input_projection: torch.Tensor  # [H, 2H]  applied to concat(e, h)
    embedding_norm: torch.Tensor    # [H]  (1+w)
    hidden_norm: torch.Tensor       # [H]  (1+w)
    layer: LayerWeights             # one full-attention layer
    final_norm: torch.Tensor        # [H]  (1+w)


def _feed_forward(source, spec, dims: HybridDims, prefix: str) -> dict:
    """LayerWeights fields of the feed-forward block under `prefix` (dense MLP or sparse MoE)."""
    if dims.is_moe:
        return {"moe": load_moe_weights(source, spec, dims, prefix)}
    gu = _rows(source, spec, f"{prefix}/mlp/gate_up",
               [("mlp_gate", dims.intermediate), ("mlp_up", dims.intermediate)])
    down = _mat(source, f"{prefix}/mlp/down", dims.hidden, dims.intermediate)
    return {"mlp_gate": gu["mlp_gate"], "mlp_up": gu["mlp_up"], "mlp_down": down}


def _stored(source: WeightSource, spec, name: str) -> bool:
    """Whether the model stores object `name` (the contract's inventory when `spec` has one)."""
    objects = getattr(spec, "objects", None)
    if objects is not None:
        return name in objects
    try:
        return name in source
    except TypeError:
        return False


def _attention_weights(source: WeightSource, spec, dims: HybridDims, p: str) -> AttentionWeights:
    """Query/key/gate/value from one `[query, key, output_gate, value]` parent, or from the split
    `query_key` + `gate_value` parents (the 27B structure)."""
    fused = f"{p}/attention/query_key_gate_value"
    if _stored(source, spec, fused):
        r = _rows(source, spec, fused, [("query", dims.q_width), ("key", dims.kv_width),
                                        ("gate", dims.q_width), ("value", dims.kv_width)])
    else:
        r = _rows(source, spec, f"{p}/attention/query_key", [("query", dims.q_width), ("key", dims.kv_width)])
        r.update(_rows(source, spec, f"{p}/attention/gate_value", [("gate", dims.q_width), ("value", dims.kv_width)]))
    return AttentionWeights(
        query=r["query"], key=r["key"], gate=r["gate"], value=r["value"],
        query_norm=_vec(source, f"{p}/attention/query_norm", dims.head_dim),
        key_norm=_vec(source, f"{p}/attention/key_norm", dims.head_dim),
        output=_mat(source, f"{p}/attention/output", dims.hidden, dims.q_width),
    )


def _gdn_inputs(source: WeightSource, spec, dims: HybridDims, p: str) -> dict:
    """q/k/v/z and a/b of a GDN layer from the fused `query_key_value_z` + `a_b_projection` parents,
    or from the split `query_key`, `value_z`, `a_projection`, `b_projection` ones."""
    kw, vw, Hv = dims.gdn_k_width, dims.gdn_v_width, dims.gdn_v_heads
    if _stored(source, spec, f"{p}/gdn/query_key_value_z"):
        r = _rows(source, spec, f"{p}/gdn/query_key_value_z", [("query", kw), ("key", kw), ("value", vw), ("z", vw)])
        r.update(_rows(source, spec, f"{p}/gdn/a_b_projection", [("a", Hv), ("b", Hv)]))
        return r
    r = _rows(source, spec, f"{p}/gdn/query_key", [("query", kw), ("key", kw)])
    r.update(_rows(source, spec, f"{p}/gdn/value_z", [("value", vw), ("z", vw)]))
    r["a"] = _mat(source, f"{p}/gdn/a_projection", Hv, dims.hidden)
    r["b"] = _mat(source, f"{p}/gdn/b_projection", Hv, dims.hidden)
    return r


def load_layer_weights(source: WeightSource, spec, dims: HybridDims, layer: int) -> LayerWeights:
    """Bind text layer `layer` (names `text/layers/{l}/...`) to its logical tensors."""
    p = f"text/layers/{layer}"
    H = dims.hidden
    lw = LayerWeights(
        kind=dims.layer_kinds[layer],
        input_norm=_vec(source, f"{p}/input_norm", H),
        post_attention_norm=_vec(source, f"{p}/post_attention_norm", H),
        **_feed_forward(source, spec, dims, p),
    )
    if lw.kind == "attention":
        lw.attention = _attention_weights(source, spec, dims, p)
    else:
        r = _gdn_inputs(source, spec, dims, p)
        lw.gdn = GDNWeights(
            query=r["query"], key=r["key"], value=r["value"], z=r["z"], a=r["a"], b=r["b"],
            a_log=_vec(source, f"{p}/gdn/a_log", dims.gdn_v_heads),
            dt_bias=_vec(source, f"{p}/gdn/dt_bias", dims.gdn_v_heads),
            convolution=_mat(source, f"{p}/gdn/convolution", dims.conv_kernel, dims.conv_channels),
            norm=_vec(source, f"{p}/gdn/norm", dims.gdn_v_dim),
            output=_mat(source, f"{p}/gdn/output", H, dims.gdn_v_width),
        )
    return lw


def load_text_weights(source: WeightSource, spec, dims: HybridDims | None = None) -> TextWeights:
    """Bind every text object of `spec` to logical float32 tensors (views are zero-copy slices)."""
    dims = dims or HybridDims.from_spec(spec)
    return TextWeights(
        embedding=_mat(source, "text/token_embedding", dims.vocab_rows, dims.hidden),
        final_norm=_vec(source, "text/final_norm", dims.hidden),
        output_head=_mat(source, "text/output_head", dims.vocab_rows, dims.hidden),
        layers=[load_layer_weights(source, spec, dims, l) for l in range(dims.layers)],
    )


def load_mtp_weights(source: WeightSource, spec, dims: HybridDims | None = None) -> MTPWeights:
    """Bind the `mtp/` objects. The MTP layer's attention input is one parent with rows
    `[query, key, output_gate, value]`; its embedding and output head alias the text ones."""
    dims = dims or HybridDims.from_spec(spec)
    H = dims.hidden
    p = "mtp/layer"
    layer = LayerWeights(
        kind="attention",
        input_norm=_vec(source, f"{p}/input_norm", H),
        post_attention_norm=_vec(source, f"{p}/post_attention_norm", H),
        attention=_attention_weights(source, spec, dims, p),
        **_feed_forward(source, spec, dims, p),
    )
    return MTPWeights(
        input_projection=_mat(source, "mtp/input_projection", H, 2 * H),
        embedding_norm=_vec(source, "mtp/embedding_norm", H),
        hidden_norm=_vec(source, "mtp/hidden_norm", H),
        layer=layer,
        final_norm=_vec(source, "mtp/final_norm", H),
    )
