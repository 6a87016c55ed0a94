"""CPU path of the linear family for few columns: one fused C++ kernel (AVX2) that reads a row-split
weight's stored planes in place (no repack) and decodes the codes inside the dot product, compiled
once per machine with the system C++ compiler and loaded with ctypes.

Arithmetic (`SOURCE`): x is rounded to int16 per group of the weight's K groups (64 lanes; W8: 32),
scaled so the group's largest |x| is 32767 (round to nearest: |error| <= 2^-16 of that largest |x|);
per row, group and column the int16 codes times the int16 x are summed exactly in int32 (AVX2
`madd`; |sum| < 2^24), converted once to fp32, times (fp16 scale x x's group scale) and accumulated
in fp32 (8 partial sums per row, added at the end). The codes and the fp16 scales are exact.

Build: `torch_util.cpp_library` (the system C++ compiler, once per machine and source text,
cached in `$NINFER_CACHE_DIR`); every weight shape uses it. Rows in chunks of ~128 KiB of the base
plane are handed out dynamically to `torch.get_num_threads()` threads: the caller and the
helpers of the process's pool (`torch_util.POOL_CPP`), which never waits for a helper the OS has
not scheduled (OpenMP's barrier did: on a busy shared machine a 2-thread product then ran slower
than one thread). The epilogue (residual, SwiGLU with `torch_util.EXP_CPP`'s SiLU) and the store
run in the same call. Where no compiler works, the CPU lacks AVX2 / FMA / F16C, or
`NINFER_CPU_FUSED=0`, `kernel()` is None (one line on stderr says why) and the linear family keeps
torch's int4 / int8 matmuls (`torch_packed`).

`fused_matmul(x, weight, rows=(begin, count))` reads only a row range of the weight, at its byte
offsets in the planes: the MoE family's CPU path runs each hit expert's product this way on the
stored [E x rows, K] bank (all of the expert's tokens as the columns), with no per-expert copy. A
product smaller than `SERIAL_WORK` (rows x K groups x column blocks of 4) runs on the calling thread
alone (measured before the pool: 21 us on one thread vs 69 us on two for one 256 x 1024 Q4 expert
of a MoE bank on a loaded 2-core box).
"""

from __future__ import annotations

import ctypes

import torch

from ...errors import RouteError
from ..torch_util import EXP_CPP, POOL_DECL, PreparedCalls, cpp_function, library_symbol, loaded_once
from .weights import QuantWeight

__all__ = ["SOURCE", "kernel", "fused_matmul", "fused_rows", "SERIAL_WORK"]

# Products of fewer row-group-column-block dot products than this run on one thread (module doc).
# The dense weights that take this kernel (torch_packed.MIN_PARAMS and up) are all above it.
SERIAL_WORK = 8192

SOURCE = "#include <math.h>\n" + EXP_CPP + POOL_DECL + r"""#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,bmi2,f16c")))

extern "C" int ninfer_qdot_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

static inline TGT float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// The signed codes of a group's 64 lanes as int16 (X256: 256 x the code): lane 4w + i at element w
// of vector i (i = 0..3, w = 0..15; each 16-bit word of the base plane holds lanes 4w .. 4w+3).
// Q5 / Q6 build the codes as bytes: byte j of `lo` / `hi` is lane 2j / 2j+1 (the base byte's low /
// high nibble), the high bits or'ed in as the byte's sign-extended top (Q5: 0xF0 where the 5th bit is
// set, from a per-byte bit test of the broadcast high word; Q6: a 16-entry table indexed by the
// high-plane nibble of lanes 2j, 2j+1); each byte then moves to its word's top byte (X256: 256 x code,
// no sign-extension shift) or is sign-extended in place.
template <int BITS, bool X256>
static inline TGT void group_codes(const uint8_t* b, const uint8_t* h, __m256i e[4]) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)b);
    if (BITS == 4) {
        e[0] = _mm256_srai_epi16(_mm256_slli_epi16(v, 12), 12);
        e[1] = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 12);
        e[2] = _mm256_srai_epi16(_mm256_slli_epi16(v, 4), 12);
        e[3] = _mm256_srai_epi16(v, 12);
        return;
    }
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    if (BITS == 5) {  // high bit of lane 2j (2j+1): bit 2(j%4) (+1) of high byte j/4
        int64_t word;
        memcpy(&word, h, 8);
        const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi64x(word), _mm256_setr_epi8(
            0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7));
        const __m256i sel_lo = _mm256_set1_epi32(0x40100401), sel_hi = _mm256_set1_epi32((int)0x80200802u);
        const __m256i top = _mm256_set1_epi8((char)0xF0);
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, sel_lo), sel_lo), top));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, sel_hi), sel_hi), top));
    } else {  // byte j of the high plane's nibbles: bits 4,5 of lane 2j (bits 0,1), of lane 2j+1 (bits 2,3)
        const __m256i H = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)h));
        const __m256i nib = _mm256_and_si256(_mm256_or_si256(H, _mm256_slli_epi16(H, 4)), _mm256_set1_epi16(0x0F0F));
        // the byte contribution of high bits u (0..3) to a signed 6-bit code: 16 u - 64 [u >= 2]
#define T6(u) (char)((u) == 1 ? 0x10 : (u) == 2 ? 0xE0 : (u) == 3 ? 0xF0 : 0)
#define TLO T6(0), T6(1), T6(2), T6(3), T6(0), T6(1), T6(2), T6(3), T6(0), T6(1), T6(2), T6(3), T6(0), T6(1), T6(2), T6(3)
#define THI T6(0), T6(0), T6(0), T6(0), T6(1), T6(1), T6(1), T6(1), T6(2), T6(2), T6(2), T6(2), T6(3), T6(3), T6(3), T6(3)
        lo = _mm256_or_si256(lo, _mm256_shuffle_epi8(_mm256_setr_epi8(TLO, TLO), nib));
        hi = _mm256_or_si256(hi, _mm256_shuffle_epi8(_mm256_setr_epi8(THI, THI), nib));
#undef THI
#undef TLO
#undef T6
    }
    // word w of lo: lanes 4w (low byte), 4w+2 (high byte); of hi: lanes 4w+1, 4w+3
    if (X256) {
        const __m256i top8 = _mm256_set1_epi16((short)0xFF00);
        e[0] = _mm256_slli_epi16(lo, 8);
        e[1] = _mm256_slli_epi16(hi, 8);
        e[2] = _mm256_and_si256(lo, top8);
        e[3] = _mm256_and_si256(hi, top8);
    } else {
        e[0] = _mm256_srai_epi16(_mm256_slli_epi16(lo, 8), 8);
        e[1] = _mm256_srai_epi16(_mm256_slli_epi16(hi, 8), 8);
        e[2] = _mm256_srai_epi16(lo, 8);
        e[3] = _mm256_srai_epi16(hi, 8);
    }
}

// rows [r0, r1) x T columns (row r at out[t * ldo + r - r0]); x16 [T][gpr][64] int16 in the kernel's
// lane order, xs [T][gpr] their scales. Per group and column: 4 (W8: 2) int16 pair products summed in
// int32 (|sum| < 2^24), one conversion to fp32, times the weight's scale x the column's scale,
// accumulated in fp32. Q5 / Q6 with T <= 2 use 256 x code (X256; fewer shifts per group): the products
// sum to at most 8 x 8192 x 32767 < 2^31 per int32 element, converted to fp32 as they are (relative
// rounding 2^-24, far below x's 2^-16) with 1/256 folded into the scale. Software prefetch PREFETCH
// bytes ahead in the base / high planes (the hardware's streams alone left ~15-25% of the 1-thread
// rate to memory latency).
enum { PREFETCH = 2048 };

template <int BITS, int T>
static TGT void rows(const uint8_t* base, const uint8_t* high, const uint16_t* scale, int r0, int r1, int gpr,
                     const int16_t* x16, const float* xs, float* out, int ldo) {
    constexpr int HBYTES = BITS == 5 ? 8 : BITS == 6 ? 16 : 0;
    constexpr bool X256 = (BITS == 5 || BITS == 6) && T <= 2;
    const float code_unit = X256 ? 1.0f / 256 : 1.0f;  // X256: the int32 sums are 256 x the products
    for (int r = r0; r < r1; ++r) {
        const uint8_t* b = base + (size_t)r * gpr * 32;
        const uint8_t* h = HBYTES ? high + (size_t)r * gpr * HBYTES : nullptr;
        const uint16_t* s = scale + (size_t)r * gpr;
        __m256 tot[T];
        for (int t = 0; t < T; ++t) tot[t] = _mm256_setzero_ps();
        for (int g0 = 0; g0 < gpr; g0 += 8) {
            // per group and column the fp32 product (weight scale x column scale), 8 groups at a time
            const int gn = gpr - g0 < 8 ? gpr - g0 : 8;
            alignas(32) float ws_xs[T][8];
            if (gn == 8) {
                const __m256 ws = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + g0)));
                for (int t = 0; t < T; ++t)
                    _mm256_store_ps(ws_xs[t], _mm256_mul_ps(_mm256_mul_ps(ws, _mm256_set1_ps(code_unit)), _mm256_loadu_ps(xs + (size_t)t * gpr + g0)));
            } else {
                for (int t = 0; t < T; ++t)
                    for (int j = 0; j < gn; ++j) ws_xs[t][j] = _cvtsh_ss(s[g0 + j]) * code_unit * xs[(size_t)t * gpr + g0 + j];
            }
            for (int j = 0; j < gn; ++j) {
                const int g = g0 + j;
                if ((g & 1) == 0) {  // the planes PREFETCH bytes ahead (the next rows: rows are contiguous)
                    _mm_prefetch((const char*)(b + g * 32) + PREFETCH, _MM_HINT_T0);
                    if (HBYTES) _mm_prefetch((const char*)(h + g * HBYTES) + PREFETCH * HBYTES / 32, _MM_HINT_T0);
                }
                __m256i e[4];
                int parts;
                if (BITS == 8) {  // 32 lanes, natural order
                    e[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + g * 32)));
                    e[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + g * 32 + 16)));
                    parts = 2;
                } else {
                    group_codes<BITS, X256>(b + g * 32, HBYTES ? h + g * HBYTES : nullptr, e);
                    parts = 4;
                }
                for (int t = 0; t < T; ++t) {
                    const __m256i* xp = (const __m256i*)(x16 + ((size_t)t * gpr + g) * 64);
                    __m256i p = _mm256_add_epi32(_mm256_madd_epi16(e[0], _mm256_load_si256(xp)),
                                                 _mm256_madd_epi16(e[1], _mm256_load_si256(xp + 1)));
                    if (parts == 4)
                        p = _mm256_add_epi32(p, _mm256_add_epi32(_mm256_madd_epi16(e[2], _mm256_load_si256(xp + 2)),
                                                                 _mm256_madd_epi16(e[3], _mm256_load_si256(xp + 3))));
                    tot[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(ws_xs[t][j]), tot[t]);
                }
            }
        }
        for (int t = 0; t < T; ++t) out[(size_t)t * ldo + r - r0] = hsum(tot[t]);
    }
}

template <int BITS>
static TGT void row_chunk(int t, const uint8_t* base, const uint8_t* high, const uint16_t* scale, int r0, int r1,
                          int gpr, const int16_t* x16, const float* xs, float* out, int ldo) {
    for (int t0 = 0; t0 < t; t0 += 4) {
        const int16_t* xx = x16 + (size_t)t0 * gpr * 64;
        const float* ss = xs + (size_t)t0 * gpr;
        float* oo = out + (size_t)t0 * ldo;
        switch (t - t0) {
            case 1: rows<BITS, 1>(base, high, scale, r0, r1, gpr, xx, ss, oo, ldo); break;
            case 2: rows<BITS, 2>(base, high, scale, r0, r1, gpr, xx, ss, oo, ldo); break;
            case 3: rows<BITS, 3>(base, high, scale, r0, r1, gpr, xx, ss, oo, ldo); break;
            default: rows<BITS, 4>(base, high, scale, r0, r1, gpr, xx, ss, oo, ldo); break;
        }
    }
}

static inline float bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN kept (torch's copy_)
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline void put(void* out, int out_bf16, size_t i, float v) {
    if (out_bf16) ((uint16_t*)out)[i] = f32_to_bf16(v);
    else ((float*)out)[i] = v;
}

// x (fp32, or bf16 when x_bf16) [t, ldx], k real columns -> x16 [t][gpr][64] int16 (each group of
// G = 64 (32 for W8) lanes scaled by its largest |x| to +-32767, rounded to nearest even: cvtps_epi32
// in the default rounding mode, as lrintf) and xs [t][gpr]; 8 lanes at a time.
static TGT void quantize_x(int bits, const void* x, int x_bf16, int t, int k, int ldx, int gpr, int16_t* x16, float* xs) {
    const int G = bits == 8 ? 32 : 64;
    alignas(32) float row[64];
    alignas(32) int32_t q[64];
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int tt = 0; tt < t; ++tt)
        for (int g = 0; g < gpr; ++g) {
            const int k0 = g * G, lim = k - k0 < G ? (k - k0 > 0 ? k - k0 : 0) : G;
            const size_t at = (size_t)tt * ldx + k0;
            if (lim == G) {
                for (int j = 0; j < G; j += 8) {
                    __m256 v;
                    if (x_bf16) {
                        const __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)x + at + j));
                        v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
                    } else {
                        v = _mm256_loadu_ps((const float*)x + at + j);
                    }
                    _mm256_store_ps(row + j, v);
                }
            } else {
                for (int j = 0; j < G; ++j)
                    row[j] = j >= lim ? 0.0f : x_bf16 ? bf16_to_f32(((const uint16_t*)x)[at + j]) : ((const float*)x)[at + j];
            }
            __m256 mv = _mm256_setzero_ps();
            for (int j = 0; j < G; j += 8) mv = _mm256_max_ps(mv, _mm256_and_ps(_mm256_load_ps(row + j), abs_mask));
            alignas(32) float mm[8];
            _mm256_store_ps(mm, mv);
            float m = 0.0f;
            for (int j = 0; j < 8; ++j) m = fmaxf(m, mm[j]);
            const float inv = m > 0.0f ? 32767.0f / m : 0.0f;
            xs[(size_t)tt * gpr + g] = (m > 0.0f ? m / 32767.0f : 0.0f);
            const __m256 iv = _mm256_set1_ps(inv);
            for (int j = 0; j < G; j += 8)
                _mm256_store_si256((__m256i*)(q + j), _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(row + j), iv)));
            int16_t* d = x16 + ((size_t)tt * gpr + g) * 64;
            if (bits == 8) for (int j = 0; j < 32; ++j) d[j] = (int16_t)q[j];
            else for (int j = 0; j < 64; ++j) d[(j & 3) * 16 + (j >> 2)] = (int16_t)q[j];
        }
}

// The epilogue of rows [r0, r1) of the t columns' fp32 products (acc, row stride lda, row r at
// acc[r - r0]): out = acc (+ residual), one rounding at the store; residual may alias out.
static void store_rows(int t, int r0, int r1, const float* acc, int lda, void* out, int out_bf16, int ldo,
                       const void* res, int res_bf16, int ldr) {
    for (int c = 0; c < t; ++c)
        for (int r = r0; r < r1; ++r) {
            float v = acc[(size_t)c * lda + r - r0];
            if (res) v += res_bf16 ? bf16_to_f32(((const uint16_t*)res)[(size_t)c * ldr + r]) : ((const float*)res)[(size_t)c * ldr + r];
            put(out, out_bf16, (size_t)c * ldo + r, v);
        }
}

// one ninfer_qdot call's operands, for its row chunks (`qdot_chunk`, run by `parallel_chunks`)
struct QdotJob {
    int bits; const uint8_t* base; const uint8_t* high; const uint16_t* scale; int n, gpr, t;
    const int16_t* x16; const float* xs; void* out; int out_bf16, ldo; const void* res; int res_bf16, ldr;
    float* full; int chunk;  // full: swiglu's fp32 products [t][n], else null
};

// rows [r0, r1) (at most 64: the epilogue's buffer) of one chunk
static TGT void qdot_rows(const QdotJob& j, int r0, int r1) {
    const bool direct = !j.full && !j.res && !j.out_bf16;
    float local[16 * 64];  // t <= 16 columns x 64 rows, the products before the epilogue
    float* dst = direct ? (float*)j.out + r0 : j.full ? j.full + r0 : local;
    const int ldd = direct ? j.ldo : j.full ? j.n : r1 - r0;
    for (int t0 = 0; t0 < j.t; t0 += 16) {
        const int tn = j.t - t0 < 16 ? j.t - t0 : 16;
        float* d = (direct || j.full) ? dst + (size_t)t0 * ldd : dst;
        const int16_t* xx = j.x16 + (size_t)t0 * j.gpr * 64;
        const float* ss = j.xs + (size_t)t0 * j.gpr;
        switch (j.bits) {
            case 4: row_chunk<4>(tn, j.base, j.high, j.scale, r0, r1, j.gpr, xx, ss, d, ldd); break;
            case 5: row_chunk<5>(tn, j.base, j.high, j.scale, r0, r1, j.gpr, xx, ss, d, ldd); break;
            case 6: row_chunk<6>(tn, j.base, j.high, j.scale, r0, r1, j.gpr, xx, ss, d, ldd); break;
            default: row_chunk<8>(tn, j.base, j.high, j.scale, r0, r1, j.gpr, xx, ss, d, ldd); break;
        }
        if (!direct && !j.full)
            store_rows(tn, r0, r1, local, r1 - r0, (char*)j.out + (size_t)t0 * j.ldo * (j.out_bf16 ? 2 : 4), j.out_bf16,
                       j.ldo, j.res ? (const char*)j.res + (size_t)t0 * j.ldr * (j.res_bf16 ? 2 : 4) : nullptr, j.res_bf16,
                       j.ldr);
    }
}

static TGT void qdot_chunk(void* ctx, int c) {
    const QdotJob& j = *(const QdotJob*)ctx;
    const int r0 = c * j.chunk, r1 = r0 + j.chunk < j.n ? r0 + j.chunk : j.n;
    for (int s0 = r0; s0 < r1; s0 += 64) qdot_rows(j, s0, s0 + 64 < r1 ? s0 + 64 : r1);
}

// out[c, r] = epilogue(sum_k x[c, k] W[r, k]), W the row-split planes of `bits` (4, 5, 6, 8) with gpr
// groups per row, n rows; t columns of x. epilogue 0: none, 1: + residual[c, r], 2: swiglu (out has
// n / 2 columns: SiLU(product row j) x product row j + n / 2). out (row stride ldo) and residual (ldr)
// are bf16 or fp32; without an epilogue and with fp32 out the products are written in place.
extern "C" TGT int ninfer_qdot(int bits, const uint8_t* base, const uint8_t* high, const uint16_t* scale, int n,
                               int gpr, const void* x, int x_bf16, int t, int k, int ldx, void* out, int out_bf16,
                               int ldo, int epilogue, const void* res, int res_bf16, int ldr, int nthreads) {
    int16_t* x16 = (int16_t*)aligned_alloc(64, (size_t)t * gpr * 64 * sizeof(int16_t));
    float* xs = (float*)malloc((size_t)t * gpr * sizeof(float) + 4);
    const bool swiglu = epilogue == 2;
    float* full = swiglu ? (float*)malloc((size_t)t * n * sizeof(float)) : nullptr;
    if (!x16 || !xs || (swiglu && !full)) { free(x16); free(xs); free(full); return 1; }
    if (epilogue != 1) res = nullptr;
    quantize_x(bits, x, x_bf16, t, k, ldx, gpr, x16, xs);
    // chunks of ~128 KiB of the base plane (16 to 1024 rows, a multiple of 16): long contiguous runs for
    // the prefetches (2 threads, streamed planes: Q4 29 -> 45, the Q6 head 32 -> 39 G weights/s against
    // chunks of 16 / 64 rows)
    const int rows_128k = (128 * 1024) / (gpr * 32);
    const int chunk = rows_128k < 16 ? 16 : rows_128k > 1024 ? 1024 : rows_128k & ~15;
    QdotJob job = {bits, base, high, scale, n, gpr, t, x16, xs, out, out_bf16, ldo, res, res_bf16, ldr, full, chunk};
    parallel_chunks(nthreads, (n + chunk - 1) / chunk, qdot_chunk, &job);
    if (swiglu) {
        const int half = n / 2;
        for (int c = 0; c < t; ++c) {
            float* gate = full + (size_t)c * n;
            silu_inplace(gate, half);
            for (int j = 0; j < half; ++j) put(out, out_bf16, (size_t)c * ldo + j, gate[j] * gate[half + j]);
        }
    }
    free(x16);
    free(xs);
    free(full);
    return 0;
}

// out[i] (row stride ldo; bf16 or fp32) = row rows[i]'s first k weights, fp32(scale) x code (exact),
// one rounding at the store (the embedding's gathered rows)
extern "C" TGT int ninfer_qrows(int bits, const uint8_t* base, const uint8_t* high, const uint16_t* scale, int n,
                                int gpr, int k, const int64_t* rows, int count, void* out, int out_bf16, int ldo) {
    const int G = bits == 8 ? 32 : 64, hbytes = bits == 5 ? 8 : bits == 6 ? 16 : 0;
    for (int i = 0; i < count; ++i) {
        const int64_t r = rows[i];
        if (r < 0 || r >= n) return 1;
        for (int g = 0; g < gpr; ++g) {
            const uint8_t* b = base + ((size_t)r * gpr + g) * 32;
            const uint8_t* h = hbytes ? high + ((size_t)r * gpr + g) * hbytes : nullptr;
            alignas(32) int16_t lanes[64];
            if (bits == 8) {
                for (int j = 0; j < 32; ++j) lanes[j] = (int8_t)b[j];
            } else {
                __m256i e[4];
                alignas(32) int16_t part[4][16];  // lane 4w + i at part[i][w]
                if (bits == 4) group_codes<4, false>(b, h, e);
                else if (bits == 5) group_codes<5, false>(b, h, e);
                else group_codes<6, false>(b, h, e);
                for (int v = 0; v < 4; ++v) _mm256_store_si256((__m256i*)part[v], e[v]);
                for (int j = 0; j < 64; ++j) lanes[j] = part[j & 3][j >> 2];
            }
            const float sc = _cvtsh_ss(scale[(size_t)r * gpr + g]);
            for (int j = 0; j < G && g * G + j < k; ++j)
                put(out, out_bf16, (size_t)i * ldo + g * G + j, sc * (float)lanes[j]);
        }
    }
    return 0;
}
"""

_PREPARED = PreparedCalls()


def _load():
    p, i = ctypes.c_void_p, ctypes.c_int
    return cpp_function("linear_cpu_fused", SOURCE, "using torch's int4 / int8 matmuls", "ninfer_qdot",
                        [i, p, p, p, i, i, p, i, i, i, i, p, i, i, i, p, i, i, i], supported="ninfer_qdot_supported")


kernel = loaded_once(_load)  # the loaded function (built on first use), or None where it cannot run here


_P, _I = ctypes.c_void_p, ctypes.c_int
# the row decoder of the same library, or None
_rows_function = library_symbol(lambda: kernel(), "linear_cpu_fused", SOURCE, "using torch's int4 / int8 matmuls",
                                "ninfer_qrows", [_I, _P, _P, _P, _I, _I, _I, _P, _I, _P, _I, _I])


def fused_rows(weight: QuantWeight, rows: torch.Tensor, out: torch.Tensor) -> bool:
    """out[i] = the dequantized row rows[i] (int64, contiguous) of `weight`: fp32(scale) x code, exact, one
    rounding into out (bf16 or fp32 [len(rows), K], unit last stride); False where it does not apply or
    the kernel is not here."""
    f = _rows_function()
    if (f is None or rows.dtype != torch.int64 or not rows.is_contiguous() or out.dtype not in _STORED
            or out.dim() != 2 or out.stride(-1) != 1 or out.shape != (rows.numel(), weight.k)):
        return False
    high = weight.high.data_ptr() if weight.high is not None else None
    rc = f(weight.bits, weight.base.data_ptr(), high, weight.scale.data_ptr(), weight.n, weight.groups_per_row,
           weight.k, rows.data_ptr(), rows.numel(), out.data_ptr(), int(out.dtype == torch.bfloat16), out.stride(0))
    if rc != 0:
        raise IndexError(f"linear (torch): a row id is outside the weight's {weight.n} rows")
    return True


_EPILOGUES = {"none": 0, "residual": 1, "swiglu": 2}
_STORED = (torch.float32, torch.bfloat16)


def _rows_ok(t: torch.Tensor | None, shape) -> bool:
    return t is None or (t.dtype in _STORED and t.dim() == 2 and t.stride(-1) == 1 and t.shape == shape)


def _prepared(x, weight: QuantWeight, out, residual, epilogue: str, begin: int = 0, n: int | None = None):
    """The kernel's arguments but the thread count for out = epilogue(x @ W^T) stored in place, or None
    where out / residual / x do not fit (fused_matmul's doc); `begin`, `n`: the weight's rows
    [begin, begin + n) only (default all), their planes read at those byte offsets."""
    t, n = x.shape[0], weight.n if n is None else n
    if (x.dtype not in _STORED or x.dim() != 2 or x.stride(-1) != 1 or x.shape[1] != weight.k
            or not _rows_ok(out, (t, n // 2 if epilogue == "swiglu" else n)) or not _rows_ok(residual, (t, n))
            or epilogue not in _EPILOGUES or (residual is None and epilogue == "residual")):
        return None
    res = residual if epilogue == "residual" else None
    high = weight.high.data_ptr() + begin * weight.high_row_bytes if weight.high is not None else None
    return (weight.bits, weight.base.data_ptr() + begin * weight.base_row_bytes, high,
            weight.scale.data_ptr() + begin * weight.scale_row_bytes, n, weight.groups_per_row, x.data_ptr(),
            int(x.dtype == torch.bfloat16), t, weight.k, x.stride(0), out.data_ptr(), int(out.dtype == torch.bfloat16),
            out.stride(0), _EPILOGUES[epilogue], None if res is None else res.data_ptr(),
            int(res is not None and res.dtype == torch.bfloat16), 0 if res is None else res.stride(0))


def _threads(weight: QuantWeight, t: int, n: int) -> int:
    return 1 if n * weight.groups_per_row * ((t + 3) // 4) < SERIAL_WORK else torch.get_num_threads()


def _call(f, args, x, weight: QuantWeight, threads: int) -> None:
    if f(*args, threads) != 0:
        raise MemoryError(f"linear (torch): the fused CPU kernel could not allocate its scratch "
                          f"({x.shape[0]} x {weight.k})")


def fused_matmul(x: torch.Tensor, weight: QuantWeight, out: torch.Tensor | None = None, residual=None,
                 epilogue: str = "none", rows: tuple[int, int] | None = None):
    """x [T, K] (fp32 or bf16; other dtypes go through fp32) @ W^T. Without `out`: the fp32 [T, N]
    product; `rows=(begin, count)` there: only the weight's rows [begin, begin + count) (fp32
    [T, count]), read in place at their byte offsets in the planes (module doc). With `out` (bf16 or
    fp32 [T, N] or [T, N / 2] for swiglu, unit last stride; `residual` likewise, may alias out):
    out = epilogue(product), stored in place, True; False (nothing done) where out / residual do not
    fit that. A launch's arguments are prepared once (`PreparedCalls`)."""
    f = kernel()
    if f is None:
        raise RuntimeError("linear (torch): the fused CPU kernel is not available here")
    if out is None:
        begin, n = (0, weight.n) if rows is None else (int(rows[0]), int(rows[1]))
        if begin < 0 or n <= 0 or begin + n > weight.n:
            raise RouteError(f"linear (torch): rows [{begin}, {begin + n}) are outside the weight's {weight.n} rows")
        if x.dim() != 2 or x.shape[1] != weight.k:
            raise RouteError(f"linear (torch): x {list(x.shape)} is not [T, K={weight.k}]")
        x = (x if x.dtype in _STORED else x.float()).contiguous()
        product = torch.empty(x.shape[0], n, dtype=torch.float32)
        _call(f, _prepared(x, weight, product, None, "none", begin, n), x, weight, _threads(weight, x.shape[0], n))
        return product
    if rows is not None:
        raise RouteError("linear (torch): rows= applies to the product without out only")
    if x.dtype in _STORED and x.stride(-1) == 1:
        args = _PREPARED.get((x, weight, out, residual), epilogue, lambda: _prepared(x, weight, out, residual, epilogue))
    else:  # x converted: prepared for this call only
        x = (x if x.dtype in _STORED else x.float()).contiguous()
        args = _prepared(x, weight, out, residual, epilogue)
    if args is None:
        return False
    _call(f, args, x, weight, _threads(weight, x.shape[0], weight.n))
    return True
