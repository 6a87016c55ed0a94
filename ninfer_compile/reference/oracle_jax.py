"""Float64 JAX oracle for the hybrid text model and the MTP head.

An independent implementation of the model math (model doc §3-§7): it shares only the weight
binding (`weights.load_text_weights` / `load_mtp_weights`: which rows of which object mean what)
with the torch reference, and evaluates everything in float64 from the same float32 weights.
It is stateless — the whole sequence is processed at once (dense causal attention, padded causal
convolution, `lax.scan` over the delta rule written in its "decay then Householder-like" form) —
so it also checks the reference's cache/state handling.

`compare(...)` reports the relative L2 error of the torch reference (and optionally HF
transformers) against this oracle.
"""

from __future__ import annotations

from functools import partial

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from .weights import HybridDims, load_mtp_weights, load_text_weights  # noqa: E402


def _f64(t) -> jnp.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach().to(torch.float64).numpy()
    return jnp.asarray(np.asarray(t, dtype=np.float64))


def _tree64(obj):
    """Dataclass of torch tensors -> dict of float64 jnp arrays (recursively)."""
    if isinstance(obj, torch.Tensor):
        return _f64(obj)
    if isinstance(obj, list):
        return [_tree64(o) for o in obj]
    if hasattr(obj, "__dataclass_fields__"):
        # Non-tensor fields (a layer's `kind`) are static structure, not data: dropped here and
        # passed from `HybridDims.layer_kinds` so whole forwards can be jitted.
        return {k: _tree64(getattr(obj, k)) for k in obj.__dataclass_fields__
                if not isinstance(getattr(obj, k), str)}
    return obj


# ------------------------------------------------------------------------------ float64 math


def _norm(x, w, eps, unit_offset=True):
    scale = (1.0 + w) if unit_offset else w
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _silu(x):
    return x / (1.0 + jnp.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + jnp.exp(-x))


def _softplus(x):
    return jnp.logaddexp(x, 0.0)


def _rope(x, pos, rotary_dim, theta):
    """x: [T, heads, D]; NeoX pairs (i, i + rd/2) for i < rd/2 rotated by pos * theta^(-2i/rd)."""
    half = rotary_dim // 2
    freq = theta ** (-(2.0 * jnp.arange(half)) / rotary_dim)          # [half]
    ang = pos[:, None].astype(jnp.float64) * freq[None, :]             # [T, half]
    c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:rotary_dim]
    return jnp.concatenate([a * c - b * s, b * c + a * s, x[..., rotary_dim:]], axis=-1)


def _attention(h, w, pos, d: HybridDims):
    """Dense causal gated GQA over the whole sequence. h: [T, H] -> [T, H]."""
    T = h.shape[0]
    q = (h @ w["query"].T).reshape(T, d.attn_heads, d.head_dim)
    k = (h @ w["key"].T).reshape(T, d.kv_heads, d.head_dim)
    v = (h @ w["value"].T).reshape(T, d.kv_heads, d.head_dim)
    gate = h @ w["gate"].T
    q = _rope(_norm(q, w["query_norm"], d.rms_eps), pos, d.rotary_dim, d.rope_theta)
    k = _rope(_norm(k, w["key_norm"], d.rms_eps), pos, d.rotary_dim, d.rope_theta)
    kv_of = jnp.arange(d.attn_heads) // (d.attn_heads // d.kv_heads)   # query head -> KV head
    kh, vh = k[:, kv_of], v[:, kv_of]                                   # [T, Hq, D]
    logits = jnp.einsum("ihd,jhd->hij", q, kh) * (d.head_dim ** -0.5)   # [Hq, T, T]
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    logits = jnp.where(causal[None], logits, -jnp.inf)
    logits = logits - jnp.max(logits, axis=-1, keepdims=True)
    p = jnp.exp(logits)
    p = p / jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("hij,jhd->ihd", p, vh).reshape(T, -1)
    return (o * _sigmoid(gate)) @ w["output"].T


def _gdn(h, w, d: HybridDims):
    """Gated DeltaNet over the whole sequence from zero state. h: [T, H] -> [T, H]."""
    T = h.shape[0]
    x = jnp.concatenate([h @ w["query"].T, h @ w["key"].T, h @ w["value"].T], axis=-1)   # [T, C]
    K = d.conv_kernel
    xp = jnp.concatenate([jnp.zeros((K - 1, x.shape[1])), x], axis=0)
    # out[t, c] = sum_j conv[j, c] * x[t - (K-1) + j, c]
    conv = sum(w["convolution"][j][None, :] * xp[j:j + T] for j in range(K))
    x = _silu(conv)
    kw = d.gdn_k_heads * d.gdn_k_dim
    q = x[:, :kw].reshape(T, d.gdn_k_heads, d.gdn_k_dim)
    k = x[:, kw:2 * kw].reshape(T, d.gdn_k_heads, d.gdn_k_dim)
    v = x[:, 2 * kw:].reshape(T, d.gdn_v_heads, d.gdn_v_dim)
    q = q / jnp.sqrt(jnp.sum(q * q, axis=-1, keepdims=True) + d.l2_eps)
    k = k / jnp.sqrt(jnp.sum(k * k, axis=-1, keepdims=True) + d.l2_eps)
    qk_of = jnp.arange(d.gdn_v_heads) // (d.gdn_v_heads // d.gdn_k_heads)   # V head -> Q/K head
    q, k = q[:, qk_of] * (d.gdn_k_dim ** -0.5), k[:, qk_of]                 # [T, Hv, Dk]
    decay = jnp.exp(-jnp.exp(w["a_log"]) * _softplus(h @ w["a"].T + w["dt_bias"]))   # [T, Hv]
    beta = _sigmoid(h @ w["b"].T)                                                     # [T, Hv]

    def step(S, inp):
        qt, kt, vt, at, bt = inp                      # [Hv,Dk] [Hv,Dk] [Hv,Dv] [Hv] [Hv]
        # S' = a (I - b k k^T) S + b k v^T   (== decay, predict, correct)
        kS = jnp.einsum("hk,hkv->hv", kt, S)
        S = at[:, None, None] * (S - bt[:, None, None] * kt[:, :, None] * kS[:, None, :]) \
            + bt[:, None, None] * kt[:, :, None] * vt[:, None, :]
        return S, jnp.einsum("hk,hkv->hv", qt, S)

    S0 = jnp.zeros((d.gdn_v_heads, d.gdn_k_dim, d.gdn_v_dim))
    _, o = jax.lax.scan(step, S0, (q, k, v, decay, beta))        # o: [T, Hv, Dv]
    z = (h @ w["z"].T).reshape(T, d.gdn_v_heads, d.gdn_v_dim)
    o = _norm(o, w["norm"], d.rms_eps, unit_offset=False) * _silu(z)
    return o.reshape(T, -1) @ w["output"].T


def _layer(x, w, kind, pos, d: HybridDims):
    h = _norm(x, w["input_norm"], d.rms_eps)
    x = x + (_attention(h, w["attention"], pos, d) if kind == "attention" else _gdn(h, w["gdn"], d))
    h = _norm(x, w["post_attention_norm"], d.rms_eps)
    return x + (_silu(h @ w["mlp_gate"].T) * (h @ w["mlp_up"].T)) @ w["mlp_down"].T


@partial(jax.jit, static_argnums=(2,))
def _text_hidden(w, ids, d: HybridDims):
    """Final-norm hidden states [T, H] for token ids [T] from position 0 (one compiled program)."""
    x = w["embedding"][ids]
    pos = jnp.arange(ids.shape[0])
    for lw, kind in zip(w["layers"], d.layer_kinds):
        x = _layer(x, lw, kind, pos, d)
    return _norm(x, w["final_norm"], d.rms_eps)


@partial(jax.jit, static_argnums=(5,))
def _mtp_logits(w, text, ids, target_hidden, pos, d: HybridDims):
    e = _norm(text["embedding"][ids], w["embedding_norm"], d.rms_eps)
    h = _norm(target_hidden, w["hidden_norm"], d.rms_eps)
    x = jnp.concatenate([e, h], axis=-1) @ w["input_projection"].T
    x = _layer(x, w["layer"], "attention", pos, d)
    return _norm(x, w["final_norm"], d.rms_eps) @ text["output_head"].T


# ------------------------------------------------------------------------------ public API


class Oracle:
    """Float64 oracle bound to a spec and a weight source (weights converted once)."""

    def __init__(self, spec, weights):
        self.spec, self.source = spec, weights
        self.dims = HybridDims.from_spec(spec)
        self.text = _tree64(load_text_weights(weights, spec, self.dims))
        self._mtp = None

    def hidden(self, tokens) -> np.ndarray:
        """Final-norm hidden states [T, H] float64 for the whole sequence from position 0."""
        return np.asarray(_text_hidden(self.text, jnp.asarray(_ids(tokens)), self.dims))

    def logits(self, tokens) -> np.ndarray:
        """Logits [T, vocab_rows] float64."""
        return self.hidden(tokens) @ np.asarray(self.text["output_head"]).T

    def mtp_logits(self, token_ids, target_hidden, positions=None) -> np.ndarray:
        """MTP draft logits [T, vocab_rows] float64 for T columns from an empty MTP cache.
        Column i: token_ids[i] with target_hidden[i] at position positions[i] (default i)."""
        if self._mtp is None:
            self._mtp = _tree64(load_mtp_weights(self.source, self.spec, self.dims))
        ids = _ids(token_ids)
        pos = np.arange(len(ids)) if positions is None else np.asarray(positions)
        return np.asarray(_mtp_logits(self._mtp, self.text, jnp.asarray(ids), _f64(target_hidden),
                                      jnp.asarray(pos), self.dims))


def _ids(tokens) -> np.ndarray:
    return np.asarray(tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens), dtype=np.int64)


def rel_l2(x, ref) -> float:
    """||x - ref|| / ||ref|| in float64."""
    x = np.asarray(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def compare(spec, weights, tokens, *, hf_model=None, reference=None) -> dict[str, float]:
    """Error of the torch reference (and HF transformers, when `hf_model` is given) vs the oracle.

    Returns {"reference_rel_l2", "reference_argmax_agree", ["hf_rel_l2", "hf_argmax_agree"]}, the
    argmax fields being the fraction of positions whose argmax equals the oracle's.
    """
    from .model import ReferenceModel

    tokens = list(tokens)
    oracle = Oracle(spec, weights).logits(tokens)
    ref_model = reference or ReferenceModel(spec, weights)
    with torch.no_grad():
        ours = ref_model.prefill(tokens).numpy()
    out = {
        "reference_rel_l2": rel_l2(ours, oracle),
        "reference_argmax_agree": float(np.mean(ours.argmax(-1) == oracle.argmax(-1))),
    }
    if hf_model is not None:
        with torch.no_grad():
            hf = hf_model(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()
        out["hf_rel_l2"] = rel_l2(hf, oracle)
        out["hf_argmax_agree"] = float(np.mean(hf.argmax(-1) == oracle.argmax(-1)))
    return out
