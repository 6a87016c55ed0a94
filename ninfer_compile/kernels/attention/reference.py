"""fp32 PyTorch reference of gated GQA attention over a KV cache.

q, gate: [T, Hq, D]; caches of any KV format (kv_cache/formats.py: codes [slots, max_ctx, Hkv, width]
+ scales); positions, slots: [T] int. Column t (query head h, KV head h // (Hq/Hkv))
attends to its slot's cache rows 0..positions[t] inclusive (its own K/V already appended):
    out[t, h] = softmax(scale * q . K^T) V * sigmoid(gate[t, h])
Returns out [T, Hq * D] float32. A quantized format's oracle uses the dequantised cache values in the
original basis (a rotated K rotated back: the same scores as the kernels' rotated Q against the
rotated K).
"""

from __future__ import annotations

import torch

from ..kv_cache.reference import kv_as_float


def attention(q, gate, k_cache, v_cache, positions, slots, scale, k_scale=None, v_scale=None):
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    rep = Hq // Hkv
    kc, vc = kv_as_float(k_cache, v_cache, k_scale, v_scale, D)  # [slots, ctx, Hkv, D] float32
    out = torch.empty(T, Hq, D, dtype=torch.float32)
    for t in range(T):
        s, p = int(slots[t]), int(positions[t])
        K = kc[s, : p + 1].repeat_interleave(rep, dim=1)  # [n, Hq, D]
        V = vc[s, : p + 1].repeat_interleave(rep, dim=1)
        sc = torch.einsum("hd,nhd->hn", q[t].float(), K) * scale
        pr = torch.softmax(sc, dim=-1)
        out[t] = torch.einsum("hn,nhd->hd", pr, V) * torch.sigmoid(gate[t].float())
    return out.reshape(T, Hq * D)
