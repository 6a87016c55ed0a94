"""CPU path of qk_norm_rope for few columns: one C++ function in place of ~30 small torch ops, built
once per machine by `torch_util.cpp_library` and loaded with ctypes.

Per column t and head (q's heads, then k's; bf16 or fp32 in / out, unit last stride, element strides
per column and head): y = x * (1 / sqrt(sum(x^2) / D + eps)) * w (w: the torch path's fp32 1 + w),
then the partial NeoX rotation of dims [0, r) by the fp32 angles positions[t] * inv_freq[i]
(the torch path's inverse frequencies): y1' = y1 cos - y2 sin, y2' = y2 cos + y1 sin; stored once
(bf16 rounded to nearest even). A head is read whole before it is written, so outputs may alias
their inputs. The torch ops' arithmetic up to fp32 summation order and cosf / sinf's last bits.
`fused_qk_norm_rope` returns False (nothing done) where it does not apply (another dtype or layout,
more than MAX_COLUMNS columns) or where the library is None (no compiler, NINFER_CPU_FUSED=0).
"""

from __future__ import annotations

import ctypes

import torch

from ..torch_util import BF16_CPP, cpp_function, loaded_once

__all__ = ["SOURCE", "fused_qk_norm_rope", "MAX_COLUMNS"]

MAX_COLUMNS = 64  # more columns (prefill): torch's vectorised ops
SOURCE = BF16_CPP + r"""enum { MAXD = 1024 };

// heads [0, hn) of n columns: x element (c, h, d) at c * x_col + h * x_head + d, out likewise
static void norm_rotate(int n, int hn, int D, int rot, const void* x, int x_bf16, long x_col, long x_head,
                        const float* w, void* out, int o_bf16, long o_col, long o_head, const float* cs,
                        float eps) {
    float y[MAXD];
    const int half = rot / 2;
    for (int c = 0; c < n; ++c) {
        const float* cosv = cs + (long)c * rot;
        const float* sinv = cosv + half;
        for (int h = 0; h < hn; ++h) {
            load((const char*)x + (c * x_col + h * x_head) * (x_bf16 ? 2 : 4), x_bf16, D, y);
            float ss = 0.f;
            for (int d = 0; d < D; ++d) ss += y[d] * y[d];
            const float r = 1.f / sqrtf(ss / (float)D + eps);
            for (int d = 0; d < D; ++d) y[d] = y[d] * r * w[d];
            for (int i = 0; i < half; ++i) {
                const float a = y[i], b = y[i + half];
                y[i] = a * cosv[i] - b * sinv[i];
                y[i + half] = b * cosv[i] + a * sinv[i];
            }
            char* o = (char*)out + (c * o_col + h * o_head) * (o_bf16 ? 2 : 4);
            if (o_bf16) for (int d = 0; d < D; ++d) ((uint16_t*)o)[d] = to_bf16(y[d]);
            else memcpy(o, y, sizeof(float) * D);
        }
    }
}

// q [n, hq, D], k [n, hk, D] -> q_out, k_out (may alias them); pos [n] (int32, or int64 when pos64)
extern "C" int ninfer_qk_norm_rope(int n, int hq, int hk, int D, int rot, const void* q, const void* k, int in_bf16,
                                   long q_col, long q_head, long k_col, long k_head, const float* qw,
                                   const float* kw, const void* pos, int pos64, const float* inv_freq, void* q_out,
                                   void* k_out, int out_bf16, long qo_col, long qo_head, long ko_col, long ko_head,
                                   float eps) {
    if (D > MAXD || rot > D || rot % 2) return 1;
    const int half = rot / 2;
    float* cs = (float*)malloc(sizeof(float) * (size_t)n * (rot ? rot : 1));  // per column: cos[half], sin[half]
    if (!cs) return 2;
    for (int c = 0; c < n; ++c) {
        const float p = pos64 ? (float)((const long long*)pos)[c] : (float)((const int*)pos)[c];
        for (int i = 0; i < half; ++i) {
            const float a = p * inv_freq[i];
            cs[(long)c * rot + i] = cosf(a);
            cs[(long)c * rot + half + i] = sinf(a);
        }
    }
    norm_rotate(n, hq, D, rot, q, in_bf16, q_col, q_head, qw, q_out, out_bf16, qo_col, qo_head, cs, eps);
    norm_rotate(n, hk, D, rot, k, in_bf16, k_col, k_head, kw, k_out, out_bf16, ko_col, ko_head, cs, eps);
    free(cs);
    return 0;
}
"""

_IN = (torch.bfloat16, torch.float32)


def _load():
    p, i, l, fl = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
    return cpp_function("rope_cpu_fused", SOURCE, "qk_norm_rope runs as torch ops", "ninfer_qk_norm_rope",
                        [i, i, i, i, i, p, p, i, l, l, l, l, p, p, p, i, p, p, p, i, l, l, l, l, fl])


kernel = loaded_once(_load)  # the loaded function (built on first use), or None where it cannot run here


def _heads(t: torch.Tensor, dtype) -> bool:
    return t.dim() == 3 and t.dtype == dtype and t.stride(-1) == 1


def fused_qk_norm_rope(q, k, qw, kw, positions, inv_freq, q_out, k_out, eps: float, rotary_dim: int) -> bool:
    """q [T, Hq, D], k [T, Hk, D] -> q_out, k_out (module doc); qw / kw / inv_freq contiguous fp32;
    False where it does not apply."""
    f = kernel()
    if f is None or q.dim() != 3:
        return False
    T, hq, D = q.shape
    hk = k.shape[1]
    if (T > MAX_COLUMNS or q.dtype not in _IN or not _heads(k, q.dtype) or not _heads(q, q.dtype)
            or q_out.dtype not in _IN or not _heads(k_out, q_out.dtype) or not _heads(q_out, q_out.dtype)
            or q_out.shape != q.shape or k_out.shape != k.shape or k.shape[::2] != (T, D)
            or positions.dtype not in (torch.int32, torch.int64) or not positions.is_contiguous()
            or positions.numel() != T or rotary_dim % 2 or inv_freq.numel() != rotary_dim // 2
            or any(w.dtype != torch.float32 or not w.is_contiguous() or w.numel() != D for w in (qw, kw))):
        return False
    rc = f(T, hq, hk, D, rotary_dim, q.data_ptr(), k.data_ptr(), int(q.dtype == torch.bfloat16), q.stride(0),
           q.stride(1), k.stride(0), k.stride(1), qw.data_ptr(), kw.data_ptr(), positions.data_ptr(),
           int(positions.dtype == torch.int64), inv_freq.data_ptr(), q_out.data_ptr(), k_out.data_ptr(),
           int(q_out.dtype == torch.bfloat16), q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
           eps)
    return rc == 0
