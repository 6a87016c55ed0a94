"""CPU path of the KV-cache append (`kv_append`): column t's k[t], v[t] [T, Hkv, D] are encoded in
the caches' format (identified from their dtypes and widths, formats.py) with the format's
reference codecs (reference.encode, vectorised over all columns) and written at
cache[slots[t], positions[t]] in place (codes, and scales for formats that have them). bf16 caches
take one fused C++ call where it builds (`torch_fused`), the same stores."""

from __future__ import annotations

import torch

from ...errors import RouteError
from . import formats as F
from .reference import encode, format_of
from .torch_fused import fused_append_bf16

__all__ = ["kv_append", "cache_format"]


_FORMATS: dict[tuple, F.KvFormat] = {}


def cache_format(k_cache, v_cache, k_scale, v_scale, head_dim: int) -> F.KvFormat:
    """The caches' KV format (one-line RouteError when none stores them); remembered per layout."""
    key = (int(head_dim),) + tuple(None if t is None else (t.dtype, int(t.shape[-1]))
                                   for t in (k_cache, v_cache, k_scale, v_scale))
    fmt = _FORMATS.get(key)
    if fmt is None:
        try:
            fmt = _FORMATS[key] = format_of(k_cache, v_cache, k_scale, v_scale, head_dim)
        except ValueError as exc:
            raise RouteError(f"kv cache (torch): {exc}") from None
    return fmt


def kv_append(k, v, positions, slots, k_cache, v_cache, k_scale=None, v_scale=None, workspace=None,
              **params) -> None:
    D = k.shape[-1]
    fmt = cache_format(k_cache, v_cache, k_scale, v_scale, D)
    if (fmt.k.kind == F.BF16 and fmt.v.kind == F.BF16 and k_scale is None and v_scale is None
            and fused_append_bf16(k, v, positions, slots, k_cache, v_cache)):
        return
    s, p = slots.long(), positions.long()
    for codec, x, cache, scale in ((fmt.k, k, k_cache, k_scale), (fmt.v, v, v_cache, v_scale)):
        if codec.kind == F.BF16:
            cache[s, p] = x.to(cache.dtype)
            continue
        codes, scales = encode(codec, x)
        cache[s, p] = codes.to(cache.dtype)
        if scale is not None:
            scale[s, p] = scales.to(scale.dtype)
