"""The Gated DeltaNet families' tuner share (`kernels/tuning.py`): bench builders of
gated_delta_rule, gdn_gating and gdn_gating_proj, and their param candidates. (conv1d, in the same
`--families gdn` group, lives in kernels/conv1d/tune.py.) No torch / triton at module level (the
builders import them)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def gated_delta_rule_candidates(route, t: int, quick: bool) -> list[dict]:
    if "decode" in route.name or "verify" in route.name:
        return [{}, {"block_v": 64}, {"block_v": 16}, {"block_v": 64, "num_warps": 8}, {"num_warps": 2}]
    if route.name == "gdn_chunked_wy_prefill":  # block_v 64 only: the block_v=32 configs are refused (launch_chunked_wy.KNOWN_FAULTS)
        return [{}, {"num_stages": 3}, {"num_stages": 1}, {"num_warps": 8}, {"num_warps": 8, "num_stages": 3}]
    return [{}, {"block_v": 64}, {"block_v": 16}, {"chunk": 32}]


def gdn_gating_proj_candidates(route, t: int, quick: bool) -> list[dict]:
    return [{}, {"BLOCK_K": 4096}, {"BLOCK_K": 1024}, {"num_warps": 4}, {"BLOCK_K": 4096, "num_warps": 4},
            {"BLOCK_T": 2}, {"BLOCK_T": 4}, {"BLOCK_H": 2, "BLOCK_T": 4},
            # one K step for the 27B's K = 5120 (the 2026-12-01 waterfall: 6 µs per launch, 48 programs
            # each walking K in three dependent steps)
            {"BLOCK_K": 8192}, {"BLOCK_K": 8192, "num_warps": 16}, {"BLOCK_K": 8192, "BLOCK_T": 2, "num_warps": 16}]


def build_gated_delta_rule(case, t: int, ctx: int | None, copies: int | None,
                           seed: int = 0):
    import inspect

    import torch

    from ninfer_compile.tune import measure as M
    from . import launch as gdn_launch

    sh = case.shapes
    _, hk, dk = sh["q"]
    _, hv, dv = sh["v"]
    decode = case.match.get("phase") == "decode"
    window = verify_window(case)
    t_asked = t
    if window:  # whole verify rows: t columns round up to C = ceil(t / W) rows of W
        t = -(-t // window) * window
    gen = M.generator(seed)
    n_slots, positions, slots = verify_columns(t, window, 100) if window else M.columns(t, decode, 100, 5)
    q = M.randn((t, hk, dk), gen)
    k = M.randn((t, hk, dk), gen)
    v = M.randn((t, hv, dv), gen)
    g = (-torch.rand(t, hv, device=M.dev(), generator=gen) * 0.5).contiguous()
    beta = torch.rand(t, hv, device=M.dev(), generator=gen).contiguous()
    state0 = 0.1 * torch.randn(n_slots, hv, dk, dv, device=M.dev(), generator=gen)
    per = state0.numel() * 4 * 2  # read + written
    nc = M.n_copies(per // 2) if copies is None else copies
    states = [state0.clone() for _ in range(nc)]
    o = torch.empty(t, hv, dv, dtype=torch.bfloat16, device=M.dev())
    # verify: the per-column states [C, W-1, Hv, Dk, Dv] f32 (written, one buffer: the state is the cold operand)
    cols = torch.empty(t // window, window - 1, hv, dk, dv, device=M.dev()) if window else None
    wss: dict[int, torch.Tensor] = {}

    def workspace(fn):
        # sized like the runtime does: the chunked_workspace_numel of the launcher's own module
        numel = getattr(inspect.getmodule(fn), "chunked_workspace_numel", gdn_launch.chunked_workspace_numel)
        need = max(1, int(numel(t, hv, dk, dv)))
        if need not in wss:
            wss[need] = torch.empty(need, dtype=torch.float32, device=M.dev())
        return wss[need]

    def make(route, params, i):
        fn = route.load_launcher()
        a = dict(q=q, k=k, v=v, g=g, beta=beta, state=states[i], positions=positions, slots=slots, out=o)
        if window:
            a["state_columns"] = cols
        elif "decode" not in route.name:
            a["workspace"] = None if decode else workspace(fn)
        return lambda: M.call_launcher(fn, a, params)

    def check(route, params):
        states[0].copy_(state0)
        make(route, params, 0)()
        M.sync()
        extra = {"window": window} if window else {}
        ref_o = M.ref_call(route, q, k, v, g, beta, state0, positions, slots, **extra)[0]
        states[0].copy_(state0)
        return M.rel_rms(o, ref_o)

    return M.Bench(case, t_asked, ctx, per, nc, make, check, [states])


def verify_window(case) -> int:
    """W of a verify case (tune/measure.py: verify_window)."""
    from ninfer_compile.tune import measure as M

    return M.verify_window(case)


def verify_columns(t: int, window: int, pos0: int):
    """(slots used, positions, slots) of t = C * W verify columns (tune/measure.py: verify_columns)."""
    from ninfer_compile.tune import measure as M

    return M.verify_columns(t, window, pos0)


def _gating_operands(t: int, hv: int, gen: torch.Generator):
    """GDN gating's per-head parameters and outputs: a_log, dt_bias [hv] f32; g, beta [t, hv] f32."""
    import torch

    from ninfer_compile.tune import measure as M

    a_log = torch.rand(hv, device=M.dev(), generator=gen)
    dt_bias = torch.rand(hv, device=M.dev(), generator=gen)
    g = torch.empty(t, hv, dtype=torch.float32, device=M.dev())
    beta = torch.empty(t, hv, dtype=torch.float32, device=M.dev())
    return a_log, dt_bias, g, beta


def build_gdn_gating(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    from ninfer_compile.tune import measure as M

    hv = int(case.match.get("n") or case.shapes["a"][1])
    gen = M.generator(seed)
    a = M.randn((t, hv), gen)
    b = M.randn((t, hv), gen)
    a_log, dt_bias, g, beta = _gating_operands(t, hv, gen)

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(a=a, b=b, a_log=a_log, dt_bias=dt_bias, g=g, beta=beta)
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        M.sync()
        rg, rb = M.ref_call(route, a, b, a_log, dt_bias)
        return max(M.rel_rms(g, rg), M.rel_rms(beta, rb))

    return M.Bench(case, t, ctx, 0, 1, make, check)


def build_gdn_gating_proj(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    """Fused GDN a/b projections + gating: the bf16 [Hv, K] weight pair is the cold operand."""
    from ninfer_compile.tune import measure as M

    hv = int(case.match.get("n") or case.shapes["a_weight"][0])
    k = int(case.match.get("k") or case.shapes["a_weight"][1])
    gen = M.generator(seed)
    x = M.randn((t, k), gen)
    cold = 2 * hv * k * 2
    n = copies or M.n_copies(cold)
    ws = [(M.randn((hv, k), gen, 0.02), M.randn((hv, k), gen, 0.02)) for _ in range(n)]
    a_log, dt_bias, g, beta = _gating_operands(t, hv, gen)

    def make(route, params, i):
        fn = route.load_launcher()
        wa, wb = ws[i % n]
        args = dict(x=x, a_weight=wa, b_weight=wb, a_log=a_log, dt_bias=dt_bias, g=g, beta=beta)
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        M.sync()
        rg, rb = M.ref_call(route, x, ws[0][0], ws[0][1], a_log, dt_bias)
        return max(M.rel_rms(g, rg), M.rel_rms(beta, rb))

    return M.Bench(case, t, ctx, cold, n, make, check)


_M = "ninfer_compile.kernels.gdn.tune"

TUNE = (
    TuneSpec(family="gdn_gating", order=100, group="gdn", builder=f"{_M}:build_gdn_gating"),
    TuneSpec(family="gated_delta_rule", order=110, group="gdn", builder=f"{_M}:build_gated_delta_rule",
             candidates=gated_delta_rule_candidates, tol=4e-2,
             doc="cold operand: the float32 recurrent state (read + written); bf16 q/k/v; verify cases "
                 "(phase verify, attribute window W) measure ceil(T / W) whole rows and also write state_columns"),
    # order 140: after sampling, where the measured tables have it (it joined after the others)
    TuneSpec(family="gdn_gating_proj", order=140, group="gdn", builder=f"{_M}:build_gdn_gating_proj",
             candidates=gdn_gating_proj_candidates,
             doc="cold operand: the bf16 [Hv, K] a/b weight pair"),
)
