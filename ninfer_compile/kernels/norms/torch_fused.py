"""CPU path of the norm families for few rows: one C++ function (rows of D elements, fp32 math)
in place of torch's ~7 small ops per launch, built once per machine by `torch_util.cpp_library`
and loaded with ctypes.

Row r (of T x heads rows; element strides per column and per head, unit last stride; x, z and out
each bf16 or fp32): y = x * (1 / sqrt(sum(x^2) / D + eps)) * w (w: the fp32 weight the torch path
uses, 1 + w for the zero-centred norms), times z / (1 + exp(-z)) when z is given (gated_rmsnorm;
`torch_util.EXP_CPP`),
stored once (bf16 rounded to nearest even). The torch ops' arithmetic up to fp32 summation order.
`fused_rmsnorm` returns False (nothing done) where it does not apply (another dtype, a strided last
axis, more than MAX_ROWS rows: torch's vectorised ops win there) or where the library is None (no
compiler, NINFER_CPU_FUSED=0); the torch ops run then.
"""

from __future__ import annotations

import ctypes

import torch

from ..torch_util import BF16_CPP, EXP_CPP, PreparedCalls, cpp_function, loaded_once

__all__ = ["SOURCE", "fused_rmsnorm"]

MAX_ROWS = 64  # more rows (prefill): torch's ops
SOURCE = BF16_CPP + EXP_CPP + r"""static inline float at(const void* p, int bf16, long i) {
    return bf16 ? from_bf16(((const uint16_t*)p)[i]) : ((const float*)p)[i];
}

// rows (c, h) for c < n_col, h < n_head; x / z / out element (c, h, d) at c * *_col + h * *_head + d
extern "C" int ninfer_rmsnorm(int n_col, int n_head, int D, const void* x, int x_bf16, long x_col, long x_head,
                              const void* z, int z_bf16, long z_col, long z_head, const float* w, void* out,
                              int out_bf16, long o_col, long o_head, float eps) {
    float* gate = z ? (float*)malloc(sizeof(float) * D) : nullptr;
    if (z && !gate) return 2;
    for (int c = 0; c < n_col; ++c) {
        for (int h = 0; h < n_head; ++h) {
            const long xb = c * x_col + h * x_head, zb = c * z_col + h * z_head, ob = c * o_col + h * o_head;
            float ss = 0.f;
            for (int d = 0; d < D; ++d) { const float v = at(x, x_bf16, xb + d); ss += v * v; }
            const float r = 1.f / sqrtf(ss / (float)D + eps);
            if (z) {  // the gate's SiLU, a row at a time
                for (int d = 0; d < D; ++d) gate[d] = at(z, z_bf16, zb + d);
                silu_inplace(gate, D);
            }
            for (int d = 0; d < D; ++d) {
                float y = at(x, x_bf16, xb + d) * r * w[d];
                if (z) y *= gate[d];
                if (out_bf16) ((uint16_t*)out)[ob + d] = to_bf16(y);
                else ((float*)out)[ob + d] = y;
            }
        }
    }
    free(gate);
    return 0;
}
"""

_IN = (torch.bfloat16, torch.float32)
_PREPARED = PreparedCalls()


def _load():
    p, i, l, fl = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
    return cpp_function("norms_cpu_fused", SOURCE, "the norms run as torch ops", "ninfer_rmsnorm",
                        [i, i, i, p, i, l, l, p, i, l, l, p, p, i, l, l, fl])


kernel = loaded_once(_load)  # the loaded function (built on first use), or None where it cannot run here


def _rows(t: torch.Tensor) -> tuple[int, int] | None:
    """(column, head) element strides of a [T, D] or [T, heads, D] tensor with a unit last stride."""
    if t.dtype not in _IN or t.stride(-1) != 1:
        return None
    return (t.stride(0), t.stride(1) if t.dim() == 3 else 0)


def _prepared(x, w32, out, eps: float, z):
    """The function's arguments for these operands, or None where the fused call does not apply."""
    if x.dim() not in (2, 3) or w32.dtype != torch.float32 or not w32.is_contiguous():
        return None
    T, D = x.shape[0], x.shape[-1]
    heads = x.shape[1] if x.dim() == 3 else 1
    if T * heads > MAX_ROWS or w32.numel() != D:
        return None
    try:
        o = out.view(x.shape) if out.shape != x.shape else out
    except RuntimeError:
        return None
    xs, os_ = _rows(x), _rows(o)
    zs = (0, 0) if z is None else _rows(z)
    if xs is None or os_ is None or zs is None or (z is not None and z.shape != x.shape):
        return None
    return (T, heads, D, x.data_ptr(), int(x.dtype == torch.bfloat16), xs[0], xs[1],
            None if z is None else z.data_ptr(), int(z is not None and z.dtype == torch.bfloat16), zs[0], zs[1],
            w32.data_ptr(), o.data_ptr(), int(o.dtype == torch.bfloat16), os_[0], os_[1], eps)


def fused_rmsnorm(x, w32, out, eps: float, z=None) -> bool:
    """out = RMSNorm(x over its last axis) * w32 [* SiLU(z)] (module doc); x, z [T, D] or [T, heads, D],
    out the same element count per row (any view with a unit last stride); False where it does not apply.
    A launch's arguments are prepared once (`torch_util.PreparedCalls`)."""
    f = kernel()
    if f is None:
        return False
    args = _PREPARED.get((x, w32, out, z), eps, lambda: _prepared(x, w32, out, eps, z))
    if args is None:
        return False
    if f(*args) != 0:
        raise MemoryError(f"norms (torch): the fused CPU kernel could not allocate a row of {x.shape[-1]}")
    return True
