"""CPU path of kv_append into bf16 caches: one C++ function in place of the indexed stores (~8 small
torch ops per launch), built once per machine by `torch_util.cpp_library` and loaded with ctypes.

Column t's k[t], v[t] [Hkv, D] (bf16 copied, fp32 rounded to nearest even like torch's `.to`) are
written at cache[slots[t], positions[t]]; the caches' other rows are untouched. `fused_append_bf16`
returns False (nothing done) where it does not apply (another dtype or layout, a slot or position
outside the cache) or where the library is None (no compiler, NINFER_CPU_FUSED=0).
"""

from __future__ import annotations

import ctypes

import torch

from ..torch_util import BF16_CPP, cpp_function, loaded_once

__all__ = ["SOURCE", "fused_append_bf16"]

SOURCE = BF16_CPP + r"""
// x [n, H, D] (column / head strides, unit last stride; bf16 or fp32: x_bf16) -> cache element
// (slot, row, head, d) at slot * c_slot + row * c_row + head * c_head + d (bf16)
static void put_rows(int n, int H, int D, const void* x, int x_bf16, long x_col, long x_head, uint16_t* cache,
                     long c_slot, long c_row, long c_head, const int* slots, const int* positions) {
    for (int c = 0; c < n; ++c)
        for (int h = 0; h < H; ++h) {
            uint16_t* dst = cache + slots[c] * c_slot + positions[c] * c_row + h * c_head;
            const long off = c * x_col + h * x_head;
            if (x_bf16) memcpy(dst, (const uint16_t*)x + off, sizeof(uint16_t) * D);
            else for (int d = 0; d < D; ++d) dst[d] = to_bf16(((const float*)x)[off + d]);
        }
}

extern "C" int ninfer_kv_append_bf16(int n, int H, int D, const void* k, const void* v, int x_bf16, long k_col,
                                     long k_head, long v_col, long v_head, uint16_t* kc, uint16_t* vc, long c_slot,
                                     long c_row, long c_head, const int* slots, const int* positions) {
    put_rows(n, H, D, k, x_bf16, k_col, k_head, kc, c_slot, c_row, c_head, slots, positions);
    put_rows(n, H, D, v, x_bf16, v_col, v_head, vc, c_slot, c_row, c_head, slots, positions);
    return 0;
}
"""

def _load():
    p, i, l = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    return cpp_function("kv_cache_cpu_fused", SOURCE, "kv_append runs as torch ops", "ninfer_kv_append_bf16",
                        [i, i, i, p, p, i, l, l, l, l, p, p, l, l, l, p, p])


kernel = loaded_once(_load)  # the loaded function (built on first use), or None where it cannot run here


def fused_append_bf16(k, v, positions, slots, k_cache, v_cache) -> bool:
    """k, v [T, Hkv, D] into the bf16 caches [slots, ctx, Hkv, D] (module doc); False where it does not apply."""
    f = kernel()
    if f is None or k.dim() != 3 or v.shape != k.shape:
        return False
    T, H, D = k.shape
    if (k.dtype not in (torch.bfloat16, torch.float32) or v.dtype != k.dtype or k.stride(-1) != 1
            or v.stride(-1) != 1 or k_cache.dtype != torch.bfloat16 or v_cache.dtype != torch.bfloat16
            or k_cache.dim() != 4 or k_cache.shape[2:] != (H, D) or k_cache.stride(3) != 1
            or v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride()
            or any(t.dtype != torch.int32 or not t.is_contiguous() or t.numel() != T for t in (slots, positions))):
        return False
    n_slots, ctx = k_cache.shape[0], k_cache.shape[1]
    if any(not 0 <= s < n_slots for s in slots.tolist()) or any(not 0 <= p < ctx for p in positions.tolist()):
        return False
    f(T, H, D, k.data_ptr(), v.data_ptr(), int(k.dtype == torch.bfloat16), k.stride(0), k.stride(1), v.stride(0),
      v.stride(1), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
      slots.data_ptr(), positions.data_ptr())
    return True
