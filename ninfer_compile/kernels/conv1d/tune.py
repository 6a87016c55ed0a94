"""The conv1d family's tuner share (`kernels/tuning.py`): the bench builder and param candidates
(conv1d_verify's block_c / num_warps; the other routes: defaults only); it joins the
`--families gdn` group. No torch / triton at module level (the
builder imports it)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def conv1d_candidates(route, t: int, quick: bool) -> list[dict]:
    if "verify" in route.name:
        return [{}, {"block_c": 512}, {"block_c": 128}, {"num_warps": 4}, {"block_c": 512, "num_warps": 4},
                {"block_c": 1024, "num_warps": 8}]
    return [{}]


def build_conv1d(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    import torch

    from ninfer_compile.tune import measure as M

    from ..gdn.tune import verify_columns, verify_window

    m = case.match
    c, kk = int(m["n"]), int(m["k"])
    decode = m.get("phase") == "decode"
    window = verify_window(case)
    t_asked = t
    if window:  # whole verify rows: t columns round up to ceil(t / W) rows of W
        t = -(-t // window) * window
    gen = M.generator(seed)
    n_slots, positions, slots = verify_columns(t, window, 10) if window else M.columns(t, decode, 10, 3)
    x = M.randn((t, c), gen)
    weight = M.randn((kk, c), gen, 0.5)
    state0 = M.randn((n_slots, kk - 1, c), gen)
    per = state0.numel() * 2 * 2 + weight.numel() * 2
    nc = M.n_copies(per) if copies is None else copies
    states = [state0.clone() for _ in range(nc)]
    out = torch.empty(t, c, dtype=torch.bfloat16, device=M.dev())
    cols = torch.empty(t // window, window - 1, kk - 1, c, dtype=state0.dtype, device=M.dev()) if window else None

    def make(route, params, i):
        fn = route.load_launcher()
        a = dict(x=x, weight=weight, conv_state=states[i], positions=positions, slots=slots, out=out)
        if window:
            a["conv_state_columns"] = cols
        return lambda: M.call_launcher(fn, a, params)

    def check(route, params):
        states[0].copy_(state0)
        make(route, params, 0)()
        M.sync()
        extra = {"window": window} if window else {}
        ref_out = M.ref_call(route, x, weight, state0, positions, slots, **extra)[0]
        states[0].copy_(state0)
        return M.rel_rms(out, ref_out)

    return M.Bench(case, t_asked, ctx, per, nc, make, check, [states])


TUNE = (
    TuneSpec(family="conv1d", order=90, group="gdn", builder="ninfer_compile.kernels.conv1d.tune:build_conv1d",
             candidates=conv1d_candidates,
             doc="cold operands: the conv state and the weight; verify cases (attribute window W) measure "
                 "ceil(T / W) whole rows and also write conv_state_columns"),
)
