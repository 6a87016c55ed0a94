"""CPU path of `gated_delta_rule` for decode columns: one fused C++ step (AVX2 + FMA, threads over
(column, value head) items) in place of ~40 small torch ops, built once per machine by
`torch_util.cpp_library` and loaded with ctypes; the (column, head) items are shared among the
threads by the process's helper-thread pool (`torch_util.POOL_CPP`).

Per column c and value head j (key head j // (Hv / Hk)), with S the slot's [Dk, Dv] fp32 state:
q, k are L2-normalised in fp32 (x * 1/sqrt(sum x^2 + eps); q then times `scale`), a = exp(g),
one read of S gives q.S and k.S, u = beta (v - a k.S), S <- a S + k u^T (one read-modify-write of
S), o = a q.S + (q.k) u (= q . the new S), stored once (bf16 rounded to nearest even, or fp32).
The same arithmetic as the torch ops of `torch_impl._step` up to fp32 summation order. A column
whose position is 0 starts from a zero state (zeroed here before the call). Used when every column
has its own slot, q / k / v are bf16 or fp32 with unit last stride, g / beta fp32 rows, the state
contiguous per slot, and Dk, Dv <= 512; otherwise (or where the library is None: no compiler, no
AVX2 / FMA, NINFER_CPU_FUSED=0) `fused_decode` returns False and the torch ops run.

`fused_gating_proj` (same library): gdn_gating_proj for up to MAX_GATING_COLUMNS columns, the two
[Hv, K] fp32 dot products per column and head (AVX2, two partial sums) then torch's softplus
(threshold 20) and sigmoid in fp32, in place of ~13 torch ops; the torch ops' arithmetic up to fp32
summation order and expf / log1pf's last bits.
"""

from __future__ import annotations

import ctypes

import torch

from ..torch_util import BF16_CPP, POOL_DECL, PreparedCalls, cpp_function, library_symbol, loaded_once

__all__ = ["SOURCE", "fused_decode", "fused_gating_proj"]

SOURCE = BF16_CPP + POOL_DECL + r"""#include <immintrin.h>
#define TGT __attribute__((target("avx2,fma")))
enum { MAXD = 512 };

extern "C" int ninfer_gdn_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}


// q / k [n, Hk, Dk], v [n, Hv, Dv] (element strides per column / head, unit last stride; bf16 or
// fp32: in_bf16); g / beta [n, Hv] fp32 (column stride gb_col); state + slots[c] * slot_stride:
// column c's [Hv, Dk, Dv] fp32; out [n, Hv, Dv] (column / head strides; bf16 or fp32: out_bf16).
struct GdnJob {
    int n, Hk, Hv, Dk, Dv; const void *q, *k, *v; int in_bf16; long q_col, q_head, k_col, k_head, v_col, v_head;
    const float *g, *beta; long gb_col; float* state; const int* slots; long slot_stride; void* out; int out_bf16;
    long o_col, o_head; float scale, eps;
};

// work item w: column w / Hv, value head w % Hv (`parallel_chunks` hands them out)
static TGT void gdn_item(void* ctx, int w) {
    const GdnJob& J = *(const GdnJob*)ctx;
    const int n = J.n, Hv = J.Hv, Dk = J.Dk, Dv = J.Dv, in_bf16 = J.in_bf16, out_bf16 = J.out_bf16;
    const void *q = J.q, *k = J.k, *v = J.v;
    const long q_col = J.q_col, q_head = J.q_head, k_col = J.k_col, k_head = J.k_head, v_col = J.v_col,
               v_head = J.v_head, gb_col = J.gb_col, slot_stride = J.slot_stride, o_col = J.o_col, o_head = J.o_head;
    const float *g = J.g, *beta = J.beta;
    float* state = J.state;
    const int* slots = J.slots;
    void* out = J.out;
    const float scale = J.scale, eps = J.eps;
    const int rep = Hv / J.Hk, es = in_bf16 ? 2 : 4;
    {
        const int c = w / Hv, j = w % Hv, h = j / rep;
        float qv[MAXD], kv[MAXD], vv[MAXD], qs[MAXD], ks[MAXD], u[MAXD], o[MAXD];
        load((const char*)q + (c * q_col + h * q_head) * es, in_bf16, Dk, qv);
        load((const char*)k + (c * k_col + h * k_head) * es, in_bf16, Dk, kv);
        load((const char*)v + (c * v_col + j * v_head) * es, in_bf16, Dv, vv);
        float sq = 0.f, sk = 0.f;
        for (int d = 0; d < Dk; ++d) { sq += qv[d] * qv[d]; sk += kv[d] * kv[d]; }
        const float rq = 1.f / sqrtf(sq + eps), rk = 1.f / sqrtf(sk + eps);
        float qk = 0.f;
        for (int d = 0; d < Dk; ++d) { qv[d] = qv[d] * rq * scale; kv[d] *= rk; qk += qv[d] * kv[d]; }
        const float a = expf(g[c * gb_col + j]), b = beta[c * gb_col + j];
        float* S = state + slots[c] * slot_stride + (long)j * Dk * Dv;
        // the next (column, head)'s state, fetched while this one is read (the reads stream from memory)
        const float* next = w + 1 < n * Hv ? state + slots[(w + 1) / Hv] * slot_stride + (long)((w + 1) % Hv) * Dk * Dv
                                           : nullptr;
        for (int e = 0; e < Dv; ++e) { qs[e] = 0.f; ks[e] = 0.f; }
        for (int d = 0; d < Dk; ++d) {
            const float qd = qv[d], kd = kv[d];
            const float* row = S + (long)d * Dv;
            if (next) for (int e = 0; e < Dv; e += 16) _mm_prefetch((const char*)(next + (long)d * Dv + e), _MM_HINT_T0);
            for (int e = 0; e < Dv; ++e) { qs[e] += qd * row[e]; ks[e] += kd * row[e]; }
        }
        for (int e = 0; e < Dv; ++e) { u[e] = b * (vv[e] - a * ks[e]); o[e] = a * qs[e] + qk * u[e]; }
        for (int d = 0; d < Dk; ++d) {
            const float kd = kv[d];
            float* row = S + (long)d * Dv;
            for (int e = 0; e < Dv; ++e) row[e] = a * row[e] + kd * u[e];
        }
        char* op = (char*)out + (c * o_col + j * o_head) * (out_bf16 ? 2 : 4);
        if (out_bf16) { uint16_t* dst = (uint16_t*)op; for (int e = 0; e < Dv; ++e) dst[e] = to_bf16(o[e]); }
        else memcpy(op, o, sizeof(float) * Dv);
    }
}

extern "C" TGT int ninfer_gdn_step(int n, int Hk, int Hv, int Dk, int Dv, const void* q, const void* k,
                                   const void* v, int in_bf16, long q_col, long q_head, long k_col, long k_head,
                                   long v_col, long v_head, const float* g, const float* beta, long gb_col,
                                   float* state, const int* slots, long slot_stride, void* out, int out_bf16,
                                   long o_col, long o_head, float scale, float eps, int threads) {
    if (Dk > MAXD || Dv > MAXD || Hk <= 0 || Hv % Hk) return 1;
    GdnJob job = {n, Hk, Hv, Dk, Dv, q, k, v, in_bf16, q_col, q_head, k_col, k_head, v_col, v_head, g, beta, gb_col,
                  state, slots, slot_stride, out, out_bf16, o_col, o_head, scale, eps};
    parallel_chunks(threads, n * Hv, gdn_item, &job);
    return 0;
}

static inline TGT float dot(const float* a, const float* b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    alignas(32) float l[8];
    _mm256_store_ps(l, _mm256_add_ps(s0, s1));
    float t = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; i < n; ++i) t += a[i] * b[i];
    return t;
}

// gdn_gating_proj for n columns: x [n, K] (column stride x_col, unit last stride; bf16 or fp32), wa / wb
// [Hv, K] fp32, neg_rate = -exp(a_log), bias = dt_bias [Hv] fp32; g / beta [n, Hv] fp32 (column
// strides): g = neg_rate * softplus(x.wa + bias) (torch's threshold: the identity above 20),
// beta = sigmoid(x.wb).
extern "C" TGT int ninfer_gdn_gating_proj(int n, int K, int Hv, const void* x, int x_bf16, long x_col,
                                          const float* wa, const float* wb, const float* neg_rate,
                                          const float* bias, float* g, long g_col, float* beta, long b_col) {
    float* row = (float*)malloc(sizeof(float) * K);
    if (!row) return 2;
    for (int c = 0; c < n; ++c) {
        load((const char*)x + c * x_col * (x_bf16 ? 2 : 4), x_bf16, K, row);
        for (int j = 0; j < Hv; ++j) {
            const float a = dot(row, wa + (long)j * K, K) + bias[j], b = dot(row, wb + (long)j * K, K);
            g[c * g_col + j] = neg_rate[j] * (a > 20.f ? a : log1pf(expf(a)));
            beta[c * b_col + j] = 1.f / (1.f + expf(-b));
        }
    }
    free(row);
    return 0;
}
"""

MAX_GATING_COLUMNS = 64  # more columns (prefill): torch's matmuls
_PREPARED = PreparedCalls()
_IN = (torch.bfloat16, torch.float32)


def _load():
    p, i, l, fl = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
    return cpp_function("gdn_cpu_fused", SOURCE, "the GDN decode step runs as torch ops", "ninfer_gdn_step",
                        [i, i, i, i, i, p, p, p, i, l, l, l, l, l, l, p, p, l, p, p, l, p, i, l, l, fl, fl, i],
                        supported="ninfer_gdn_supported")


kernel = loaded_once(_load)  # the loaded function (built on first use), or None where it cannot run here


_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
# the gating function of the same library, or None
_gating_function = library_symbol(lambda: kernel(), "gdn_cpu_fused", SOURCE, "the GDN decode step runs as torch ops",
                                  "ninfer_gdn_gating_proj", [_I, _I, _I, _P, _I, _L, _P, _P, _P, _P, _P, _L, _P, _L])


def _gating_args(x, wa, wb, neg_rate, bias, g, beta):
    T, K = x.shape
    Hv = wa.shape[0]
    if (T > MAX_GATING_COLUMNS or x.dtype not in _IN or x.stride(-1) != 1
            or any(t.dtype != torch.float32 or not t.is_contiguous() for t in (wa, wb, neg_rate, bias))
            or wb.shape != (Hv, K) or wa.shape[1] != K or neg_rate.numel() != Hv or bias.numel() != Hv
            or any(t.dtype != torch.float32 or t.shape != (T, Hv) or t.stride(-1) != 1 for t in (g, beta))):
        return None
    return (T, K, Hv, x.data_ptr(), int(x.dtype == torch.bfloat16), x.stride(0), wa.data_ptr(), wb.data_ptr(),
            neg_rate.data_ptr(), bias.data_ptr(), g.data_ptr(), g.stride(0), beta.data_ptr(), beta.stride(0))


def fused_gating_proj(x, wa, wb, neg_rate, bias, g, beta) -> bool:
    """g, beta = gdn_gating_proj for up to MAX_GATING_COLUMNS columns (module doc): x [T, K] bf16 / fp32
    (unit last stride), wa / wb [Hv, K] and neg_rate / bias [Hv] contiguous fp32, g / beta [T, Hv]
    fp32 rows; False (nothing done) where it does not apply. A launch's arguments are prepared once
    (`torch_util.PreparedCalls`)."""
    f = _gating_function()
    if f is None or x.dim() != 2:
        return False
    args = _PREPARED.get((x, wa, wb, neg_rate, bias, g, beta), None,
                         lambda: _gating_args(x, wa, wb, neg_rate, bias, g, beta))
    if args is None:
        return False
    if f(*args) != 0:
        raise MemoryError(f"gdn_gating_proj (torch): the fused CPU kernel could not allocate a row of {x.shape[1]}")
    return True


def _step_args(q, k, v, g, beta, state, slots, out, scale: float, eps: float):
    """The step's arguments but the thread count, or None where the fused step does not apply."""
    T, Hk, Dk = q.shape
    Hv, Dv = v.shape[1], v.shape[2]
    if (max(Dk, Dv) > 512 or Hv % Hk or q.dtype not in _IN or k.dtype != q.dtype or v.dtype != q.dtype
            or out.dtype not in _IN or g.dtype != torch.float32 or beta.dtype != torch.float32
            or g.stride() != beta.stride() or slots.dtype != torch.int32 or not slots.is_contiguous()
            or any(t.stride(-1) != 1 for t in (q, k, v, g, out))
            or state.stride()[1:] != (Dk * Dv, Dv, 1)):
        return None
    return (T, Hk, Hv, Dk, Dv, q.data_ptr(), k.data_ptr(), v.data_ptr(), int(q.dtype == torch.bfloat16),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.data_ptr(),
            beta.data_ptr(), g.stride(0), state.data_ptr(), slots.data_ptr(), state.stride(0), out.data_ptr(),
            int(out.dtype == torch.bfloat16), out.stride(0), out.stride(1), scale, eps)


def fused_decode(q, k, v, g, beta, state, positions, slots, out, scale: float, eps: float) -> bool:
    """One decode step of every column through its own slot's state (module doc); False (nothing
    done) where the fused step does not apply. A launch's arguments are prepared once
    (`torch_util.PreparedCalls`); the slots' distinctness and the position-0 resets are per call."""
    f = kernel()
    if f is None or q.dim() != 3 or v.dim() != 3:
        return False
    args = _PREPARED.get((q, k, v, g, beta, state, slots, out), (scale, eps),
                         lambda: _step_args(q, k, v, g, beta, state, slots, out, scale, eps))
    slot_list = slots.tolist()
    if args is None or len(set(slot_list)) != args[0]:  # every column its own slot
        return False
    for s, p in zip(slot_list, positions.tolist()):
        if p == 0:
            state[s].zero_()
    rc = f(*args, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"gated_delta_rule (torch): the fused CPU step refused its shapes (code {rc})")
    return True
