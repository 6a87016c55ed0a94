"""CPU path of the conv1d family for one decode column: one C++ function in place of ~15 small torch
ops, built once per machine by `torch_util.cpp_library` and loaded with ctypes.

Channel c of the input (x, or its channel ranges x0 | x1 | x2; bf16 or fp32, unit last stride):
the window is the slot's K-1 state rows then x (rows at negative positions zero), acc = sum over
taps j, in order, of window[j] * weight[j, c] (fp32, the torch path's fp32 weight; row by row, so
the loops vectorise), then SiLU as acc / (1 + exp(-acc)) (`torch_util.EXP_CPP`: torch's up to exp's
last bits) or none,
one rounding into `out`; the state becomes
the window's last K-1 rows (shifted in place, x rounded to the state's dtype). The torch path's
arithmetic. `fused_decode` returns False
(nothing done) where it does not apply (another dtype or layout) or where the library is None (no
compiler, NINFER_CPU_FUSED=0); the torch ops run then.
"""

from __future__ import annotations

import ctypes

import torch

from ..torch_util import BF16_CPP, EXP_CPP, PreparedCalls, cpp_function, loaded_once

__all__ = ["SOURCE", "fused_decode"]

SOURCE = BF16_CPP + EXP_CPP + r"""
// x: channels [0, w0) from x0, [w0, w0 + w1) from x1, the rest from x2 (x_bf16 for all); weight
// [K, C] fp32; state [K-1, C] (s_bf16), shifted in place; out [C] (out_bf16) = the sum over taps, tap
// by tap, in fp32, then x / (1 + exp(-x)) when silu, one rounding at the store
extern "C" int ninfer_conv1d_decode(int C, int K, const void* x0, int w0, const void* x1, int w1, const void* x2,
                                    int x_bf16, const float* weight, void* state, int s_bf16, long pos, void* out,
                                    int out_bf16, int silu) {
    if (K < 2) return 1;
    float* row = (float*)malloc(sizeof(float) * 2 * C);
    if (!row) return 2;
    float* acc = row + C;
    const int zero_rows = pos < K - 1 ? (int)(K - 1 - pos) : 0;  // window rows at negative positions
    const int es = s_bf16 ? 2 : 4;
    for (int c = 0; c < C; ++c) acc[c] = 0.f;
    for (int j = 0; j < K; ++j) {
        if (j < zero_rows) continue;
        if (j < K - 1) load((const char*)state + (long)j * C * es, s_bf16, C, row);
        else {
            load(x0, x_bf16, w0, row);
            if (w1) load(x1, x_bf16, w1, row + w0);
            if (C - w0 - w1) load(x2, x_bf16, C - w0 - w1, row + w0 + w1);
        }
        const float* w = weight + (long)j * C;
        for (int c = 0; c < C; ++c) acc[c] += row[c] * w[c];
    }
    // the state becomes the window's last K-1 rows: rows 1.. of the state (zero before position 0), then x
    for (int j = 0; j + 1 < K - 1; ++j) {
        char* dst = (char*)state + (long)j * C * es;
        if (j + 1 < zero_rows) memset(dst, 0, (size_t)C * es);
        else memcpy(dst, dst + (long)C * es, (size_t)C * es);
    }
    char* last = (char*)state + (long)(K - 2) * C * es;  // x, which `row` holds after the last tap
    if (s_bf16) for (int c = 0; c < C; ++c) ((uint16_t*)last)[c] = to_bf16(row[c]);
    else memcpy(last, row, sizeof(float) * C);
    if (silu) silu_inplace(acc, C);
    if (out_bf16) for (int c = 0; c < C; ++c) ((uint16_t*)out)[c] = to_bf16(acc[c]);
    else memcpy(out, acc, sizeof(float) * C);
    free(row);
    return 0;
}
"""

_IN = (torch.bfloat16, torch.float32)
_PREPARED = PreparedCalls()


def _load():
    p, i, l = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    return cpp_function("conv1d_cpu_fused", SOURCE, "conv1d decode runs as torch ops", "ninfer_conv1d_decode",
                        [i, i, p, i, p, i, p, i, p, p, i, l, p, i, i])


kernel = loaded_once(_load)  # the loaded function (built on first use), or None where it cannot run here


def _prepared(parts: tuple, w32: torch.Tensor, conv_state: torch.Tensor, out: torch.Tensor, silu: bool):
    """(the arguments before the state, the state's base pointer and slot stride in bytes, the arguments
    after the position) for these operands, or None where the fused call does not apply."""
    if len(parts) > 3 or w32.dim() != 2 or conv_state.dim() != 3:
        return None
    K, C = w32.shape
    dt = parts[0].dtype
    if (K < 2 or dt not in _IN or any(p.dtype != dt or p.stride(-1) != 1 for p in parts)
            or sum(p.shape[-1] for p in parts) != C or conv_state.dtype not in _IN
            or conv_state.shape[1:] != (K - 1, C) or conv_state.stride()[1:] != (C, 1)
            or out.dtype not in _IN or out.stride(-1) != 1 or out.numel() != C or not w32.is_contiguous()):
        return None
    ptrs = [p.data_ptr() for p in parts] + [None] * (3 - len(parts))
    widths = [p.shape[-1] for p in parts] + [0] * (3 - len(parts))
    return ((C, K, ptrs[0], widths[0], ptrs[1], widths[1], ptrs[2], int(dt == torch.bfloat16), w32.data_ptr()),
            conv_state.data_ptr(), conv_state.stride(0) * conv_state.element_size(), conv_state.shape[0],
            (int(conv_state.dtype == torch.bfloat16),), (out.data_ptr(), int(out.dtype == torch.bfloat16), int(silu)))


def fused_decode(parts: list, w32: torch.Tensor, conv_state: torch.Tensor, slot: int, pos: int, out: torch.Tensor,
                 silu: bool) -> bool:
    """One column: parts (1 to 3 [1, w] inputs, the channels in order), w32 [K, C] fp32, conv_state
    [slots, K-1, C] (row `slot` updated), out [1, C] (module doc); False where it does not apply. A
    launch's arguments are prepared once (`torch_util.PreparedCalls`)."""
    f = kernel()
    if f is None:
        return False
    parts = tuple(parts)
    prep = _PREPARED.get((*parts, w32, conv_state, out), (len(parts), silu),
                         lambda: _prepared(parts, w32, conv_state, out, silu))
    if prep is None or not 0 <= slot < prep[3]:
        return False
    head, base, slot_bytes, _, state_dtype, tail = prep
    rc = f(*head, base + slot * slot_bytes, *state_dtype, pos, *tail)
    if rc != 0:
        raise RuntimeError(f"conv1d (torch): the fused CPU step failed (K={head[1]}, code {rc})")
    return True
