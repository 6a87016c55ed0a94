"""Launcher of the KV-cache append (preallocated caches, no allocation, return None).

The caches' format (formats.py) is read from their dtypes and widths (`cache_format`): bf16 and
int8-g64 run the original kernel, every other format `kv_append_codec_kernel` with its K and V
codecs as constexprs."""

from __future__ import annotations

import math

import torch
import triton

from ninfer_compile.errors import RouteError

from . import formats as F
from .kernels import kv_append_codec_kernel, kv_append_kernel
from ..pdl import pdl_launch

_NAME = {torch.bfloat16: "bf16", torch.int8: "i8", torch.uint8: "u8", torch.float16: "f16"}


def _plane(t):
    return None if t is None else (_NAME.get(t.dtype, str(t.dtype).replace("torch.", "")), int(t.shape[-1]))


def cache_format(name: str, k_cache, v_cache, k_scale, v_scale, Hkv: int, D: int) -> F.KvFormat:
    """Validate a cache set for head width D; returns its format (formats.py)."""
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[:3] != v_cache.shape[:3] or k_cache.shape[2] != Hkv:
        raise RouteError(f"{name}: caches must be [slots, max_ctx, {Hkv}, width], got "
                         f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise RouteError(f"{name}: caches must be contiguous")
    if k_cache.dtype == torch.int8 and D % 64:
        raise RouteError(f"{name}: int8-g64 cache needs D % 64 == 0 (D={D})")
    if k_cache.dtype not in (torch.bfloat16, torch.int8, torch.uint8):
        raise RouteError(f"{name}: cache dtype must be bfloat16, int8 or uint8 (a KV format's codes), "
                         f"got {k_cache.dtype}")
    if (k_scale is None) != (v_scale is None):
        raise RouteError(f"{name}: k_scale and v_scale come together")
    fmt = F.identify(D, _plane(k_cache), _plane(v_cache), _plane(k_scale), _plane(v_scale))
    if fmt is None:
        raise RouteError(f"{name}: no KV format stores head width {D} as k {_plane(k_cache)} v {_plane(v_cache)} "
                         f"scales {_plane(k_scale)} / {_plane(v_scale)} (formats: {', '.join(F.KV_DTYPES)})")
    for n, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if sc is not None and (sc.dim() != 4 or sc.shape[:3] != k_cache.shape[:3] or not sc.is_contiguous()):
            raise RouteError(f"{name}: {n} must be contiguous [{', '.join(map(str, k_cache.shape[:3]))}, width], "
                             f"got {tuple(sc.shape)}")
    return fmt


def codec_args(fmt: F.KvFormat, D: int, bd: int) -> dict:
    """Runtime scalars + constexprs of the format's codecs for the kernels (scales per row, the
    rotation's 1/sqrt(n), kinds, groups, Q / K rotation block)."""
    k = F.codec_constexprs(fmt.k, D, bd)
    v = F.codec_constexprs(fmt.v, D, bd)
    return {"NSCK": max(1, fmt.k.scale_width(D)), "NSCV": max(1, fmt.v.scale_width(D)),
            "k_rot_norm": 1.0 / math.sqrt(k["rot"]) if k["rot"] else 1.0,
            "KKIND": k["kind"], "KGROUP": k["group"], "KROT": k["rot"], "VKIND": v["kind"], "VGROUP": v["group"]}


def kv_append(k, v, positions, slots, k_cache, v_cache, k_scale=None, v_scale=None) -> None:
    """Write k[T,Hkv,D], v[T,Hkv,D] at cache[slots[t], positions[t]] in the caches' format."""
    T, Hkv, D = k.shape
    if v.shape != k.shape or positions.shape != (T,) or slots.shape != (T,):
        raise RouteError(f"kv_append: shapes k{tuple(k.shape)} v{tuple(v.shape)}; positions/slots must be [T]")
    if k.stride(2) != 1 or v.stride(2) != 1:
        raise RouteError("kv_append: k and v must have a contiguous last axis")
    fmt = cache_format("kv_append", k_cache, v_cache, k_scale, v_scale, Hkv, D)
    if fmt.name in ("bf16", "int8"):
        quant = fmt.name == "int8"
        ng = triton.next_power_of_2(triton.cdiv(D, 64))
        kv_append_kernel[(T, Hkv)](
            k, v, k_cache, v_cache, k_scale if quant else k_cache, v_scale if quant else v_cache,
            positions, slots, Hkv, D, k_cache.shape[1],
            k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            QUANT=quant, NG=ng, GL=64, num_warps=2,
            **pdl_launch(kv_append_kernel),
        )
        return
    bd = max(16, triton.next_power_of_2(D))
    a = codec_args(fmt, D, bd)
    kv_append_codec_kernel[(T, Hkv)](
        k, v, k_cache, v_cache, k_scale, v_scale, positions, slots,
        Hkv, D, k_cache.shape[1], a["NSCK"], a["NSCV"], a["k_rot_norm"],
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        KKIND=a["KKIND"], KGROUP=a["KGROUP"], KROT=a["KROT"], VKIND=a["VKIND"], VGROUP=a["VGROUP"], BD=bd,
        num_warps=2, **pdl_launch(kv_append_codec_kernel),
    )
