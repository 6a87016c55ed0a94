"""The norm families' tuner share (`kernels/tuning.py`): bench builders of rmsnorm, head_rmsnorm
and gated_rmsnorm, and rmsnorm's param candidates. No torch / triton at module level (the
builders import them)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def rmsnorm_candidates(route, t: int, quick: bool) -> list[dict]:
    return [{}, {"num_warps": 4}, {"num_warps": 16}, {"num_warps": 2}]


def build_rmsnorm(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    import torch

    from ninfer_compile.tune import measure as M

    h = int(case.match.get("n") or case.shapes["weight"][0])
    eps = float(case.attrs.get("eps", 1e-6))
    gen = M.generator(seed)
    x = M.randn((t, h), gen)
    w = M.randn((h,), gen, 0.1)
    out = torch.empty(t, h, dtype=torch.bfloat16, device=M.dev())

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(x=x, weight=w, out=out, eps=eps)
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        M.sync()
        return M.rel_rms(out, M.ref_call(route, x, w, eps))

    return M.Bench(case, t, ctx, 0, 1, make, check)


def _head_norm(case, t: int, ctx: int | None, gated: bool, seed: int):
    """head_rmsnorm (x [T, heads, D]) and gated_rmsnorm (x, z [T, Hv, Dv] -> [T, Hv*Dv])."""
    import torch

    from ninfer_compile.tune import measure as M

    _, heads, d = case.shapes["x"]
    eps = float(case.attrs.get("eps", 1e-6))
    gen = M.generator(seed)
    x = M.randn((t, heads, d), gen)
    w = M.randn((d,), gen, 0.1)
    z = M.randn((t, heads, d), gen) if gated else None
    out = torch.empty(*((t, heads * d) if gated else (t, heads, d)), dtype=torch.bfloat16, device=M.dev())

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(x=x, weight=w, out=out, eps=eps)
        if gated:
            args["z"] = z
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        M.sync()
        ref = M.ref_call(route, x, z, w, eps) if gated else M.ref_call(route, x, w, eps)
        return M.rel_rms(out, ref)

    return M.Bench(case, t, ctx, 0, 1, make, check)


def build_head_rmsnorm(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    return _head_norm(case, t, ctx, False, seed)


def build_gated_rmsnorm(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    return _head_norm(case, t, ctx, True, seed)


_M = "ninfer_compile.kernels.norms.tune"

TUNE = (
    TuneSpec(family="rmsnorm", order=30, group="norms", builder=f"{_M}:build_rmsnorm",
             candidates=rmsnorm_candidates),
    TuneSpec(family="head_rmsnorm", order=40, group="norms", builder=f"{_M}:build_head_rmsnorm"),
    TuneSpec(family="gated_rmsnorm", order=120, group="norms", builder=f"{_M}:build_gated_rmsnorm"),
)
