"""The rope folder's tuner share (`kernels/tuning.py`): the qk_norm_rope bench builder (defaults
only: no param candidates); `rope` itself is not tuned (its entry places its table rows). No
torch / triton at module level (the builder imports them)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def build_qk_norm_rope(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    import torch

    from ninfer_compile.tune import measure as M

    _, hq, d = case.shapes["q"]
    _, hk, _ = case.shapes["k"]
    eps = float(case.attrs.get("eps", 1e-6))
    rot = int(case.attrs.get("rotary_dim", d))
    theta = float(case.attrs.get("theta", 1e7))
    gen = M.generator(seed)
    q = M.randn((t, hq, d), gen)
    k = M.randn((t, hk, d), gen)
    qw = M.randn((d,), gen, 0.1)
    kw = M.randn((d,), gen, 0.1)
    positions = torch.arange(7, 7 + t, dtype=torch.int32, device=M.dev())
    qo = torch.empty_like(q)
    ko = torch.empty_like(k)

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(q=q, k=k, q_weight=qw, k_weight=kw, positions=positions, q_out=qo, k_out=ko,
                    eps=eps, rotary_dim=rot, theta=theta)
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        M.sync()
        rq, rk = M.ref_call(route, q, k, qw, kw, positions, eps, rot, theta)
        return max(M.rel_rms(qo, rq), M.rel_rms(ko, rk))

    return M.Bench(case, t, ctx, 0, 1, make, check)


TUNE = (
    TuneSpec(family="rope", order=50),
    TuneSpec(family="qk_norm_rope", order=60, group="rope",
             builder="ninfer_compile.kernels.rope.tune:build_qk_norm_rope"),
)
