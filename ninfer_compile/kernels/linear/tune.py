"""The linear family's tuner share (`kernels/tuning.py`): the bench builder and the param
candidates per schedule. No torch / triton at module level (the builder imports them)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def _pow2(t: int) -> int:
    return 1 << max(0, (int(t) - 1).bit_length())


def _clamp(v, lo, hi):
    return max(lo, min(hi, v))


def candidates(route, t: int, quick: bool) -> list[dict]:
    """A curated param set per schedule kind (the route's defaults first)."""
    name = route.name
    cands: list[dict] = []
    if name.endswith("_gemv"):
        cands = [{}, {"BLOCK_N": 16}, {"BLOCK_N": 4, "BLOCK_K": 512}, {"BLOCK_N": 32, "BLOCK_K": 128},
                 {"SPLIT_K": 2}, {"BLOCK_N": 16, "SPLIT_K": 4}, {"BLOCK_N": 8, "BLOCK_K": 512},
                 {"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 8}]
    elif name.endswith("_small_t_mma") or name == "bf16_tiled":
        hi = 64 if name.endswith("_small_t_mma") else 256
        bt = _clamp(_pow2(t), 16, hi)
        cands = [{"BLOCK_T": bt}, {"BLOCK_T": bt, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8},
                 {"BLOCK_T": bt, "BLOCK_N": 32, "BLOCK_K": 256},
                 {"BLOCK_T": bt, "SPLIT_K": 2}, {"BLOCK_T": bt, "num_stages": 3},
                 {"BLOCK_T": bt, "BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 4}]
        if name.startswith("q4_"):
            cands.append({"BLOCK_T": bt, "USE_ASM": False})
    elif name.endswith("_gemv_lowreg"):
        # (the 2026-11-29 H200 run: BLOCK_N 16 / 32 with CHAIN, and BLOCK_N 4 at BLOCK_K 512, were
        # never within 20% of the best; PREFETCH needs a register cap to stay ahead of the math)
        pf = {"PREFETCH": True, "MAXNREG": 128}
        cands = [{}, {"CHAIN": 2}, {"CHAIN": 4}, {"SPLIT_K": 2}, {"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 8},
                 {"MAXNREG": 128}, {"MAXNREG": 96}, pf, {"PREFETCH": True, "MAXNREG": 96},
                 {**pf, "CHAIN": 2}, {**pf, "SPLIT_K": 2}, {**pf, "BLOCK_N": 4}, {**pf, "BLOCK_K": 2048},
                 {**pf, "BLOCK_N": 4, "num_warps": 2},
                 # second H200 run: BLOCK_N 4 / 2 warps with the prefetch won most T <= 2 cells
                 {**pf, "BLOCK_N": 2, "num_warps": 1}, {**pf, "BLOCK_N": 2, "num_warps": 2},
                 {**pf, "BLOCK_N": 4, "num_warps": 1}, {**pf, "BLOCK_N": 4, "num_warps": 2, "CHAIN": 2},
                 {**pf, "BLOCK_N": 4, "num_warps": 2, "BLOCK_K": 2048}, {**pf, "BLOCK_N": 4, "num_warps": 2, "SPLIT_K": 2},
                 {"PREFETCH": True, "MAXNREG": 168, "BLOCK_N": 4, "num_warps": 2},
                 {**pf, "BLOCK_N": 4, "num_warps": 2, "L2_HINT": True}, {**pf, "BLOCK_N": 4, "L2_HINT": True},
                 # more rows per thread share each 64-byte activation load (L1 traffic / weight byte)
                 {**pf, "BLOCK_N": 8, "num_warps": 2}, {**pf, "BLOCK_N": 8, "num_warps": 1},
                 {**pf, "BLOCK_N": 16, "num_warps": 4},
                 # more programs for the small projections, with the split-K sum inside the launch
                 # (REDUCE=fused; the 2026-12-01 H200 run: never the best at T <= 4)
                 {**pf, "BLOCK_N": 4, "num_warps": 2, "SPLIT_K": 4, "REDUCE": "fused"},
                 {**pf, "BLOCK_N": 8, "num_warps": 2, "SPLIT_K": 4, "REDUCE": "fused"},
                 {**pf, "BLOCK_N": 4, "num_warps": 2, "SPLIT_K": 2, "REDUCE": "fused"}]
        # the weight chunks through a cp.async ring in shared memory instead of the asm loads + register
        # prefetch (Nsight, 2026-12-03: every asm-load route waits on its loads at 25-31% occupancy)
        for stages in (3, 4, 6):
            cands += [{"ASYNC": stages, **c} for c in (
                {"BLOCK_N": 2, "num_warps": 1, "MAXNREG": 128}, {"BLOCK_N": 2, "num_warps": 2},
                {"BLOCK_N": 4, "num_warps": 2}, {"BLOCK_N": 4, "num_warps": 1, "MAXNREG": 96},
                {"BLOCK_N": 8, "num_warps": 4}, {"BLOCK_N": 4, "num_warps": 2, "BLOCK_K": 2048},
                {"BLOCK_N": 2, "num_warps": 1, "BLOCK_K": 512})]
    elif name.endswith("_gemv_tc"):
        # a warp owns 16 rows for the whole K range: without split-K a 27B projection has only
        # ~8 warps per SM, so parallelism comes from SPLIT_K and the prefetch
        pf = {"PREFETCH": True, "MAXNREG": 128}
        cands = [{}, {"SPLIT_K": 4}, {"SPLIT_K": 8}, {"SPLIT_K": 16}, {**pf, "SPLIT_K": 4}, {**pf, "SPLIT_K": 8},
                 {**pf}, {"num_warps": 2, "SPLIT_K": 8}, {**pf, "num_warps": 2, "SPLIT_K": 4},
                 {**pf, "num_warps": 8, "SPLIT_K": 4}, {"num_warps": 1, "SPLIT_K": 8}, {"MAXNREG": 128, "SPLIT_K": 8},
                 {**pf, "SPLIT_K": 16}, {**pf, "num_warps": 2, "SPLIT_K": 8}]
        # the split-K sum inside the launch: the twin of each kernel-reduce set the table selects
        # (H200: 20-50% slower than the reduce launch with a fence per element, 2026-12-01; with one
        # fence per thread a median 3% slower, best in 11 of 84 cells, 2026-12-02)
        cands += [{**c, "REDUCE": "fused"} for c in (
            {"MAXNREG": 128, "SPLIT_K": 8}, {**pf, "SPLIT_K": 8}, {"SPLIT_K": 8}, {"num_warps": 2, "SPLIT_K": 8},
            {"SPLIT_K": 4}, {**pf, "SPLIT_K": 4}, {**pf, "num_warps": 2, "SPLIT_K": 8}, {"SPLIT_K": 16})]
        if not name.startswith("w8_"):
            # the scales by 4 K steps (one coalesced word, then a shuffle per step): the gemv probe
            # (2026-12-03) timed the tc access pattern 22% faster without its per-step scale loads
            cands += [{**c, "SCALES": "shfl"} for c in (
                {}, {"SPLIT_K": 8}, {"SPLIT_K": 4}, {"num_warps": 2, "SPLIT_K": 8}, {"num_warps": 1, "SPLIT_K": 8},
                {"MAXNREG": 128, "SPLIT_K": 8}, {**pf, "SPLIT_K": 8}, {**pf, "SPLIT_K": 4}, {**pf},
                {**pf, "num_warps": 2, "SPLIT_K": 8}, {**pf, "num_warps": 2, "SPLIT_K": 4})]
            # the weight chunks through a cp.async ring in shared memory (Nsight, 2026-12-03: the tc routes
            # wait 4.7-11 cycles per instruction on their loads)
            for stages in (3, 4, 6):
                cands += [{"ASYNC": stages, **c} for c in (
                    {"SPLIT_K": 8}, {"SPLIT_K": 4}, {"num_warps": 2, "SPLIT_K": 8}, {"MAXNREG": 128, "SPLIT_K": 8},
                    {"num_warps": 8, "SPLIT_K": 4}, {})]
        if name.startswith("w8_"):
            # W8 holds 8 words + 2 scales per row and step: the swiglu prefetch spills at 128
            # registers (ptxas, sm_90), not at 168
            pf8 = {"PREFETCH": True, "MAXNREG": 168}
            cands += [{**pf8, "SPLIT_K": 4}, {**pf8, "SPLIT_K": 8}, {**pf8, "num_warps": 2, "SPLIT_K": 8}]
    elif name.endswith("_gemm_tc"):
        cands = gemm_tc_candidates(t)
    elif name.endswith("_dequant_gemm"):
        cands = [{}, {"BLOCK_N": 32, "BLOCK_K": 512}, {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8},
                 {"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 2}]
    elif name.endswith("_wide_mma"):
        bt = _clamp(_pow2(t), 32, 128)
        cands = [{"BLOCK_T": bt}, {"BLOCK_T": bt, "BLOCK_N": 64},
                 {"BLOCK_T": 256 if t > 128 else bt, "BLOCK_N": 128, "num_stages": 2},
                 {"BLOCK_T": bt, "BLOCK_N": 256}, {"BLOCK_T": bt, "num_stages": 4}]
    return cands


def gemm_tc_candidates(t: int) -> list[dict]:
    """The `<f>_gemm_tc` sweep at T: split-K buys bytes in flight at small T and costs
    SPLIT_K x T x N x 8 bytes of partials, so it shrinks as T grows; narrower column blocks and more
    warps trade L1 x traffic and registers against weight re-reads (gemm_tc.py's arithmetic)."""
    pf = {"PREFETCH": True}
    if t <= 8:
        return [{}, {"SPLIT_K": 4}, {"SPLIT_K": 8}, {**pf, "SPLIT_K": 4}, {**pf, "SPLIT_K": 8},
                {"num_warps": 2, "SPLIT_K": 8}, {"MAXNREG": 128, "SPLIT_K": 8}, {**pf, "num_warps": 2, "SPLIT_K": 4},
                {"SPLIT_K": 8, "REDUCE": "fused"}]
    if t <= 32:
        return [{}, {"SPLIT_K": 2}, {"SPLIT_K": 4}, {**pf}, {**pf, "SPLIT_K": 2}, {**pf, "SPLIT_K": 4},
                {"num_warps": 8}, {"num_warps": 8, "SPLIT_K": 2}, {"BLOCK_T": 16, "SPLIT_K": 2},
                {"MAXNREG": 168, "SPLIT_K": 4}, {"SPLIT_K": 4, "REDUCE": "fused"}]
    return [{}, {"SPLIT_K": 2}, {**pf}, {**pf, "SPLIT_K": 2}, {"BLOCK_T": 32}, {"BLOCK_T": 32, "SPLIT_K": 2},
            {"num_warps": 8}, {"num_warps": 2}, {"MAXNREG": 255}, {"BLOCK_T": 32, **pf}, {"BLOCK_T": 16}]


def prune(route, t: int, quick: bool) -> bool:
    """--quick: the wide schedule pads T to its tile, so it is not measured below T 16."""
    return quick and route.name.endswith("_wide_mma") and t < 16


def build_linear(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    import torch

    from ninfer_compile.tune import measure as M
    from .launch import linear_workspace_numel

    m = case.match
    fmt, n, k, epi = m["format"], int(m["n"]), int(m["k"]), m.get("epilogue", "none")
    gen = M.generator(seed)
    n_out = n // 2 if epi == "swiglu" else n
    w0 = M.random_linear_weight(fmt, n, k, gen)
    cold = M.weight_bytes(w0)
    nc = M.n_copies(cold) if copies is None else copies
    ws_ = [w0] + [M.random_linear_weight(fmt, n, k, gen) for _ in range(nc - 1)]
    x = M.randn((t, k), gen)
    res = M.randn((t, n_out), gen) if epi == "residual" else None
    out = torch.empty(t, n_out, dtype=torch.bfloat16, device=M.dev())
    work = {"ws": torch.empty(1, dtype=torch.float32, device=M.dev())}

    def workspace(route, params):
        need = max(1, linear_workspace_numel(route.name, t, n, k, epi, route.resolve_params(params)))
        if work["ws"].numel() < need:
            work["ws"] = torch.empty(need, dtype=torch.float32, device=M.dev())
        return work["ws"]

    def make(route, params, i):
        fn = route.load_launcher()
        ws = workspace(route, params)
        args = dict(x=x, weight=ws_[i], out=out, epilogue=epi, residual=res, workspace=ws)
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        out.zero_()
        make(route, params, 0)()
        M.sync()
        ref = M.ref_call(route, x, w0, epi, res)
        return M.rel_rms(out, ref)

    return M.Bench(case, t, ctx, cold, nc, make, check, [ws_])


TUNE = (
    TuneSpec(family="linear", order=10, builder="ninfer_compile.kernels.linear.tune:build_linear",
             candidates=candidates, prune=prune,
             doc="cold operand: the weight (random row-split planes / bf16), rotated over copies"),
)
