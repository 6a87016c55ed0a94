"""The kv_cache folder's tuner share (`kernels/tuning.py`): the kv_append bench builder (defaults
only: no param candidates). No torch / triton at module level (the builder imports them)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def build_kv_append(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    import torch

    from ninfer_compile.tune import measure as M

    from .reference import cache_as_float

    _, hkv, d = case.shapes["k"]
    quant = case.match.get("kv_dtype") == "int8_g64"
    gen = M.generator(seed)
    k = M.randn((t, hkv, d), gen)
    v = M.randn((t, hkv, d), gen)
    positions = torch.arange(t, dtype=torch.int32, device=M.dev())
    slots = torch.zeros(t, dtype=torch.int32, device=M.dev())
    shape = (1, t, hkv, d)
    if quant:
        kc = torch.zeros(shape, dtype=torch.int8, device=M.dev())
        vc = torch.zeros_like(kc)
        ks = torch.zeros(*shape[:3], d // 64, dtype=torch.float16, device=M.dev())
        vs = torch.zeros_like(ks)
    else:
        kc = torch.zeros(shape, dtype=torch.bfloat16, device=M.dev())
        vc = torch.zeros_like(kc)
        ks = vs = None

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(k=k, v=v, positions=positions, slots=slots, k_cache=kc, v_cache=vc,
                    k_scale=ks, v_scale=vs)
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        z = [torch.zeros_like(a) for a in (kc, vc)] + ([torch.zeros_like(ks), torch.zeros_like(vs)]
                                                       if quant else [None, None])
        make(route, params, 0)()
        M.sync()
        rk, rv, rks, rvs = M.ref_call(route, k, v, positions, slots, *z)
        return max(M.rel_rms(cache_as_float(kc, ks), cache_as_float(rk, rks)),
                   M.rel_rms(cache_as_float(vc, vs), cache_as_float(rv, rvs)))

    return M.Bench(case, t, ctx, 0, 1, make, check)


TUNE = (
    TuneSpec(family="kv_append", order=70, group="kv_cache",
             builder="ninfer_compile.kernels.kv_cache.tune:build_kv_append"),
)
