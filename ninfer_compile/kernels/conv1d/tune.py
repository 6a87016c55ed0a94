"""The conv1d family's tuner share (`kernels/tuning.py`): the bench builder (defaults only: no
param candidates); it joins the `--families gdn` group. No torch / triton at module level (the
builder imports it)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def build_conv1d(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    import torch

    from ninfer_compile.tune import measure as M

    m = case.match
    c, kk = int(m["n"]), int(m["k"])
    decode = m.get("phase") == "decode"
    gen = M.generator(seed)
    n_slots, positions, slots = M.columns(t, decode, 10, 3)
    x = M.randn((t, c), gen)
    weight = M.randn((kk, c), gen, 0.5)
    state0 = M.randn((n_slots, kk - 1, c), gen)
    per = state0.numel() * 2 * 2 + weight.numel() * 2
    nc = M.n_copies(per) if copies is None else copies
    states = [state0.clone() for _ in range(nc)]
    out = torch.empty(t, c, dtype=torch.bfloat16, device=M.dev())

    def make(route, params, i):
        fn = route.load_launcher()
        a = dict(x=x, weight=weight, conv_state=states[i], positions=positions, slots=slots, out=out)
        return lambda: M.call_launcher(fn, a, params)

    def check(route, params):
        states[0].copy_(state0)
        make(route, params, 0)()
        M.sync()
        ref_out, _ = M.ref_call(route, x, weight, state0, positions, slots)
        states[0].copy_(state0)
        return M.rel_rms(out, ref_out)

    return M.Bench(case, t, ctx, per, nc, make, check, [states])


TUNE = (
    TuneSpec(family="conv1d", order=90, group="gdn", builder="ninfer_compile.kernels.conv1d.tune:build_conv1d",
             doc="cold operands: the conv state and the weight"),
)
