"""Launchers of gated GQA attention over the KV cache (preallocated outputs; return None).

attention_decode   T <= DECODE_MAX_T columns, each with its own slot/position (columns may share a
                   slot, e.g. verification); split-KV over SPLIT-row slices of the cache. With more
                   than one split it needs a float32 workspace of decode_workspace_numel(...).
attention_verify   verify rows (T = rows x window W, each row W consecutive positions of one slot): the
                   row's W columns share one pass over its cache rows (query heads packed per KV head);
                   the same split-KV workspace and reduce as attention_decode.
attention_prefill  any T columns of ONE sequence (slot slots[0], consecutive positions), after
                   kv_append has written their K/V: each attends causally to cache rows 0..pos.
"""

from __future__ import annotations

import math

import torch
import triton

from ninfer_compile.errors import RouteError

from ..kv_cache.launch import cache_format, codec_args
from .kernels import LOG2E, attn_decode_kernel, attn_decode_reduce_kernel, attn_prefill_kernel, attn_verify_kernel
from ..pdl import pdl_launch
from .routes import decode_workspace_numel  # noqa: F401  (the route's sizing; the launcher checks it)
from ..interpret import interpreting as _interpreting

DECODE_MAX_T = 128  # no kernel limit (grid axis 0 = columns); a verify extent has up to 8 x 9 columns


def _check(name, q, gate, k_cache, v_cache, k_scale, v_scale, positions, slots, out):
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2] if k_cache.dim() == 4 else -1
    if gate.shape != q.shape or out.shape != (T, Hq * D) or Hkv <= 0 or Hq % Hkv:
        raise RouteError(f"{name}: shapes q{tuple(q.shape)} gate{tuple(gate.shape)} out{tuple(out.shape)} "
                         f"cache{tuple(k_cache.shape)} (Hq must be a multiple of Hkv)")
    if positions.shape != (T,) or slots.shape != (T,):
        raise RouteError(f"{name}: positions/slots must be [T={T}] int32")
    for n, t in (("q", q), ("gate", gate), ("out", out)):
        if t.stride(-1) != 1:
            raise RouteError(f"{name}: operand {n} must have a contiguous last axis")
    fmt = cache_format(name, k_cache, v_cache, k_scale, v_scale, Hkv, D)
    return T, Hq, D, Hkv, fmt


def _codec_launch_args(fmt, D: int, bd: int) -> tuple[tuple, dict]:
    """(runtime scalars NSCK, NSCV, rot_norm; constexprs) of the caches' format for the kernels."""
    a = codec_args(fmt, D, bd)
    return ((a["NSCK"], a["NSCV"], a["k_rot_norm"]),
            {"KKIND": a["KKIND"], "KGROUP": a["KGROUP"], "VKIND": a["VKIND"], "VGROUP": a["VGROUP"],
             "ROT": a["KROT"]})


def decode_splits(max_ctx: int, split_tokens: int) -> int:
    return triton.cdiv(max_ctx, split_tokens)


def _split_setup(name, T, Hq, D, k_cache, workspace, split_tokens, block_n, balance):
    """(max_ctx, splits, direct) of a split-KV launch, the workspace checked; one-line RouteErrors."""
    if not 1 <= T <= DECODE_MAX_T:
        raise RouteError(f"{name}: T={T} outside the route domain [1, {DECODE_MAX_T}]")
    if split_tokens % block_n:
        raise RouteError(f"{name}: split_tokens {split_tokens} must be a multiple of block_n {block_n}")
    if balance not in ("fixed", "ctx"):
        raise RouteError(f"{name}: balance must be 'fixed' or 'ctx', got {balance!r}")
    max_ctx = k_cache.shape[1]
    ns = decode_splits(max_ctx, split_tokens)
    if ns > 1:
        need = decode_workspace_numel(T, Hq, D, max_ctx, split_tokens)
        if workspace is None or workspace.dtype != torch.float32 or workspace.numel() < need:
            raise RouteError(f"{name}: needs a float32 workspace of >= {need} elements")
    return max_ctx, ns, ns == 1


def attention_decode(q, gate, k_cache, v_cache, positions, slots, out, scale=None, workspace=None,
                     k_scale=None, v_scale=None, split_tokens: int = 512, block_n: int = 64,
                     num_warps: int = 4, balance: str = "ctx", window: int | None = None) -> None:
    """out[T, Hq*D] = attention of q[T,Hq,D] over each column's slot prefix, x sigmoid(gate).
    balance: "fixed" = splits of split_tokens cache rows; "ctx" = each column's depth spread over
    all cdiv(max_ctx, split_tokens) splits (kernels.py). `window` (a verify op's row width) is
    accepted and not needed: every column is its own program here."""
    T, Hq, D, Hkv, fmt = _check("attention_decode", q, gate, k_cache, v_cache, k_scale, v_scale,
                                positions, slots, out)
    quant = fmt.name != "bf16"
    max_ctx, ns, direct = _split_setup("attention_decode", T, Hq, D, k_cache, workspace, split_tokens, block_n,
                                       balance)
    balanced = balance == "ctx"
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    G = Hq // Hkv
    gp = max(16, triton.next_power_of_2(G))
    bd = max(16, triton.next_power_of_2(D))
    ws = out if direct else workspace
    ksc = k_scale if quant else k_cache
    vsc = v_scale if quant else v_cache
    rt, ce = _codec_launch_args(fmt, D, bd)
    attn_decode_kernel[(T, Hkv, ns)](
        q, gate, k_cache, v_cache, ksc, vsc, positions, slots, out, ws,
        Hq, Hkv, G, D, max_ctx, scale * LOG2E,
        q.stride(0), q.stride(1), gate.stride(0), gate.stride(1), out.stride(0),
        ns, split_tokens, *rt,
        GP=gp, BD=bd, BN=block_n, DIRECT=direct, F32=_interpreting(), BALANCED=balanced, **ce,
        num_warps=num_warps,
        **pdl_launch(attn_decode_kernel),
    )
    if not direct:
        _reduce(gate, positions, out, workspace, T, Hq, D, ns, split_tokens, bd, block_n, balanced)


def attention_verify(q, gate, k_cache, v_cache, positions, slots, out, scale=None, workspace=None,
                     k_scale=None, v_scale=None, window: int | None = None, split_tokens: int = 512,
                     block_n: int = 64, num_warps: int = 8, balance: str = "ctx") -> None:
    """Verify rows: T = R x window columns, row r = columns r*W .. r*W+W-1 of one slot at consecutive
    positions (docs/SPECULATIVE.md); out as attention_decode. The W x G query heads of a row and KV
    head are one program's dot rows, so each cache row is read once per row, not once per column."""
    name = "attention_verify"
    T, Hq, D, Hkv, fmt = _check(name, q, gate, k_cache, v_cache, k_scale, v_scale, positions, slots, out)
    if not isinstance(window, int) or isinstance(window, bool) or window < 2:
        raise RouteError(f"{name}: needs the verify op's window W >= 2 (attribute window), got {window!r}")
    if T % window:
        raise RouteError(f"{name}: T={T} is not a multiple of window {window}")
    quant = fmt.name != "bf16"
    max_ctx, ns, direct = _split_setup(name, T, Hq, D, k_cache, workspace, split_tokens, block_n, balance)
    balanced = balance == "ctx"
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    G = Hq // Hkv
    mp = max(16, triton.next_power_of_2(window * G))
    bd = max(16, triton.next_power_of_2(D))
    rt, ce = _codec_launch_args(fmt, D, bd)
    attn_verify_kernel[(T // window, Hkv, ns)](
        q, gate, k_cache, v_cache, k_scale if quant else k_cache, v_scale if quant else v_cache,
        positions, slots, out, out if direct else workspace,
        Hq, Hkv, G, D, max_ctx, scale * LOG2E,
        q.stride(0), q.stride(1), gate.stride(0), gate.stride(1), out.stride(0),
        ns, split_tokens, *rt,
        W=window, MP=mp, BD=bd, BN=block_n, DIRECT=direct, F32=_interpreting(), BALANCED=balanced, **ce,
        num_warps=num_warps,
        **pdl_launch(attn_verify_kernel),
    )
    if not direct:
        _reduce(gate, positions, out, workspace, T, Hq, D, ns, split_tokens, bd, block_n, balanced)


def _reduce(gate, positions, out, workspace, T, Hq, D, ns, split_tokens, bd, block_n, balanced):
    """Merge the split partials of every column (grid (T, Hq)), gate, store."""
    attn_decode_reduce_kernel[(T, Hq)](
        gate, positions, out, workspace, Hq, D, gate.stride(0), gate.stride(1), out.stride(0),
        ns, split_tokens, BD=bd, BS=16, BN=block_n, BALANCED=balanced, num_warps=4,
        **pdl_launch(attn_decode_reduce_kernel),
    )


def attention_prefill(q, gate, k_cache, v_cache, positions, slots, out, scale=None,
                      k_scale=None, v_scale=None, block_m: int = 64, block_n: int = 32,
                      num_warps: int = 8, window: int | None = None) -> None:
    """Causal flash attention of T columns of one sequence over its cache prefix (any T). `window`
    (the family's verify attribute) is never set on a prefill op; accepted as the spec lists it."""
    T, Hq, D, Hkv, fmt = _check("attention_prefill", q, gate, k_cache, v_cache, k_scale, v_scale,
                                positions, slots, out)
    quant = fmt.name != "bf16"
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    bd = max(16, triton.next_power_of_2(D))
    bm = min(block_m, max(16, triton.next_power_of_2(T)))
    rt, ce = _codec_launch_args(fmt, D, bd)
    attn_prefill_kernel[(triton.cdiv(T, bm), Hq)](
        q, gate, k_cache, v_cache, k_scale if quant else k_cache, v_scale if quant else v_cache,
        positions, slots, out, T, Hkv, Hq // Hkv, D, k_cache.shape[1], scale * LOG2E,
        q.stride(0), q.stride(1), gate.stride(0), gate.stride(1), out.stride(0), *rt,
        BM=bm, BN=block_n, BD=bd, F32=_interpreting(), num_warps=num_warps, **ce,
        **pdl_launch(attn_prefill_kernel),
    )
