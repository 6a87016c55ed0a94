"""The kv_cache folder's tuner share (`kernels/tuning.py`): the kv_append bench builder (defaults
only: no param candidates). No torch / triton at module level (the builder imports them)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def build_kv_append(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    import torch

    from ninfer_compile.tune import measure as M

    from .formats import cache_buffers, kv_format
    from .reference import _TORCH, kv_as_float

    _, hkv, d = case.shapes["k"]
    fmt = kv_format(case.match.get("kv_dtype") or "bf16")  # any KV format (formats.py)
    gen = M.generator(seed)
    k = M.randn((t, hkv, d), gen)
    v = M.randn((t, hkv, d), gen)
    positions = torch.arange(t, dtype=torch.int32, device=M.dev())
    slots = torch.zeros(t, dtype=torch.int32, device=M.dev())
    bufs = [torch.zeros(s, dtype=_TORCH[dt], device=M.dev()) for _, s, dt in cache_buffers(fmt, 1, t, hkv, d)]
    kc, vc, ks, vs = bufs + [None] * (4 - len(bufs))

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(k=k, v=v, positions=positions, slots=slots, k_cache=kc, v_cache=vc,
                    k_scale=ks, v_scale=vs)
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        z = [None if a is None else torch.zeros_like(a) for a in (kc, vc, ks, vs)]
        make(route, params, 0)()
        M.sync()
        rk, rv, rks, rvs = M.ref_call(route, k, v, positions, slots, *z)
        gk, gv = kv_as_float(kc, vc, ks, vs, d)
        wk, wv = kv_as_float(rk, rv, rks, rvs, d)
        return max(M.rel_rms(gk, wk), M.rel_rms(gv, wv))

    return M.Bench(case, t, ctx, 0, 1, make, check)


TUNE = (
    TuneSpec(family="kv_append", order=70, group="kv_cache",
             builder="ninfer_compile.kernels.kv_cache.tune:build_kv_append"),
)
