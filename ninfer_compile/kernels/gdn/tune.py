"""The Gated DeltaNet families' tuner share (`kernels/tuning.py`): bench builders of
gated_delta_rule, gdn_gating, gdn_gating_proj and gdn_decode_fused, and their param candidates. (conv1d, in the same
`--families gdn` group, lives in kernels/conv1d/tune.py.) No torch / triton at module level (the
builders import them)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def gated_delta_rule_candidates(route, t: int, quick: bool) -> list[dict]:
    if "decode" in route.name or "verify" in route.name:
        return [{}, {"block_v": 64}, {"block_v": 16}, {"block_v": 64, "num_warps": 8}, {"num_warps": 2}]
    if route.name.endswith("_fast"):  # block_v 64 only: the block_v=32 configs are refused (launch_fast.KNOWN_FAULTS)
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
    # an op carrying the folded RMSNorm (match prologue: rmsnorm) is measured with it
    norm = {"norm_weight": M.randn((k,), gen, 0.3), "norm_eps": 1e-6} if case.match.get("prologue") == "rmsnorm" else {}

    def make(route, params, i):
        fn = route.load_launcher()
        wa, wb = ws[i % n]
        args = dict(x=x, a_weight=wa, b_weight=wb, a_log=a_log, dt_bias=dt_bias, g=g, beta=beta, **norm)
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        M.sync()
        rg, rb = M.ref_call(route, x, ws[0][0], ws[0][1], a_log, dt_bias, **norm)
        return max(M.rel_rms(g, rg), M.rel_rms(beta, rb))

    return M.Bench(case, t, ctx, cold, n, make, check)


def gdn_decode_fused_candidates(route, t: int, quick: bool) -> list[dict]:
    # ptxas (sm_90a) at Dk = Dv = 128: 16 warps 128 regs + 392 B (560 B with PREFETCH) spills per thread,
    # 8 warps 255 regs + 988 B (4.3 KB with PREFETCH)
    return [{}, {"PREFETCH": False}, {"num_warps": 8, "PREFETCH": False}, {"num_warps": 8},
            {"num_warps": 4, "PREFETCH": False}]


def build_gdn_decode_fused(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    """One GDN decode step after the projections (conv + delta rule + gated norm): the cold operands
    are the f32 recurrent state and the bf16 conv state (both read + written) and the conv weight;
    q / k / v arrive as column views of the two projection outputs, z as a view of value_z (as in a plan)."""
    import torch

    from ninfer_compile.tune import measure as M

    sh, at = case.shapes, case.attrs
    _, hv, dk, dv = sh["state"]
    kk, c = sh["conv_weight"]
    hk = int(at.get("key_heads") or (c - hv * dv) // (2 * dk))
    gen = M.generator(seed)
    n_slots, positions, slots = M.columns(t, True, 100, 5)
    qk = M.randn((t, 2 * hk * dk), gen)  # [T, 2*Hk*Dk] the query_key projection's output
    vz = M.randn((t, 2 * hv * dv), gen)  # [T, 2*Hv*Dv] value_z's
    parts = dict(x0=qk[:, : hk * dk], x1=qk[:, hk * dk:], x2=vz[:, : hv * dv])
    z = vz[:, hv * dv:].reshape(t, hv, dv)  # [T, Hv, Dv] strided view
    x = torch.cat([qk, vz[:, : hv * dv]], 1)  # [T, C] for the reference only
    conv_w = M.randn((kk, c), gen, 0.5)
    norm_w = M.randn((dv,), gen, 0.2) + 1
    g = (-torch.rand(t, hv, device=M.dev(), generator=gen) * 0.5).contiguous()
    beta = torch.rand(t, hv, device=M.dev(), generator=gen).contiguous()
    cs0 = M.randn((n_slots, kk - 1, c), gen)
    st0 = 0.1 * torch.randn(n_slots, hv, dk, dv, device=M.dev(), generator=gen)
    per = st0.numel() * 4 * 2 + cs0.numel() * 2 * 2 + conv_w.numel() * 2
    nc = M.n_copies(per // 2) if copies is None else copies
    states = [(st0.clone(), cs0.clone()) for _ in range(nc)]
    out = torch.empty(t, hv * dv, dtype=torch.bfloat16, device=M.dev())
    scal = dict(key_heads=hk, scale=float(at.get("scale") or dk ** -0.5), l2_eps=float(at.get("l2_eps", 1e-6)),
                eps=float(at.get("eps", 1e-6)), activation=str(at.get("activation", "silu")))

    def make(route, params, i):
        fn = route.load_launcher()
        st, cs = states[i]
        a = dict(**parts, conv_weight=conv_w, conv_state=cs, g=g, beta=beta, state=st, positions=positions,
                 slots=slots, z=z, norm_weight=norm_w, out=out, **scal)
        return lambda: M.call_launcher(fn, a, params)

    def check(route, params):
        states[0][0].copy_(st0)
        states[0][1].copy_(cs0)
        make(route, params, 0)()
        M.sync()
        ref_out = M.ref_call(route, x, conv_w, cs0, g, beta, st0, positions, slots, z, norm_w, **scal)[0]
        states[0][0].copy_(st0)
        states[0][1].copy_(cs0)
        return M.rel_rms(out, ref_out)

    return M.Bench(case, t, ctx, per, nc, make, check, [[s for s, _ in states], [c_ for _, c_ in states]])


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
    TuneSpec(family="gdn_decode_fused", order=150, group="gdn", builder=f"{_M}:build_gdn_decode_fused",
             candidates=gdn_decode_fused_candidates, tol=4e-2,
             doc="cold operands: the f32 recurrent state and the bf16 conv state (read + written) and the conv "
                 "weight; decode only (every column its own slot)"),
)
