"""Launcher of the KV-cache append (preallocated caches, no allocation, return None)."""

from __future__ import annotations

import torch
import triton

from ninfer_compile.errors import RouteError

from .kernels import kv_append_kernel
from ..pdl import pdl_launch


def check_cache(name: str, k_cache, v_cache, k_scale, v_scale, Hkv: int, D: int) -> bool:
    """Validate a cache pair; returns True for int8-g64, False for bf16."""
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4 or k_cache.shape[2:] != (Hkv, D):
        raise RouteError(f"{name}: caches must be [slots, max_ctx, {Hkv}, {D}], got "
                         f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise RouteError(f"{name}: caches must be contiguous")
    if k_cache.dtype == torch.int8:
        if D % 64:
            raise RouteError(f"{name}: int8-g64 cache needs D % 64 == 0 (D={D})")
        want = (*k_cache.shape[:3], D // 64)
        for n, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
            if sc is None or sc.shape != want or sc.dtype != torch.float16 or not sc.is_contiguous():
                raise RouteError(f"{name}: {n} must be contiguous float16 {list(want)}")
        return True
    if k_cache.dtype != torch.bfloat16 or v_cache.dtype != torch.bfloat16:
        raise RouteError(f"{name}: cache dtype must be bfloat16 or int8, got {k_cache.dtype}")
    return False


def kv_append(k, v, positions, slots, k_cache, v_cache, k_scale=None, v_scale=None) -> None:
    """Write k[T,Hkv,D], v[T,Hkv,D] at cache[slots[t], positions[t]] (bf16 copy or int8-g64)."""
    T, Hkv, D = k.shape
    if v.shape != k.shape or positions.shape != (T,) or slots.shape != (T,):
        raise RouteError(f"kv_append: shapes k{tuple(k.shape)} v{tuple(v.shape)}; positions/slots must be [T]")
    if k.stride(2) != 1 or v.stride(2) != 1:
        raise RouteError("kv_append: k and v must have a contiguous last axis")
    quant = check_cache("kv_append", k_cache, v_cache, k_scale, v_scale, Hkv, D)
    ng = triton.next_power_of_2(triton.cdiv(D, 64))
    kv_append_kernel[(T, Hkv)](
        k, v, k_cache, v_cache, k_scale if quant else k_cache, v_scale if quant else v_cache,
        positions, slots, Hkv, D, k_cache.shape[1],
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        QUANT=quant, NG=ng, GL=64, num_warps=2,
        **pdl_launch(kv_append_kernel),
    )
