"""The attention family's tuner share (`kernels/tuning.py`): the bench builder (a KV cache of the
context depth: `contexts=True`; verify cases: C rows of W columns at the decode depth, the column
layout of docs/SPECULATIVE.md) and the param candidates. No torch / triton at module level (the
builder imports them)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def candidates(route, t: int, quick: bool) -> list[dict]:
    if route.name == "attention_verify_packed":
        return [{}, {"split_tokens": 1024}, {"split_tokens": 256}, {"num_warps": 4}, {"split_tokens": 2048},
                {"block_n": 32}, {"balance": "fixed"}]
    if "decode" in route.name:
        # (--candidates 3 keeps the first three: 2048 won C = 4 at 32K in the 2026-12-02 KV-format bench)
        return [{}, {"split_tokens": 1024}, {"split_tokens": 2048}, {"split_tokens": 256},
                {"block_n": 32}, {"split_tokens": 1024, "num_warps": 8},
                {"balance": "fixed"}, {"balance": "fixed", "split_tokens": 1024}, {"balance": "fixed", "split_tokens": 256}]
    return [{}, {"block_m": 128}, {"block_n": 64}, {"block_m": 128, "block_n": 64},
            {"block_m": 32, "num_warps": 4}]


def build_attention(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    import math

    import torch

    from ninfer_compile.tune import measure as M
    from .launch import decode_workspace_numel

    sh = case.shapes
    _, hq, d = sh["q"]
    hkv = sh["k_cache"][2]
    from ..kv_cache.formats import kv_format
    from ..kv_cache.reference import encode

    fmt = kv_format(case.match.get("kv_dtype") or "bf16")  # any KV format (kv_cache/formats.py)
    quant = fmt.name == "int8"
    decode = case.match.get("phase") == "decode"
    ctx = int(ctx or 4096)
    gen = M.generator(seed)
    window = M.verify_window(case)
    t_asked = t
    if window:
        # verify: C = ceil(t / W) rows of W columns, row r = slot r at positions ctx-W .. ctx-1 (its
        # last column reads ctx cached rows, as a decode column at depth ctx does)
        t = -(-t // window) * window
        slots_n, positions, slots = M.verify_columns(t, window, max(0, ctx - window))
        max_ctx = ctx
    else:
        # prefill: one sequence, a prefix of ctx cached rows, then the chunk's t columns
        slots_n, positions, slots = M.columns(t, decode, ctx - 1, ctx)
        max_ctx = ctx if decode else ctx + t
    shape = (slots_n, max_ctx, hkv, d)

    def cache():
        if fmt.name not in ("bf16", "int8"):  # the format's own codes of Gaussian K / V
            k, v = M.randn(shape, gen), M.randn(shape, gen)
            (kc, ks), (vc, vs) = encode(fmt.k, k), encode(fmt.v, v)
            return kc, vc, ks, vs
        if quant:
            kc = torch.randint(-127, 128, shape, dtype=torch.int8, device=M.dev(), generator=gen)
            vc = torch.randint(-127, 128, shape, dtype=torch.int8, device=M.dev(), generator=gen)
            sshape = (*shape[:3], d // 64)
            ks = (torch.rand(sshape, device=M.dev(), generator=gen) * 0.01 + 0.002).half()
            vs = (torch.rand(sshape, device=M.dev(), generator=gen) * 0.01 + 0.002).half()
            return kc, vc, ks, vs
        return M.randn(shape, gen), M.randn(shape, gen), None, None

    per = (2 * math.prod(shape) * (1 if quant else 2) if fmt.name in ("bf16", "int8")
           else math.prod(shape[:3]) * fmt.row_bytes(d))
    nc = M.n_copies(per) if copies is None else copies
    caches = [cache() for _ in range(nc)]
    q = M.randn((t, hq, d), gen)
    gate = M.randn((t, hq, d), gen)
    out = torch.empty(t, hq * d, dtype=torch.bfloat16, device=M.dev())
    scale = float(case.attrs.get("scale", 1.0 / math.sqrt(d)))
    work = {"ws": torch.empty(1, dtype=torch.float32, device=M.dev())}

    def args_for(route, params, i):
        kc, vc, ks, vs = caches[i]
        a = dict(q=q, gate=gate, k_cache=kc, v_cache=vc, positions=positions, slots=slots, out=out,
                 scale=scale, k_scale=ks, v_scale=vs)
        if route.name == "attention_verify_packed":
            a["window"] = window
        if "decode" in route.name or "verify" in route.name:  # the split-KV routes (decode and verify columns)
            p = route.resolve_params(params)
            need = max(1, decode_workspace_numel(t, hq, d, max_ctx, int(p["split_tokens"])))
            if work["ws"].numel() < need:
                work["ws"] = torch.empty(need, dtype=torch.float32, device=M.dev())
            a["workspace"] = work["ws"]
        return a

    def make(route, params, i):
        fn = route.load_launcher()
        a = args_for(route, params, i)
        return lambda: M.call_launcher(fn, a, params)

    def check(route, params):
        make(route, params, 0)()
        M.sync()
        kc, vc, ks, vs = caches[0]
        ref = M.ref_call(route, q, gate, kc, vc, positions, slots, scale, ks, vs)
        return M.rel_rms(out, ref)

    return M.Bench(case, t_asked, ctx, per, nc, make, check, [caches])


TUNE = (
    TuneSpec(family="attention", order=80, builder="ninfer_compile.kernels.attention.tune:build_attention",
             candidates=candidates, contexts=True,
             doc="cold operand: the KV cache (ctx rows per sequence; prefill: a cached prefix of ctx rows)"),
)
