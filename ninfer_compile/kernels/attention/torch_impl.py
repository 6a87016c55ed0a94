"""CPU path of gated GQA attention over the KV cache (routes attention_decode_splitkv,
attention_verify_packed, attention_prefill_flash), with the launchers' arguments.

Column t (query head h, KV head h // (Hq / Hkv)) attends to its slot's cache rows 0..positions[t]
(its own K/V already appended): out[t, h] = softmax(scale * q.K^T) V * sigmoid(gate[t, h]).
Columns are grouped by slot (at most the step's slots: a short loop); each group reads its slot's
cache prefix once, decoded to fp32 from the caches' KV format (a rotated K stays rotated and q is
rotated instead, as the kernels do), and runs one masked fp32 `scaled_dot_product_attention`
(long prefills in query blocks); a single column (decode at C = 1) runs plain fp32 matmuls. One rounding at the store.
Few columns over a bf16 cache take one fused C++ call where it builds (`torch_fused`). Route params, `window` and the
workspace are accepted and not needed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as TF

from ..kv_cache.reference import decode, hadamard
from ..kv_cache.formats import BF16
from ..kv_cache.torch_impl import cache_format
from .torch_fused import fused_attention

__all__ = ["attention"]

QUERY_BLOCK = 1024  # query columns per masked attention call (bounds the mask); 4-D inputs take torch's
# fused CPU attention kernel (3-D ones a slower path)
_HADAMARD: dict[int, torch.Tensor] = {}


def _rotate(x: torch.Tensor, block: int) -> torch.Tensor:
    if not block:
        return x
    h = _HADAMARD.get(block)
    if h is None:
        h = _HADAMARD[block] = hadamard(block)
    d = x.shape[-1]
    return (x.reshape(*x.shape[:-1], d // block, block) @ h).reshape(x.shape)


def _prefix(codec, cache, scale, slot: int, n: int, d: int) -> torch.Tensor:
    """fp32 [n, Hkv, D] rows 0..n-1 of one slot, in the stored basis."""
    return decode(codec, cache[slot, :n], None if scale is None else scale[slot, :n], d, unrotate=False)


def attention(q, gate, k_cache, v_cache, positions, slots, out, scale=None, workspace=None, k_scale=None,
              v_scale=None, window=None, **params) -> None:
    T, Hq, D = q.shape
    fmt = cache_format(k_cache, v_cache, k_scale, v_scale, D)
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if (fmt.k.kind == BF16 and fmt.v.kind == BF16 and k_scale is None and v_scale is None
            and not fmt.k.rotation_size(D) and not fmt.v.rotation_size(D)
            and fused_attention(q, gate, k_cache, v_cache, positions, slots, out, sc)):
        return
    qf = _rotate(q.float(), fmt.k.rotation_size(D))
    vrot = fmt.v.rotation_size(D)
    if T == 1:  # one column: every cache row up to its position, no mask; plain matmuls (cheaper than
        # the fused attention call at one query)
        s, n = int(slots.tolist()[0]), int(positions.tolist()[0]) + 1
        K = _prefix(fmt.k, k_cache, k_scale, s, n, D)                       # [n, Hkv, D]
        V = _rotate(_prefix(fmt.v, v_cache, v_scale, s, n, D), vrot)
        Hkv = K.shape[1]
        scores = (qf.reshape(Hkv, Hq // Hkv, D) @ K.permute(1, 2, 0)).mul_(sc)  # [Hkv, G, n]
        o = torch.softmax(scores, dim=-1) @ V.transpose(0, 1)               # [Hkv, G, D]
        out.view(1, Hq, D).copy_(o.view(1, Hq, D) * torch.sigmoid(gate.float()))
        return
    slot_list, pos = slots.tolist(), positions.long()
    groups: dict[int, list[int]] = {}
    for t, s in enumerate(slot_list):
        groups.setdefault(s, []).append(t)
    out3 = out.view(T, Hq, D)
    for s, cols in groups.items():
        whole = len(cols) == T
        idx = None if whole else torch.tensor(cols, dtype=torch.long, device=q.device)
        p = pos if whole else pos[idx]
        n = int(p.max()) + 1
        K = _prefix(fmt.k, k_cache, k_scale, s, n, D).transpose(0, 1)       # [Hkv, n, D]
        V = _prefix(fmt.v, v_cache, v_scale, s, n, D)
        V = _rotate(V, vrot).transpose(0, 1)
        qs = (qf if whole else qf[idx]).transpose(0, 1)                     # [Hq, m, D]
        m = qs.shape[1]
        o = torch.empty(Hq, m, D, dtype=torch.float32, device=q.device)
        keys = torch.arange(n, device=q.device)
        for a in range(0, m, QUERY_BLOCK):
            b = min(m, a + QUERY_BLOCK)
            mask = keys[None, :] <= p[a:b, None]                             # [b - a, n]
            o[:, a:b] = TF.scaled_dot_product_attention(qs[None, :, a:b], K[None], V[None], attn_mask=mask,
                                                        scale=sc, enable_gqa=Hq != K.shape[0])[0]
        g = gate if whole else gate[idx]
        res = o.transpose(0, 1) * torch.sigmoid(g.float())
        if whole:
            out3.copy_(res)
        else:
            out3[idx] = res.to(out.dtype)
