"""CPU path of greedy token selection: each row's argmax in one C++ pass (AVX2: 8 running maxima and
their first indices), in place of torch's fp32 copy and argmax, built once per machine by
`torch_util.cpp_library` and loaded with ctypes.

Row r of logits [R, V] (bf16 or fp32, unit last stride): the first index of the largest value, or
of the first NaN when the row has one (torch.argmax's rule). `fused_argmax` returns False (nothing
done) where it does not apply (another dtype or layout) or where the library is None (no compiler,
no AVX2, NINFER_CPU_FUSED=0); the torch ops run then.
"""

from __future__ import annotations

import ctypes

import torch

from ..torch_util import BF16_CPP, cpp_function, loaded_once

__all__ = ["SOURCE", "fused_argmax"]

SOURCE = BF16_CPP + r"""#include <immintrin.h>
#define TGT __attribute__((target("avx2")))

extern "C" int ninfer_argmax_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}

static inline TGT __m256 load8(const void* p, int bf16, long i) {
    if (!bf16) return _mm256_loadu_ps((const float*)p + i);
    const __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float value(const void* p, int bf16, long i) {
    return bf16 ? from_bf16(((const uint16_t*)p)[i]) : ((const float*)p)[i];
}

// ids[r] = the first index of row r's maximum (of its first NaN, if any); rows of V at stride ld
extern "C" TGT int ninfer_argmax(int rows, long V, const void* x, int bf16, long ld, int* ids) {
    for (int r = 0; r < rows; ++r) {
        const char* row = (const char*)x + r * ld * (bf16 ? 2 : 4);
        __m256 best = _mm256_set1_ps(-INFINITY);
        __m256i at = _mm256_set1_epi32(-1), idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256 nan = _mm256_setzero_ps();
        long i = 0;
        for (; i + 8 <= V; i += 8) {
            const __m256 v = load8(row, bf16, i);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);  // strictly greater: the first index stays
            best = _mm256_blendv_ps(best, v, gt);
            at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(idx), gt));
            idx = _mm256_add_epi32(idx, _mm256_set1_epi32(8));
        }
        alignas(32) float b[8];
        alignas(32) int a[8];
        _mm256_store_ps(b, best);
        _mm256_store_si256((__m256i*)a, at);
        long win = -1;
        float wv = -INFINITY;
        for (int j = 0; j < 8; ++j)  // the lanes' maxima: the largest, the first index among equals
            if (a[j] >= 0 && (b[j] > wv || (b[j] == wv && a[j] < win))) { wv = b[j]; win = a[j]; }
        if (win < 0 && i > 0) win = 0;  // every vector-part value is -inf: the first one
        bool has_nan = _mm256_movemask_ps(nan) != 0;
        for (; i < V && !has_nan; ++i) {  // the tail, in order
            const float v = value(row, bf16, i);
            if (v != v) has_nan = true;
            else if (v > wv || win < 0) { wv = v; win = i; }
        }
        if (has_nan)
            for (long j = 0; j < V; ++j) { const float v = value(row, bf16, j); if (v != v) { win = j; break; } }
        ids[r] = (int)(win < 0 ? 0 : win);
    }
    return 0;
}
"""

def _load():
    p, i, l = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    return cpp_function("sampling_cpu_fused", SOURCE, "greedy selection runs as torch ops", "ninfer_argmax",
                        [i, l, p, i, l, p], supported="ninfer_argmax_supported")


kernel = loaded_once(_load)  # the loaded function (built on first use), or None where it cannot run here


def fused_argmax(logits: torch.Tensor, ids: torch.Tensor) -> bool:
    """ids[r] (int32, contiguous) = argmax of logits[r] (module doc); False where it does not apply."""
    f = kernel()
    if (f is None or logits.dim() != 2 or logits.dtype not in (torch.bfloat16, torch.float32)
            or logits.stride(-1) != 1 or ids.dtype != torch.int32 or not ids.is_contiguous()
            or ids.numel() != logits.shape[0] or not 0 < logits.shape[1] < 2**31 - 8):
        return False
    f(logits.shape[0], logits.shape[1], logits.data_ptr(), int(logits.dtype == torch.bfloat16), logits.stride(0),
      ids.data_ptr())
    return True
