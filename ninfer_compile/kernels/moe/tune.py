"""The MoE families' tuner share (`kernels/tuning.py`): bench builders of `moe_router` and
`moe_experts`, their param candidates, and the routing draws the builders and bench/bench_moe.py
share. No torch / triton at module level (the builders import them).

Routing in the tuner is UNIFORM: every token picks `top_k` distinct experts uniformly at random
(`routing_draw` without hot experts). A real router is skewed (some experts are hit far more often,
so a step hits fewer distinct experts and its tiles hold more pairs); bench/bench_moe.py times a
skewed distribution beside the uniform one. Uniform routing is the decode worst case for the bytes
read (the most distinct experts per step), so the tuner's rows are picked where the weight stream
costs the most.

Cold operands (`build_moe_experts`): each timed launch reads its own routing draw and its own copy
of the two expert banks (as many copies as fit `MAX_BANK_BYTES`), so an expert a launch hits was
last read at least `copies - 1` launches before, with > 3x L2 of other experts' rows in between
(`measure.n_copies` of the expected bytes a draw hits). The route domains keep the decode route to
T <= 16 (`moe_experts_gemv` max_t): the tuner's plan only times a route whose domain covers T.
"""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec

MAX_BANK_BYTES = 6 << 30  # the expert-bank copies one experts bench may allocate


def expected_hits(t: int, n_experts: int, top_k: int) -> float:
    """Expected distinct experts hit by T tokens under uniform routing (top_k distinct per token)."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** t)


def routing_draw(t: int, n_experts: int, top_k: int, gen, device, hot=None, hot_slots: int = 0):
    """(expert_ids int32 [T, k], expert_weights f32 [T, k] summing to 1 per row, shared_gate f32 [T]).
    Uniform: top_k distinct experts per token. With `hot` (a tensor of expert ids) and `hot_slots`:
    each token takes `hot_slots` distinct experts of `hot` and top_k - hot_slots distinct others,
    in random slot order (`hot_slots / top_k` of the selections land on the hot experts)."""
    import torch

    def pick(pool, count):
        scores = torch.rand(t, pool.numel(), generator=gen, device=device)
        return pool[scores.topk(count, dim=1).indices]

    every = torch.arange(n_experts, device=device)
    if hot is None or hot_slots == 0:
        ids = pick(every, top_k)
    else:
        is_hot = torch.zeros(n_experts, dtype=torch.bool, device=device)
        is_hot[hot] = True
        ids = torch.cat([pick(every[is_hot], hot_slots), pick(every[~is_hot], top_k - hot_slots)], dim=1)
        order = torch.rand(t, top_k, generator=gen, device=device).argsort(dim=1)
        ids = ids.gather(1, order)
    w = torch.rand(t, top_k, generator=gen, device=device) + 0.1
    gate = torch.rand(t, generator=gen, device=device)
    return ids.to(torch.int32).contiguous(), (w / w.sum(-1, keepdim=True)).contiguous(), gate


def routing_error(got, want, n_experts: int) -> float:
    """Relative RMS error of a router's (ids, weights, shared gate) against the reference's, the
    routing compared as dense [T, E] weights: a near-tie chosen the other way costs the two nearly
    equal weights, a wrong expert its whole weight; inf for an id outside 0..E-1."""
    import torch

    def dense(ids, w, gate):
        ids, w = ids.long().cpu(), w.float().cpu()
        d = torch.zeros(ids.shape[0], n_experts).scatter_add_(1, ids.clamp(0, n_experts - 1), w)
        return torch.cat([d.reshape(-1), gate.float().cpu()]).double(), bool(((ids < 0) | (ids >= n_experts)).any())

    (g, bad), (r, _) = dense(*got), dense(*want)
    if bad or not torch.isfinite(g).all():
        return float("inf")
    return float((g - r).pow(2).mean().sqrt() / r.pow(2).mean().sqrt().clamp_min(1e-30))


def moe_candidates(route, t: int, quick: bool) -> list[dict]:
    """A curated set per route (defaults first). The decode route's broadcast product holds
    BLOCK_T x BLOCK_N x BLOCK_K fp32 values (BLOCK_T = next_pow2(T)): its larger-T sets shrink the tile."""
    name = route.name
    if name == "moe_router_split":  # T > 1 multiplies with tl.dot: BLOCK_R >= 16
        cands = [{}, {"BLOCK_R": 8}, {"BLOCK_R": 32}, {"BLOCK_K": 256}, {"BLOCK_R": 8, "BLOCK_K": 256},
                 {"num_warps": 8}, {"BLOCK_K": 64}, {"BLOCK_R": 32, "BLOCK_K": 256}]
        return [c for c in cands if t == 1 or c.get("BLOCK_R", 16) >= 16]
    if name == "moe_experts_gemv":
        # ungrouped (a GEMV per (token, slot) pair, no grouping launch; an expert two tokens chose is
        # read twice) with the combine in the down launch, over GEMV tiles; then the grouped tiling
        # (one tile per hit expert, broadcast-FMA products) with small tiles, and the defaults
        gemv = [{"BLOCK_N": 16, "BLOCK_K": 256}, {"BLOCK_N": 8, "BLOCK_K": 256}, {"BLOCK_N": 16, "BLOCK_K": 512},
                {"BLOCK_N": 32, "BLOCK_K": 128}, {"BLOCK_N": 8, "BLOCK_K": 512}, {"BLOCK_N": 16, "BLOCK_K": 256,
                                                                                   "num_warps": 8}]
        grouped = [{"BLOCK_N": 16, "BLOCK_K": 32}, {"BLOCK_N": 16, "BLOCK_K": 64}]
        return ([{**c, "GROUP": False, "COMBINE": "fused"} for c in gemv]
                + [{**c, "GROUP": True, "COMBINE": "fused"} for c in grouped] + [{}])
    if name == "moe_experts_grouped_gemm":
        return [{}, {"BLOCK_N": 32}, {"BLOCK_N": 128, "num_warps": 8}, {"BLOCK_K": 128}, {"num_warps": 8},
                {"BLOCK_N": 32, "BLOCK_K": 128}, {"BLOCK_T": 32}, {"BLOCK_N": 32, "num_warps": 2}]
    return []


def experts_variant(shapes, dtypes, attrs) -> str:
    """`down Q6G64_F16S`: the down bank's format (the match names only gate_up's; the 35B keeps Q6
    down banks on three layers): each down format is a case of its own."""
    fmt = (dtypes or {}).get("down")
    return f"down {fmt}" if fmt else ""


def build_moe_router(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    """Router weight [E+1, H] (cold, rotated over copies), x [T, H] random. The check compares the
    routing as dense [T, E] weights (an expert missed costs its weight) plus the shared gate."""
    import torch

    from ninfer_compile.tune import measure as M

    fmt, n, h = case.match["format"], int(case.match["n"]), int(case.match["k"])
    top_k = int(case.attrs.get("top_k") or case.shapes["out:expert_ids"][1])
    gen = M.generator(seed)
    w0 = M.random_linear_weight(fmt, n, h, gen)
    cold = M.weight_bytes(w0)
    nc = M.n_copies(cold) if copies is None else copies
    weights = [w0] + [M.random_linear_weight(fmt, n, h, gen) for _ in range(nc - 1)]
    x = M.randn((t, h), gen)
    ids = torch.zeros(t, top_k, dtype=torch.int32, device=M.dev())
    wts = torch.zeros(t, top_k, dtype=torch.float32, device=M.dev())
    gate = torch.zeros(t, dtype=torch.float32, device=M.dev())
    logits = torch.empty(t * n, dtype=torch.float32, device=M.dev())  # the split route's workspace

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(x=x, weight=weights[i], expert_ids=ids, expert_weights=wts, shared_gate=gate, top_k=top_k)
        if route.workspace is not None:
            args["workspace"] = logits
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        ids.fill_(-1)
        make(route, params, 0)()
        M.sync()
        return routing_error((ids, wts, gate), M.ref_call(route, x, w0, top_k), n - 1)

    return M.Bench(case, t, ctx, cold, nc, make, check, [weights])


def build_moe_experts(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    """Expert banks at their stored formats (gate_up: the match's format; down: the op's, the case's
    variant), uniform routing (module docstring), one draw and one bank copy per launch; x, shared,
    residual random bf16. The reference (the same for every route) is computed once per bench."""
    import torch

    from ninfer_compile.tune import measure as M
    from .reference import bank_dims
    from .routes import workspace_layout

    gu_fmt = case.match["format"]
    dn_fmt = (case.dtypes or {}).get("down") or gu_fmt
    n_gu, h = (int(v) for v in case.shapes["gate_up"])
    n_d, i_w = (int(v) for v in case.shapes["down"])
    n_e, i_w, h = bank_dims((n_gu, h), (n_d, i_w))
    top_k = int(case.shapes["expert_ids"][1])
    gen = M.generator(seed)
    bank0 = (M.random_linear_weight(gu_fmt, n_gu, h, gen), M.random_linear_weight(dn_fmt, n_d, i_w, gen))
    bank_bytes = M.weight_bytes(bank0[0]) + M.weight_bytes(bank0[1])
    cold = int(expected_hits(t, n_e, top_k) * bank_bytes / n_e)
    nc = M.n_copies(cold) if copies is None else copies
    n_banks = max(1, min(nc, MAX_BANK_BYTES // bank_bytes))
    banks = [bank0] + [(M.random_linear_weight(gu_fmt, n_gu, h, gen), M.random_linear_weight(dn_fmt, n_d, i_w, gen))
                       for _ in range(n_banks - 1)]
    draws = [routing_draw(t, n_e, top_k, gen, M.dev()) for _ in range(nc)]
    x, shared, residual = M.randn((t, h), gen), M.randn((t, h), gen, 0.1), M.randn((t, h), gen, 0.1)
    out = torch.empty(t, h, dtype=torch.bfloat16, device=M.dev())
    ws = torch.empty(workspace_layout(n_e, i_w, h, t * top_k)["total"], dtype=torch.float32, device=M.dev())
    refs: dict[str, torch.Tensor] = {}

    def make(route, params, i):
        fn = route.load_launcher()
        ids, wts, gate = draws[i]
        gu, dn = banks[i % n_banks]
        args = dict(x=x, expert_ids=ids, expert_weights=wts, gate_up=gu, down=dn, shared=shared, shared_gate=gate,
                    residual=residual, out=out, workspace=ws)
        return lambda: M.call_launcher(fn, args, params)

    def check(route, params):
        out.fill_(float("nan"))
        make(route, params, 0)()
        M.sync()
        if route.reference not in refs:
            ids, wts, gate = draws[0]
            refs[route.reference] = M.ref_call(route, x, ids, wts, *bank0, shared, gate, residual)
        return M.rel_rms(out, refs[route.reference])

    return M.Bench(case, t, ctx, cold, nc, make, check, [banks, draws])


_M = "ninfer_compile.kernels.moe.tune"

TUNE = (
    TuneSpec(family="moe_router", order=190, group="moe", builder=f"{_M}:build_moe_router", candidates=moe_candidates,
             doc="cold operand: the router weight [E+1, H], rotated over copies; x random"),
    TuneSpec(family="moe_experts", order=191, group="moe", builder=f"{_M}:build_moe_experts", candidates=moe_candidates,
             variant=experts_variant,
             doc="UNIFORM random routing (top_k distinct experts per token; real routers are skewed: "
                 "bench/bench_moe.py times both); cold operands: one routing draw and one expert-bank copy "
                 "per launch; one case per down-bank format"),
)
