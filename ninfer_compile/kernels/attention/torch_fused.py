"""CPU path of gated GQA attention for few columns over a bf16 KV cache: one C++ function in place
of ~24 small torch ops per launch, built once per machine by `torch_util.cpp_library` and loaded
with ctypes.

Column t, query head h (KV head h / (Hq / Hkv)), its slot's cache rows 0..positions[t] (bf16 K and
V, no scales, no rotation): s_j = scale * q.K_j (fp32), p = softmax(s) (max subtracted, expf),
o = sum_j p_j V_j (AVX2 + FMA where the CPU has them), out = o * sigmoid(gate) (`torch_util.EXP_CPP`),
one rounding at the store. The torch path's arithmetic up to fp32 summation order and exp's last
bits. OpenMP over (column, head) when the step reads enough rows. `fused_attention` returns False (nothing done) where it does not
apply (another KV format, dtype or layout, more than MAX_COLUMNS columns, a position outside the
cache) or where the library is None (no compiler, NINFER_CPU_FUSED=0); the torch ops run then.
"""

from __future__ import annotations

import ctypes

import torch

from ..torch_util import BF16_CPP, EXP_CPP, cpp_function, loaded_once

__all__ = ["SOURCE", "fused_attention", "MAX_COLUMNS"]

MAX_COLUMNS = 16  # more columns (prefill): torch's fused attention
SOURCE = BF16_CPP + EXP_CPP + r"""
// q . k_row (fp32 q, bf16 row) and o += p * v_row over D values: AVX2 + FMA 8 lanes at a time (two
// partial sums) where the CPU has them, else scalar
__attribute__((target("avx2,fma"))) static float dot_bf16_avx2(const float* q, const uint16_t* k, int D) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= D; d += 16) {
        const __m256i h = _mm256_loadu_si256((const __m256i*)(k + d));
        const __m256 k0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16));
        const __m256 k1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16));
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), k0, s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), k1, s1);
    }
    alignas(32) float l[8];
    _mm256_store_ps(l, _mm256_add_ps(s0, s1));
    float t = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; d < D; ++d) t += q[d] * from_bf16(k[d]);
    return t;
}
__attribute__((target("avx2,fma"))) static void axpy_bf16_avx2(float* o, float p, const uint16_t* v, int D) {
    const __m256 pv = _mm256_set1_ps(p);
    int d = 0;
    for (; d + 8 <= D; d += 8) {
        const __m256 vv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(v + d))), 16));
        _mm256_storeu_ps(o + d, _mm256_fmadd_ps(pv, vv, _mm256_loadu_ps(o + d)));
    }
    for (; d < D; ++d) o[d] += p * from_bf16(v[d]);
}
static float dot_bf16(const float* q, const uint16_t* k, int D) {
    if (has_avx2_fma()) return dot_bf16_avx2(q, k, D);
    float acc = 0.f;
    for (int d = 0; d < D; ++d) acc += q[d] * from_bf16(k[d]);
    return acc;
}
static void axpy_bf16(float* o, float p, const uint16_t* v, int D) {
    if (has_avx2_fma()) { axpy_bf16_avx2(o, p, v, D); return; }
    for (int d = 0; d < D; ++d) o[d] += p * from_bf16(v[d]);
}

// q / gate [n, Hq, D] (column / head strides, unit last stride; bf16 or fp32: in_bf16); k / v cache
// bf16, element (slot, row, head, d) at slot * c_slot + row * c_row + head * c_head + d; out [n, Hq, D]
// (column / head strides; out_bf16)
extern "C" int ninfer_attention_decode(int n, int Hq, int Hkv, int D, const void* q, const void* gate, int in_bf16,
                                       long q_col, long q_head, long g_col, long g_head, const uint16_t* kc,
                                       const uint16_t* vc, long c_slot, long c_row, long c_head,
                                       const int* slots, const int* positions, void* out, int out_bf16,
                                       long o_col, long o_head, float scale, int threads) {
    const int group = Hq / Hkv;
    long rows = 0;
    for (int c = 0; c < n; ++c) rows += positions[c] + 1;
    const int es = in_bf16 ? 2 : 4;
    int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * Hq * D > (1L << 20))
    for (int w = 0; w < n * Hq; ++w) {
        const int c = w / Hq, h = w % Hq, kvh = h / group;
        const long len = positions[c] + 1;
        float* buf = (float*)malloc(sizeof(float) * (3 * (size_t)D + len));
        if (!buf) { failed = 1; continue; }
        float *qv = buf, *o = buf + D, *g = buf + 2 * D, *s = buf + 3 * D;
        load((const char*)q + (c * q_col + h * q_head) * es, in_bf16, D, qv);
        load((const char*)gate + (c * g_col + h * g_head) * es, in_bf16, D, g);
        const uint16_t* K = kc + slots[c] * c_slot + kvh * c_head;
        const uint16_t* V = vc + slots[c] * c_slot + kvh * c_head;
        float m = -INFINITY;
        for (long j = 0; j < len; ++j) {
            s[j] = dot_bf16(qv, K + j * c_row, D) * scale;
            m = s[j] > m ? s[j] : m;
        }
        float sum = 0.f;
        for (long j = 0; j < len; ++j) { s[j] = expf(s[j] - m); sum += s[j]; }
        for (int d = 0; d < D; ++d) o[d] = 0.f;
        for (long j = 0; j < len; ++j) axpy_bf16(o, s[j] / sum, V + j * c_row, D);
        sigmoid_inplace(g, D);
        char* op = (char*)out + (c * o_col + h * o_head) * (out_bf16 ? 2 : 4);
        for (int d = 0; d < D; ++d) {
            const float y = o[d] * g[d];
            if (out_bf16) ((uint16_t*)op)[d] = to_bf16(y); else ((float*)op)[d] = y;
        }
        free(buf);
    }
    return failed ? 2 : 0;
}
"""

_IN = (torch.bfloat16, torch.float32)


def _load():
    p, i, l, fl = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
    return cpp_function("attention_cpu_fused", SOURCE, "attention runs as torch ops", "ninfer_attention_decode",
                        [i, i, i, i, p, p, i, l, l, l, l, p, p, l, l, l, p, p, p, i, l, l, fl, i])


kernel = loaded_once(_load)  # the loaded function (built on first use), or None where it cannot run here


def fused_attention(q, gate, k_cache, v_cache, positions, slots, out, scale: float) -> bool:
    """out [T, Hq * D] (or [T, Hq, D]) = gated attention of q / gate [T, Hq, D] over the bf16 caches
    [slots, ctx, Hkv, D] (module doc); False where it does not apply."""
    f = kernel()
    if f is None or q.dim() != 3 or gate.shape != q.shape:
        return False
    T, Hq, D = q.shape
    if (T > MAX_COLUMNS or q.dtype not in _IN or gate.dtype != q.dtype or q.stride(-1) != 1 or gate.stride(-1) != 1
            or k_cache.dtype != torch.bfloat16 or v_cache.dtype != torch.bfloat16 or k_cache.dim() != 4
            or v_cache.stride() != k_cache.stride() or v_cache.shape != k_cache.shape
            or k_cache.shape[3] != D or k_cache.stride(3) != 1 or Hq % k_cache.shape[2]
            or out.dtype not in _IN or out.numel() != T * Hq * D
            or any(t.dtype != torch.int32 or not t.is_contiguous() or t.numel() != T for t in (slots, positions))):
        return False
    try:
        o = out.view(T, Hq, D)
    except RuntimeError:
        return False
    if o.stride(-1) != 1:
        return False
    n_slots, ctx = k_cache.shape[0], k_cache.shape[1]
    if any(not 0 <= s < n_slots for s in slots.tolist()) or any(not 0 <= p < ctx for p in positions.tolist()):
        return False
    rc = f(T, Hq, k_cache.shape[2], D, q.data_ptr(), gate.data_ptr(), int(q.dtype == torch.bfloat16), q.stride(0),
           q.stride(1), gate.stride(0), gate.stride(1), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0),
           k_cache.stride(1), k_cache.stride(2), slots.data_ptr(), positions.data_ptr(), o.data_ptr(),
           int(o.dtype == torch.bfloat16), o.stride(0), o.stride(1), scale, torch.get_num_threads())
    if rc != 0:
        raise MemoryError("attention (torch): the fused CPU kernel could not allocate its rows")
    return True
