"""Shared helpers of the CPU path's torch implementations (`kernels/<family>/torch_impl.py`).

The torch implementations compute in fp32 and round once at the store, like the Triton kernels.
No triton import here or in any torch_impl module: the CPU path imports and runs without Triton.

Weight layout of the CPU path: a linear weight used by a wide product (prefill) or too small to
gain from packing is dequantized once, at its first use, into an fp32 [N, K] tensor (exact:
scale32 x code32, the linear reference's oracle) and kept for the weight object's lifetime
(`fp32_weight`); a bf16 weight is upcast once the same way. Few-column products of row-split
weights (decode) read torch's int4 / int8 CPU matmul operands instead (`linear/torch_packed.py`,
kept with `derived`). The caches are keyed by the weight object (the runtime binds one object per
(name, row view)), so decode steps never repack; an entry is released with its object.

Fused C++ kernels (`cpp_library`): a family may carry a C++ source for its few-column CPU work
(e.g. linear's AVX2 product, the GDN decode step, the norms), built with the system C++ compiler
(`$CXX`, else g++ / c++) `-O3 -fopenmp -shared` into `$NINFER_CACHE_DIR` (default
`~/.cache/ninfer`), one library per source text (its sha256 in the file name), so a machine
compiles each once (seconds); loaded with ctypes. Where no compiler works, or `NINFER_CPU_FUSED=0`,
the library is None (one line on stderr says why) and the family keeps its torch ops.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch

__all__ = ["fp32_weight", "cached_fp32_weight", "derived", "store", "drop_fp32_weights", "cpp_library",
           "cpp_function", "BF16_CPP", "EXP_CPP", "POOL_CPP", "POOL_DECL", "PreparedCalls", "pool_library"]

CPP_FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-shared", "-fPIC")

# id(weight object) -> (weakref to it, fp32 [N, K]); entries die with their object
_FP32: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def _forget(key: int):
    def cb(_ref):
        _FP32.pop(key, None)
    return cb


def fp32_weight(weight) -> torch.Tensor:
    """The fp32 [N, K] matrix of a linear weight (`QuantWeight` or a bf16/fp32 [N, K] tensor),
    dequantized once per weight object and cached (the CPU path's weight layout)."""
    if isinstance(weight, torch.Tensor) and weight.dtype == torch.float32:
        return weight
    key = id(weight)
    hit = _FP32.get(key)
    if hit is not None and hit[0]() is weight:
        return hit[1]
    if isinstance(weight, torch.Tensor):
        w32 = weight.float().contiguous()
    else:
        from .linear.reference import dequantize

        w32 = dequantize(weight).contiguous()
    _FP32[key] = (weakref.ref(weight, _forget(key)), w32)
    return w32


def cached_fp32_weight(weight) -> torch.Tensor | None:
    """The fp32 matrix `fp32_weight` already made for this object, else None (makes nothing)."""
    hit = _FP32.get(id(weight))
    return hit[1] if hit is not None and hit[0]() is weight else None


# (id(tensor), tag) -> (weakref to it, derived tensor): small per-weight constants (e.g. 1 + w in fp32)
_DERIVED: dict[tuple[int, str], tuple[weakref.ref, torch.Tensor]] = {}


def derived(t: torch.Tensor, tag: str, make) -> torch.Tensor:
    """`make(t)`, computed once per (weight object, tag) and kept while the object lives (a weight
    tensor or a `QuantWeight`; the plan's weights are bound once; per-step activations must not
    come here)."""
    key = (id(t), tag)
    hit = _DERIVED.get(key)
    if hit is not None and hit[0]() is t:
        return hit[1]
    value = make(t)

    def forget(_ref, key=key):
        _DERIVED.pop(key, None)

    _DERIVED[key] = (weakref.ref(t, forget), value)
    return value


def drop_fp32_weights() -> None:
    """Forget every cached fp32 weight and derived constant (tests; memory pressure)."""
    _FP32.clear()
    _DERIVED.clear()


class PreparedCalls:
    """A fused C++ call's arguments prepared once per combination of its argument objects (`get`):
    the runtime binds each launch's tensors (arena views, weights) once, so every decode step finds
    its launch here and skips the per-call checks and pointer look-ups (~5 us of Python a launch).
    Entries hold weak references and match by identity, so a dead object's recycled id never
    matches; a tensor's storage, shape and strides are taken as fixed while it lives (the runtime's
    views are never resized). At most LIMIT entries (all dropped when full)."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[tuple, Any]] = {}

    def get(self, objs: tuple, extra, make):
        """`make()` (the prepared arguments, or None: the fused call does not apply) for these objects
        (tensors, weights or None) and `extra` (hashable: scalars that shape the call), cached."""
        key = (extra, *[id(o) for o in objs])
        hit = self._entries.get(key)
        if hit is not None:
            for ref, o in zip(hit[0], objs):
                if (ref() if ref is not None else None) is not o:
                    break
            else:
                return hit[1]
        value = make()
        if len(self._entries) >= self.LIMIT:
            self._entries.clear()
        self._entries[key] = (tuple(None if o is None else weakref.ref(o) for o in objs), value)
        return value


def store(out: torch.Tensor, value: torch.Tensor) -> None:
    """Write `value` (fp32) into `out` in place, rounding once to out's dtype."""
    out.copy_(value)


def cpp_library(name: str, source: str, what: str, mode: int = ctypes.DEFAULT_MODE) -> ctypes.CDLL | None:
    """The C++ `source` built (once per machine and source text) and loaded as `name_<sha>.so`, or
    None (NINFER_CPU_FUSED=0, no compiler, a failed build or load: one stderr line, `what` saying
    what runs instead). A source that declares POOL_DECL gets the pool library loaded first."""
    def off(why: str) -> None:
        print(f"ninfer: {name}: the fused CPU kernel is off ({why}); {what}", file=sys.stderr)

    if os.environ.get("NINFER_CPU_FUSED", "1") == "0":
        return None
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        off("no C++ compiler: set CXX or install g++")
        return None
    digest = hashlib.sha256((source + " ".join(CPP_FLAGS)).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("NINFER_CACHE_DIR") or Path.home() / ".cache" / "ninfer")
    lib = cache / f"{name}_{digest}.so"
    if not lib.is_file():
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                src = Path(tmp) / f"{name}.cpp"
                src.write_text(source)
                out = Path(tmp) / lib.name
                p = subprocess.run([cxx, *CPP_FLAGS, str(src), "-o", str(out)], capture_output=True, text=True)
                if p.returncode != 0:
                    off(f"{Path(cxx).name} failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
                    return None
                os.replace(out, lib)
        except OSError as e:
            off(f"cannot build in {cache}: {e}")
            return None
    if POOL_DECL in source and pool_library() is None:
        off("the helper-thread pool library is not available")
        return None
    try:
        return ctypes.CDLL(str(lib), mode=mode)
    except OSError as e:
        off(f"cannot load {lib.name}: {e}")
        return None


# bf16 <-> fp32 for the families' C++ sources (prepended to them): round to nearest even, NaN kept;
# `load` reads n elements of either into fp32
BF16_CPP = r"""#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float from_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                 // round to nearest even
}
// n elements at p (bf16 or fp32) into dst as fp32
static inline void load(const void* p, int bf16, int n, float* dst) {
    if (bf16) { const uint16_t* s = (const uint16_t*)p; for (int i = 0; i < n; ++i) dst[i] = from_bf16(s[i]); }
    else memcpy(dst, p, sizeof(float) * n);
}
"""


# SiLU v / (1 + exp(-v)) and sigmoid 1 / (1 + exp(-v)) over n fp32 values in place, for the families'
# C++ sources (prepended after BF16_CPP): on AVX2 + FMA CPUs exp comes from an 8-wide Cody-Waite reduction (x = k ln2 + r, two-part
# ln2) and a degree-6 polynomial of e^r (relative error ~2 ulp of fp32, exp(-88..88); |v| >= 88
# gives exp's limits: 0 and +inf, so SiLU 0 / v), elsewhere libm's expf
EXP_CPP = r"""#include <immintrin.h>
__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.0f)), _mm256_set1_ps(88.0f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
__attribute__((target("avx2,fma"))) static void silu_avx2(float* v, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(v + i);
        const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)));
        _mm256_storeu_ps(v + i, _mm256_div_ps(x, d));
    }
    for (; i < n; ++i) v[i] = v[i] / (1.f + expf(-v[i]));
}
__attribute__((target("avx2,fma"))) static void sigmoid_avx2(float* v, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(v + i))));
        _mm256_storeu_ps(v + i, _mm256_div_ps(_mm256_set1_ps(1.0f), d));
    }
    for (; i < n; ++i) v[i] = 1.f / (1.f + expf(-v[i]));
}
static int has_avx2_fma(void) {
    static const int yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
}
static void silu_inplace(float* v, int n) {
    if (has_avx2_fma()) { silu_avx2(v, n); return; }
    for (int i = 0; i < n; ++i) v[i] = v[i] / (1.f + expf(-v[i]));
}
static void sigmoid_inplace(float* v, int n) {
    if (has_avx2_fma()) { sigmoid_avx2(v, n); return; }
    for (int i = 0; i < n; ++i) v[i] = 1.f / (1.f + expf(-v[i]));
}
"""


# The helper-thread pool of the CPU path, one library for the process (`pool_library`, loaded with
# RTLD_GLOBAL before any family library that declares POOL_DECL): ninfer_parallel_chunks(threads,
# chunks, fn, ctx) runs fn(ctx, c) for every chunk c, the calling thread taking chunks too; a helper
# takes chunks only while it runs, so a helper the OS has not scheduled (a busy shared machine) never
# holds the caller up (OpenMP's closing barrier waits for every thread of the team). Helpers start on
# first use, spin ~0.1 ms after a job, then sleep on a condition variable. Protocol: the job's epoch
# is odd while the caller sets a job up and even once published; a helper counts itself `inside` and
# rechecks the epoch before reading the job, and the caller waits until no helper is inside before
# rewriting it. One caller at a time (a second concurrent caller runs its chunks alone).
POOL_CPP = r"""#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <immintrin.h>

typedef void (*chunk_fn)(void* ctx, int chunk);
enum { POOL_SPIN = 4000 };  // pauses (~25 ns each on AMD Zen 3) a helper spins before it sleeps
static std::atomic<long> pool_epoch{0};
static std::atomic<int> pool_inside{0}, pool_next{0}, pool_done{0};
static chunk_fn pool_fn;
static void* pool_ctx;
static int pool_chunks, pool_helpers, pool_started;
// never destroyed: a helper may still wait on them when the process exits
static std::mutex& pool_sleep = *new std::mutex;
static std::mutex& pool_caller = *new std::mutex;
static std::condition_variable& pool_wake = *new std::condition_variable;

static void pool_take(chunk_fn fn, void* ctx, int chunks) {
    for (int c; (c = pool_next.fetch_add(1)) < chunks;) { fn(ctx, c); pool_done.fetch_add(1); }
}

static void pool_helper(int index) {
    long seen = 0;
    for (;;) {
        long e = pool_epoch.load();
        for (int i = 0; (e == seen || (e & 1)) && i < POOL_SPIN; ++i) { _mm_pause(); e = pool_epoch.load(); }
        if (e == seen || (e & 1)) {
            std::unique_lock<std::mutex> lk(pool_sleep);
            pool_wake.wait(lk, [&] { const long v = pool_epoch.load(); return v != seen && !(v & 1); });
            continue;
        }
        seen = e;
        pool_inside.fetch_add(1);
        if (pool_epoch.load() == e && index < pool_helpers) pool_take(pool_fn, pool_ctx, pool_chunks);
        pool_inside.fetch_sub(1);
    }
}

extern "C" void ninfer_parallel_chunks(int threads, int chunks, chunk_fn fn, void* ctx) {
    std::unique_lock<std::mutex> own(pool_caller, std::try_to_lock);
    if (threads <= 1 || chunks <= 1 || !own.owns_lock()) {
        for (int c = 0; c < chunks; ++c) fn(ctx, c);
        return;
    }
    for (; pool_started < threads - 1; ++pool_started) std::thread(pool_helper, pool_started).detach();
    pool_epoch.fetch_add(1);  // odd: helpers stay out
    while (pool_inside.load() != 0) _mm_pause();
    pool_fn = fn;
    pool_ctx = ctx;
    pool_chunks = chunks;
    pool_helpers = threads - 1;
    pool_next.store(0);
    pool_done.store(0);
    pool_epoch.fetch_add(1);  // even: published
    { std::lock_guard<std::mutex> lk(pool_sleep); }
    pool_wake.notify_all();
    pool_take(fn, ctx, chunks);
    while (pool_done.load() < chunks) _mm_pause();
}
"""

# what a family's C++ source declares to use the pool (`parallel_chunks`); `cpp_library` then loads
# the pool library first
POOL_DECL = r"""typedef void (*chunk_fn)(void* ctx, int chunk);
extern "C" void ninfer_parallel_chunks(int threads, int chunks, chunk_fn fn, void* ctx);
static inline void parallel_chunks(int threads, int chunks, chunk_fn fn, void* ctx) {
    ninfer_parallel_chunks(threads, chunks, fn, ctx);
}
"""


def pool_library() -> ctypes.CDLL | None:
    """The process's helper-thread pool (POOL_CPP), built and loaded once with RTLD_GLOBAL so the
    family libraries that declare POOL_DECL resolve to it; None where it cannot be built."""
    if not _POOL:
        _POOL.append(cpp_library("cpu_pool", POOL_CPP, "the fused CPU kernels are off too", mode=ctypes.RTLD_GLOBAL))
    return _POOL[0]


_POOL: list = []


def loaded_once(load):
    """A function returning `load()`'s result, computed on its first call: a family's fused CPU
    kernel (or None where it cannot run here), built and loaded once per process."""
    cache: list = []

    def loaded():
        if not cache:
            cache.append(load())
        return cache[0]

    return loaded


def library_symbol(main, name: str, source: str, what: str, symbol: str, argtypes):
    """A further `symbol` (int result) of the library a family's `main()` kernel comes from, loaded on
    first use; None wherever `main()` is None (no compiler, no AVX2, NINFER_CPU_FUSED=0)."""
    def load():
        if main() is None:
            return None
        f = getattr(cpp_library(name, source, what), symbol)
        f.argtypes, f.restype = argtypes, ctypes.c_int
        return f

    return loaded_once(load)


def cpp_function(name: str, source: str, what: str, symbol: str, argtypes, supported: str | None = None):
    """`symbol` of `cpp_library(name, source, what)` with its argument types (an int result), or None:
    no library, or `supported` (a symbol of the library) says this CPU lacks the instructions."""
    lib = cpp_library(name, source, what)
    if lib is None:
        return None
    if supported is not None and not getattr(lib, supported)():
        print(f"ninfer: {name}: the fused CPU kernel is off (this CPU lacks the instructions it needs); {what}",
              file=sys.stderr)
        return None
    f = getattr(lib, symbol)
    f.argtypes = list(argtypes)
    f.restype = ctypes.c_int
    return f
