"""Float32 PyTorch reference of the Qwen3.5/3.6 hybrid text model over NInfer logical weights.

The schedule (model doc §3-§6), per layer, with pre-norm residuals:

    h = RMSNorm(x, input_norm) * (1+w)            # zero-centred norms everywhere except GDN's gated norm
    x = x + mixer(h)                               # full attention or Gated DeltaNet
    h = RMSNorm(x, post_attention_norm) * (1+w)
    x = x + down(SiLU(gate(h)) * up(h))            # family qwen3_5_moe: x + moe(h), moe.py

then `logits = output_head(RMSNorm(x, final_norm))`. Every op is evaluated in float32 on
dequantized weights; it is written for clarity, not speed (the GDN recurrence is a per-token loop).
Text-only positions give every MRoPE section the same scalar position, so the rotary embedding is
the plain partial NeoX RoPE over the first `rotary_dim` dims of each head.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F

from ..errors import NinferError
from .moe import moe_block
from .state import GDNState, KVCache, ModelState
from .weights import (
    AttentionWeights,
    GDNWeights,
    HybridDims,
    LayerWeights,
    TextWeights,
    WeightSource,
    load_text_weights,
)

# ------------------------------------------------------------------------------ primitive ops


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, unit_offset: bool = True) -> torch.Tensor:
    """RMSNorm over the last dim, float32. `unit_offset` scales by (1+w) (zero-centred weights)."""
    x = x.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * ((1.0 + weight) if unit_offset else weight)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [T, K] @ weight[N, K]^T -> [T, N]."""
    return x @ weight.t()


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [T, rotary_dim] for NeoX rotation (frequency i used at dims i and i + rotary_dim/2)."""
    half = rotary_dim // 2
    # Angles in float64 then rounded: the reference should not add its own angle error.
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float64, device=positions.device)
                                * 2.0 / rotary_dim))
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]          # [T, half]
    ang = torch.cat([ang, ang], dim=-1)                                      # [T, rotary_dim]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Partial NeoX RoPE. x: [T, heads, D]; rotates x[..., :rd] as (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    x1, x2 = rot[..., : rd // 2], rot[..., rd // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    rot = rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat([rot, rest], dim=-1)


# ------------------------------------------------------------------------------ mixers


def attention_mixer(h: torch.Tensor, w: AttentionWeights, cache: KVCache, positions: torch.Tensor,
                    dims: HybridDims) -> torch.Tensor:
    """Gated GQA attention over `cache` + the T new columns (appended to `cache`).

    h: [T, H] normalised input; positions: [T] absolute positions (== cache.length + arange(T)).
    Returns the mixer output [T, H] (before the residual add).
    """
    T = h.shape[0]
    Hq, Hkv, D = dims.attn_heads, dims.kv_heads, dims.head_dim
    q = linear(h, w.query).view(T, Hq, D)        # q: [T, Hq, D]
    gate = linear(h, w.gate)                      # gate: [T, Hq*D]
    k = linear(h, w.key).view(T, Hkv, D)          # k: [T, Hkv, D]
    v = linear(h, w.value).view(T, Hkv, D)        # v: [T, Hkv, D]
    q = rms_norm(q, w.query_norm, dims.rms_eps)   # per-head, (1+w)
    k = rms_norm(k, w.key_norm, dims.rms_eps)
    cos, sin = rope_cos_sin(positions, dims.rotary_dim, dims.rope_theta)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    start = cache.length
    cache.append(k, v)
    keys, values = cache.k, cache.v               # [S, Hkv, D], S = start + T
    S = keys.shape[0]
    # GQA: query head j reads KV head j // (Hq/Hkv) (consecutive query heads share a KV head).
    group = Hq // Hkv
    keys = keys.repeat_interleave(group, dim=1)   # [S, Hq, D]
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q, keys) / math.sqrt(D)      # [Hq, T, S]
    # Column t (absolute position start+t) sees cache rows 0..start+t.
    allowed = (torch.arange(S, device=h.device)[None, :]
               <= (start + torch.arange(T, device=h.device))[:, None])          # [T, S]
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("hts,shd->thd", probs, values).reshape(T, Hq * D)      # [T, Hq*D]
    out = out * torch.sigmoid(gate)
    return linear(out, w.output)                  # [T, H]


def causal_conv_silu(x: torch.Tensor, weight: torch.Tensor, state: GDNState) -> torch.Tensor:
    """Depthwise causal conv + SiLU. x: [T, C]; weight: [kernel, C] tap-major (tap kernel-1 is the
    current column). Updates `state.conv` to the last kernel-1 input columns. Returns [T, C]."""
    K = weight.shape[0]
    window = torch.cat([state.conv, x], dim=0)             # [K-1+T, C]
    T = x.shape[0]
    out = torch.zeros_like(x)
    for j in range(K):
        out = out + weight[j] * window[j:j + T]
    state.conv = window[window.shape[0] - (K - 1):].clone()
    return F.silu(out)


def l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (the FLA / HF convention)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Recurrent gated delta rule, one token at a time.

    q, k: [T, Hv, Dk] (already L2-normalised, expanded to V heads; q already scaled);
    v: [T, Hv, Dv]; g, beta: [T, Hv]; S: [Hv, Dk, Dv]. Returns o: [T, Hv, Dv] and the new S.
    Per head: S <- exp(g) S;  S <- S + k (beta (v - k^T S))^T;  o = q^T S.
    """
    outs = []
    for t in range(q.shape[0]):
        S = S * torch.exp(g[t])[:, None, None]
        predicted = torch.einsum("hk,hkv->hv", k[t], S)                  # [Hv, Dv]
        delta = beta[t][:, None] * (v[t] - predicted)                     # [Hv, Dv]
        S = S + k[t][:, :, None] * delta[:, None, :]                      # rank-1 update
        outs.append(torch.einsum("hk,hkv->hv", q[t], S))
    return torch.stack(outs, dim=0), S


def gdn_mixer(h: torch.Tensor, w: GDNWeights, state: GDNState, dims: HybridDims) -> torch.Tensor:
    """Gated DeltaNet mixer. h: [T, H]; updates `state`; returns [T, H]."""
    T = h.shape[0]
    Hk, Dk, Hv, Dv = dims.gdn_k_heads, dims.gdn_k_dim, dims.gdn_v_heads, dims.gdn_v_dim
    qkv = torch.cat([linear(h, w.query), linear(h, w.key), linear(h, w.value)], dim=-1)   # [T, C]
    qkv = causal_conv_silu(qkv, w.convolution, state)
    q = qkv[:, :Hk * Dk].reshape(T, Hk, Dk)
    k = qkv[:, Hk * Dk:2 * Hk * Dk].reshape(T, Hk, Dk)
    v = qkv[:, 2 * Hk * Dk:].reshape(T, Hv, Dv)
    z = linear(h, w.z).reshape(T, Hv, Dv)
    a = linear(h, w.a)                                     # [T, Hv]
    b = linear(h, w.b)                                     # [T, Hv]
    g = -torch.exp(w.a_log) * F.softplus(a + w.dt_bias)    # [T, Hv] log-decay (<= 0)
    beta = torch.sigmoid(b)                                # [T, Hv]

    q = l2_normalize(q, dims.l2_eps) / math.sqrt(Dk)
    k = l2_normalize(k, dims.l2_eps)
    # V head j uses Q/K head j // (Hv/Hk): each Q/K head serves a run of consecutive V heads.
    rep = Hv // Hk
    q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)   # [T, Hv, Dk]
    o, state.recurrent = gated_delta_rule(q, k, v, g, beta, state.recurrent)   # o: [T, Hv, Dv]
    # Gated RMSNorm per V head: RMSNorm(o) * w * SiLU(z) — plain weight, no (1+w).
    o = rms_norm(o, w.norm, dims.rms_eps, unit_offset=False) * F.silu(z)
    return linear(o.reshape(T, Hv * Dv), w.output)


def mlp(h: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    """SwiGLU: down(SiLU(gate h) * up h). h: [T, H] -> [T, H]."""
    return linear(F.silu(linear(h, w.mlp_gate)) * linear(h, w.mlp_up), w.mlp_down)


def feed_forward(h: torch.Tensor, w: LayerWeights, dims: HybridDims) -> torch.Tensor:
    """The layer's feed-forward block: the sparse MoE block (moe.py) or the dense SwiGLU MLP."""
    return moe_block(h, w.moe, dims.experts_per_token) if w.moe is not None else mlp(h, w)


def decoder_layer(x: torch.Tensor, w: LayerWeights, dims: HybridDims, *, cache: KVCache | None = None,
                  gdn_state: GDNState | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
    """One pre-norm residual layer. x: [T, H] residual stream -> [T, H]."""
    h = rms_norm(x, w.input_norm, dims.rms_eps)
    if w.kind == "attention":
        x = x + attention_mixer(h, w.attention, cache, positions, dims)
    else:
        x = x + gdn_mixer(h, w.gdn, gdn_state, dims)
    return x + feed_forward(rms_norm(x, w.post_attention_norm, dims.rms_eps), w, dims)


# ------------------------------------------------------------------------------ model


def _token_tensor(tokens, vocab_rows: int) -> torch.Tensor:
    """Validate token ids: a non-empty 1-D sequence of ints in [0, vocab_rows)."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.dim() != 1:
            raise NinferError(f"tokens must be a 1-D integer tensor, got {tokens.dtype} shape {tuple(tokens.shape)}")
        ids = tokens.to(torch.long)
    else:
        values = []
        for t in tokens:
            try:
                if isinstance(t, bool):  # bool is an int subclass, but never a token id
                    raise TypeError
                values.append(operator.index(t))
            except TypeError:
                raise NinferError(f"tokens must be integers, got {t!r}") from None
        ids = torch.tensor(values, dtype=torch.long)
    if ids.numel() == 0:
        raise NinferError("tokens must not be empty")
    bad = ids[(ids < 0) | (ids >= vocab_rows)]
    if bad.numel():
        raise NinferError(f"token id {int(bad[0])} out of range [0, {vocab_rows})")
    return ids


class ReferenceModel:
    """Float32 reference of a `qwen3_5_hybrid` text model (plus MTP when the spec has it).

    `spec` is a resolved `ModelSpec`; `weights` any `WeightSource` over NInfer object names. Weights
    are bound once at construction (row views are zero-copy slices of their parents). The model
    runs on the weights' device (`self.device`, the embedding's): state, positions and token ids
    are created there. `layer_fn` (default `decoder_layer`) runs one layer; a caller may replace
    it, e.g. with `torch.compile(decoder_layer)` for decode (bench/bench_peers.py). `kv_dtype`: a
    KV format name (kernels/kv_cache/formats.py): every KV cache (the MTP head's too) stores what a
    cache of that format gives back (quantize -> dequantize of the bf16 rows); None: fp32 rows.
    """

    def __init__(self, spec, weights: WeightSource, kv_dtype: str | None = None):
        from ..kernels.kv_cache.reference import kv_roundtrip_fn

        self.spec = spec
        self.kv_roundtrip = None if kv_dtype is None else kv_roundtrip_fn(kv_dtype)
        self.source = weights
        self.dims = HybridDims.from_spec(spec)
        self.weights: TextWeights = load_text_weights(weights, spec, self.dims)
        self.device = self.weights.embedding.device
        self.layer_fn = decoder_layer
        self._mtp = None
        self.last_state: ModelState | None = None

    # -- state
    def new_state(self) -> ModelState:
        """A fresh state at position 0 (empty KV caches, zero conv and recurrent state)."""
        d = self.dims
        st = ModelState()
        for l, kind in enumerate(d.layer_kinds):
            if kind == "attention":
                st.kv[l] = KVCache.empty(d.kv_heads, d.head_dim, device=self.device, roundtrip=self.kv_roundtrip)
            else:
                st.gdn[l] = GDNState.empty(d.conv_kernel, d.conv_channels, d.gdn_v_heads, d.gdn_k_dim,
                                           d.gdn_v_dim, device=self.device)
        return st

    # -- forward
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: [T] -> [T, H] rows of text/token_embedding."""
        return self.weights.embedding[ids]

    def forward_hidden(self, tokens, state: ModelState) -> torch.Tensor:
        """Run all layers over `tokens` starting at `state.position`; updates `state` (KV, GDN,
        position, hidden, hidden_prenorm). Returns the final-norm hidden states [T, H]."""
        ids = _token_tensor(tokens, self.dims.vocab_rows).to(self.device)
        T = ids.shape[0]
        positions = torch.arange(state.position, state.position + T, device=self.device)
        x = self.embed(ids)                                            # x: [T, H]
        for l, w in enumerate(self.weights.layers):
            x = self.layer_fn(x, w, self.dims, cache=state.kv.get(l), gdn_state=state.gdn.get(l),
                              positions=positions)
        state.position += T
        state.hidden_prenorm = x
        state.hidden = rms_norm(x, self.weights.final_norm, self.dims.rms_eps)
        return state.hidden

    def prefill(self, tokens, state: ModelState | None = None) -> torch.Tensor:
        """Process `tokens` (list[int] or 1-D tensor) causally, continuing `state` (a fresh one when
        None; kept as `self.last_state`). Returns logits [T, vocab_rows] float32."""
        state = self.new_state() if state is None else state
        self.last_state = state
        hidden = self.forward_hidden(tokens, state)
        return linear(hidden, self.weights.output_head)                # [T, V]

    def decode(self, token: int, state: ModelState) -> torch.Tensor:
        """One token at `state.position`. Returns logits [vocab_rows]."""
        if isinstance(token, torch.Tensor):
            token = token.reshape(-1)
        else:
            token = [token]
        return self.prefill(token, state)[0]

    # -- MTP
    @property
    def mtp(self):
        """The MTP draft head (`mtp.MTPHead`) bound to this model's weights."""
        if self._mtp is None:
            from .mtp import MTPHead
            self._mtp = MTPHead(self)
        return self._mtp

    def mtp_logits(self, token_ids, target_hidden: torch.Tensor, mtp_state=None) -> torch.Tensor:
        """See `MTPHead.logits`."""
        return self.mtp.logits(token_ids, target_hidden, mtp_state)
