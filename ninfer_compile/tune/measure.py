"""GPU measurement of route candidates (imported only on the GPU path: it needs torch + CUDA).

For one `MatchCase` at one T (and context, for attention) a builder allocates the operands on the
GPU — random but valid: row-split planes of the right sizes with small positive fp16 scales,
bf16 activations, float32 state — in `copies` copies of the *cold* operands (weights, KV cache,
recurrent / conv state), enough that the copies together exceed the L2 three times over. A
measurement captures one launch per copy into a CUDA graph (falls back to eager launches between
CUDA events when capture fails), replays it `warmup` times, then `reps` times between CUDA events,
and reports the median µs per launch: every timed launch streams its cold operands from HBM as in
production, where a layer's weights were evicted by the 60-odd layers before it. Activations are
shared (in production the previous op has just written them).

Each candidate's output is checked once against its route's reference (relative RMS error;
`Bench.check`); a candidate that fails or cannot launch is dropped with a warning by the caller.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from ..errors import RouteError
from ..kernels.registry import Route
from .shapes import MatchCase

L2_BYTES = 50 * 2**20  # H200; the rotation target is a multiple of it
COLD_FACTOR = 3
MAX_COPIES = 256
MIN_LAUNCHES = 4

# relative RMS tolerance of the reference check, per family (default DEFAULT_TOL)
DEFAULT_TOL = 2e-2
FAMILY_TOL = {"gated_delta_rule": 4e-2}


def set_l2_bytes(nbytes: int) -> None:
    global L2_BYTES
    if nbytes and nbytes > 0:
        L2_BYTES = int(nbytes)


def n_copies(cold_bytes: int) -> int:
    if cold_bytes <= 0:
        return 1
    return int(min(MAX_COPIES, max(1, math.ceil(COLD_FACTOR * L2_BYTES / cold_bytes))))


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    o = out.detach().float().reshape(-1).cpu()
    r = ref.detach().float().reshape(-1).cpu()
    if o.numel() != r.numel():
        return float("inf")
    if not torch.isfinite(o).all():
        return float("inf")
    num = torch.sqrt(torch.mean((o - r) ** 2)).item()
    den = torch.sqrt(torch.mean(r ** 2)).item()
    return num / max(den, 1e-30)


# --------------------------------------------------------------------------- parameter grids
def _pow2(t: int) -> int:
    return 1 << max(0, (int(t) - 1).bit_length())


def _clamp(v, lo, hi):
    return max(lo, min(hi, v))


def param_candidates(route: Route, t: int, quick: bool) -> list[dict]:
    """The params tried for `route` at T (legal values only; the route's defaults always first).
    A curated set per schedule kind (the full cartesian product of every ParamSpec is thousands
    of compiles); `quick` keeps the first two."""
    name = route.name
    fam = route.family
    cands: list[dict] = []
    if fam == "linear":
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
        elif name.endswith(("_gemv_lowreg", "_gemv_packed")):
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
        elif name.endswith("_gemv_tc"):
            # a warp owns 16 rows for the whole K range: without split-K a 27B projection has only
            # ~8 warps per SM, so parallelism comes from SPLIT_K and the prefetch
            pf = {"PREFETCH": True, "MAXNREG": 128}
            cands = [{}, {"SPLIT_K": 4}, {"SPLIT_K": 8}, {"SPLIT_K": 16}, {**pf, "SPLIT_K": 4}, {**pf, "SPLIT_K": 8},
                     {**pf}, {"num_warps": 2, "SPLIT_K": 8}, {**pf, "num_warps": 2, "SPLIT_K": 4},
                     {**pf, "num_warps": 8, "SPLIT_K": 4}, {"num_warps": 1, "SPLIT_K": 8}, {"MAXNREG": 128, "SPLIT_K": 8},
                     {**pf, "SPLIT_K": 16}, {**pf, "num_warps": 2, "SPLIT_K": 8},
                     # the split-K sum inside the launch (2026-12-01 H200: 20-50% slower than the
                     # reduce launch with the prefetch; won a few T >= 16 cells without it)
                     {**pf, "SPLIT_K": 8, "REDUCE": "fused"}, {"SPLIT_K": 8, "REDUCE": "fused"}]
        elif name.endswith("_dequant_gemm"):
            cands = [{}, {"BLOCK_N": 32, "BLOCK_K": 512}, {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8},
                     {"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 2}]
        elif name.endswith("_wide_mma"):
            bt = _clamp(_pow2(t), 32, 128)
            cands = [{"BLOCK_T": bt}, {"BLOCK_T": bt, "BLOCK_N": 64},
                     {"BLOCK_T": 256 if t > 128 else bt, "BLOCK_N": 128, "num_stages": 2},
                     {"BLOCK_T": bt, "BLOCK_N": 256}, {"BLOCK_T": bt, "num_stages": 4}]
    elif fam == "rmsnorm":
        cands = [{}, {"num_warps": 4}, {"num_warps": 16}, {"num_warps": 2}]
    elif fam == "gdn_gating_proj":
        cands = [{}, {"BLOCK_K": 4096}, {"BLOCK_K": 1024}, {"num_warps": 4}, {"BLOCK_K": 4096, "num_warps": 4},
                 {"BLOCK_T": 2}, {"BLOCK_T": 4}, {"BLOCK_H": 2, "BLOCK_T": 4},
                 # one K step for the 27B's K = 5120 (the 2026-12-01 waterfall: 6 µs per launch, 48 programs
                 # each walking K in three dependent steps)
                 {"BLOCK_K": 8192}, {"BLOCK_K": 8192, "num_warps": 16}, {"BLOCK_K": 8192, "BLOCK_T": 2, "num_warps": 16}]
    elif fam == "attention":
        if "decode" in name:
            cands = [{}, {"split_tokens": 1024}, {"split_tokens": 256}, {"split_tokens": 2048},
                     {"block_n": 32}, {"split_tokens": 1024, "num_warps": 8},
                     {"balance": "fixed"}, {"balance": "fixed", "split_tokens": 1024}, {"balance": "fixed", "split_tokens": 256}]
        else:
            cands = [{}, {"block_m": 128}, {"block_n": 64}, {"block_m": 128, "block_n": 64},
                     {"block_m": 32, "num_warps": 4}]
    elif fam == "gated_delta_rule":
        if "decode" in name:
            cands = [{}, {"block_v": 64}, {"block_v": 16}, {"block_v": 64, "num_warps": 8},
                     {"num_warps": 2}]
        else:
            cands = [{}, {"block_v": 64}, {"block_v": 16}, {"chunk": 32}]
    out: list[dict] = []
    seen = set()
    for c in cands or [{}]:
        c = {k: v for k, v in c.items() if k in route.params}
        if route.check_params(c) is not None:
            continue
        # drop values equal to the default: one spelling per configuration
        c = {k: v for k, v in c.items() if route.params[k].default != v or type(route.params[k].default) is not type(v)}
        key = tuple(sorted(c.items(), key=lambda kv: kv[0]))
        if key in seen:
            continue
        seen.add(key)
        out.append(c)
    return out[:2] if quick else out


# --------------------------------------------------------------------------- launcher calls
_SIG: dict[Callable, set] = {}


def call_launcher(fn: Callable, args: Mapping[str, Any], params: Mapping[str, Any]) -> None:
    names = _SIG.get(fn)
    if names is None:
        names = _SIG[fn] = set(inspect.signature(fn).parameters)
    if "params" in names:
        fn(**args, params=dict(params))
    else:
        fn(**args, **params)


# --------------------------------------------------------------------------- timing
def time_launches(fns: list[Callable[[], None]], reps: int, warmup: int = 1,
                  use_graph: bool = True) -> tuple[float, str]:
    """Median µs per launch of the list `fns` (each one launch). Returns (µs, "graph"|"eager")."""
    seq = list(fns)
    while len(seq) < MIN_LAUNCHES:
        seq += fns
    for f in fns:  # compile / first-launch work outside the timed region
        f()
    torch.cuda.synchronize()
    mode = "eager"
    replay: Callable[[], None]
    graph = None
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for f in seq:
                    f()
            replay = graph.replay
            mode = "graph"
        except Exception:  # noqa: BLE001 - fall back to eager launches between events
            graph = None
            torch.cuda.synchronize()

    if graph is None:
        def replay() -> None:
            for f in seq:
                f()
    for _ in range(max(0, warmup)):
        replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(max(1, reps)):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1000.0 / len(seq))
    del graph
    times.sort()
    return times[len(times) // 2], mode


# --------------------------------------------------------------------------- builders
@dataclass
class Bench:
    """Operands of one (case, T, context) on the GPU. `launches(route, params)` -> one zero-arg
    launch per copy; `check(route, params)` -> relative RMS error of copy 0 from fresh operands
    against the route's reference."""

    case: MatchCase
    t: int
    ctx: int | None
    cold_bytes: int
    copies: int
    _make: Callable[[Route, dict, int], Callable[[], None]]
    _check: Callable[[Route, dict], float]
    keep: list = field(default_factory=list)

    def launches(self, route: Route, params: dict) -> list[Callable[[], None]]:
        return [self._make(route, params, i) for i in range(self.copies)]

    def check(self, route: Route, params: dict) -> float:
        return self._check(route, params)


DEVICE: str | None = None  # None: the current CUDA device (tests set "cpu" under the Triton interpreter)


def _dev():
    if DEVICE is not None:
        return torch.device(DEVICE)
    return torch.device("cuda", torch.cuda.current_device())


def _sync() -> None:
    if DEVICE is None or str(DEVICE).startswith("cuda"):
        torch.cuda.synchronize()


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator(device=_dev())
    g.manual_seed(seed)
    return g


def _randn(shape, gen, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, device=_dev(), generator=gen) * scale).to(dtype)


def random_linear_weight(fmt: str, n: int, k: int, gen: torch.Generator):
    """A random, valid linear weight on the GPU: row-split planes (random codes, fp16 scales in
    [1e-3, 2.1e-2)) as a QuantWeight, or a bf16 [n, k] tensor."""
    if fmt == "BF16":
        return _randn((n, k), gen, 0.02)
    from ..artifact.formats import row_split_geometry
    from ..kernels.linear.weights import from_payload

    geom = row_split_geometry(fmt, n, k)
    buf = torch.randint(0, 256, (geom.total,), dtype=torch.uint8, device=_dev(), generator=gen)
    sc = (torch.rand(geom.scale_bytes // 2, device=_dev(), generator=gen) * 0.02 + 1e-3).half()
    buf[geom.scale_offset:geom.scale_offset + geom.scale_bytes] = sc.view(torch.uint8)
    return from_payload(fmt, (n, k), buf)


def _weight_bytes(w) -> int:
    return int(w.nbytes) if not isinstance(w, torch.Tensor) else w.numel() * w.element_size()


def _ref_call(route: Route, *args, **kwargs):
    """The route's reference on the given operands; references written for the CPU are retried
    on CPU copies when the device call fails."""
    ref = route.load_reference()
    try:
        return ref(*args, **kwargs)
    except (RuntimeError, TypeError):
        mv = lambda v: v.cpu() if isinstance(v, torch.Tensor) else v  # noqa: E731
        return ref(*[mv(a) for a in args], **{k: mv(v) for k, v in kwargs.items()})


def _columns(t: int, decode: bool, decode_pos: int, prefill_start: int):
    """(slots used, positions, slots) of t columns: decode = t sequences of one column each at
    position decode_pos (slot i = column i); prefill = one sequence's t consecutive columns from
    prefill_start in slot 0."""
    if decode:
        return (t, torch.full((t,), decode_pos, dtype=torch.int32, device=_dev()),
                torch.arange(t, dtype=torch.int32, device=_dev()))
    return (1, torch.arange(prefill_start, prefill_start + t, dtype=torch.int32, device=_dev()),
            torch.zeros(t, dtype=torch.int32, device=_dev()))


def build_linear(case: MatchCase, t: int, ctx: int | None, copies: int | None, seed: int = 0) -> Bench:
    from ..kernels.linear.launch import linear_workspace_numel

    m = case.match
    fmt, n, k, epi = m["format"], int(m["n"]), int(m["k"]), m.get("epilogue", "none")
    gen = _gen(seed)
    n_out = n // 2 if epi == "swiglu" else n
    w0 = random_linear_weight(fmt, n, k, gen)
    cold = _weight_bytes(w0)
    nc = n_copies(cold) if copies is None else copies
    ws_ = [w0] + [random_linear_weight(fmt, n, k, gen) for _ in range(nc - 1)]
    x = _randn((t, k), gen)
    res = _randn((t, n_out), gen) if epi == "residual" else None
    out = torch.empty(t, n_out, dtype=torch.bfloat16, device=_dev())
    work = {"ws": torch.empty(1, dtype=torch.float32, device=_dev())}

    def workspace(route, params):
        need = max(1, linear_workspace_numel(route.name, t, n, k, epi, route.resolve_params(params)))
        if work["ws"].numel() < need:
            work["ws"] = torch.empty(need, dtype=torch.float32, device=_dev())
        return work["ws"]

    def make(route, params, i):
        fn = route.load_launcher()
        ws = workspace(route, params)
        args = dict(x=x, weight=ws_[i], out=out, epilogue=epi, residual=res, workspace=ws)
        return lambda: call_launcher(fn, args, params)

    def check(route, params):
        out.zero_()
        make(route, params, 0)()
        _sync()
        ref = _ref_call(route, x, w0, epi, res)
        return rel_rms(out, ref)

    return Bench(case, t, ctx, cold, nc, make, check, [ws_])


def build_attention(case: MatchCase, t: int, ctx: int | None, copies: int | None, seed: int = 0) -> Bench:
    from ..kernels.attention.launch import decode_workspace_numel

    sh = case.shapes
    _, hq, d = sh["q"]
    hkv = sh["k_cache"][2]
    quant = case.match.get("kv_dtype") == "int8_g64"
    decode = case.match.get("phase") == "decode"
    ctx = int(ctx or 4096)
    gen = _gen(seed)
    # prefill: one sequence, a prefix of ctx cached rows, then the chunk's t columns
    slots_n, positions, slots = _columns(t, decode, ctx - 1, ctx)
    max_ctx = ctx if decode else ctx + t
    shape = (slots_n, max_ctx, hkv, d)

    def cache():
        if quant:
            kc = torch.randint(-127, 128, shape, dtype=torch.int8, device=_dev(), generator=gen)
            vc = torch.randint(-127, 128, shape, dtype=torch.int8, device=_dev(), generator=gen)
            sshape = (*shape[:3], d // 64)
            ks = (torch.rand(sshape, device=_dev(), generator=gen) * 0.01 + 0.002).half()
            vs = (torch.rand(sshape, device=_dev(), generator=gen) * 0.01 + 0.002).half()
            return kc, vc, ks, vs
        return _randn(shape, gen), _randn(shape, gen), None, None

    per = 2 * math.prod(shape) * (1 if quant else 2)
    nc = n_copies(per) if copies is None else copies
    caches = [cache() for _ in range(nc)]
    q = _randn((t, hq, d), gen)
    gate = _randn((t, hq, d), gen)
    out = torch.empty(t, hq * d, dtype=torch.bfloat16, device=_dev())
    scale = float(case.attrs.get("scale", 1.0 / math.sqrt(d)))
    work = {"ws": torch.empty(1, dtype=torch.float32, device=_dev())}

    def args_for(route, params, i):
        kc, vc, ks, vs = caches[i]
        a = dict(q=q, gate=gate, k_cache=kc, v_cache=vc, positions=positions, slots=slots, out=out,
                 scale=scale, k_scale=ks, v_scale=vs)
        if "decode" in route.name:
            p = route.resolve_params(params)
            need = max(1, decode_workspace_numel(t, hq, d, max_ctx, int(p["split_tokens"])))
            if work["ws"].numel() < need:
                work["ws"] = torch.empty(need, dtype=torch.float32, device=_dev())
            a["workspace"] = work["ws"]
        return a

    def make(route, params, i):
        fn = route.load_launcher()
        a = args_for(route, params, i)
        return lambda: call_launcher(fn, a, params)

    def check(route, params):
        make(route, params, 0)()
        _sync()
        kc, vc, ks, vs = caches[0]
        ref = _ref_call(route, q, gate, kc, vc, positions, slots, scale, ks, vs)
        return rel_rms(out, ref)

    return Bench(case, t, ctx, per, nc, make, check, [caches])


def build_gated_delta_rule(case: MatchCase, t: int, ctx: int | None, copies: int | None,
                           seed: int = 0) -> Bench:
    from ..kernels.gdn import launch as gdn_launch

    sh = case.shapes
    _, hk, dk = sh["q"]
    _, hv, dv = sh["v"]
    decode = case.match.get("phase") == "decode"
    gen = _gen(seed)
    n_slots, positions, slots = _columns(t, decode, 100, 5)
    q = _randn((t, hk, dk), gen)
    k = _randn((t, hk, dk), gen)
    v = _randn((t, hv, dv), gen)
    g = (-torch.rand(t, hv, device=_dev(), generator=gen) * 0.5).contiguous()
    beta = torch.rand(t, hv, device=_dev(), generator=gen).contiguous()
    state0 = 0.1 * torch.randn(n_slots, hv, dk, dv, device=_dev(), generator=gen)
    per = state0.numel() * 4 * 2  # read + written
    nc = n_copies(per // 2) if copies is None else copies
    states = [state0.clone() for _ in range(nc)]
    o = torch.empty(t, hv, dv, dtype=torch.bfloat16, device=_dev())
    wss: dict[int, torch.Tensor] = {}

    def workspace(fn):
        # sized like the runtime does: the chunked_workspace_numel of the launcher's own module
        numel = getattr(inspect.getmodule(fn), "chunked_workspace_numel", gdn_launch.chunked_workspace_numel)
        need = max(1, int(numel(t, hv, dk, dv)))
        if need not in wss:
            wss[need] = torch.empty(need, dtype=torch.float32, device=_dev())
        return wss[need]

    def make(route, params, i):
        fn = route.load_launcher()
        a = dict(q=q, k=k, v=v, g=g, beta=beta, state=states[i], positions=positions, slots=slots, out=o)
        if "decode" not in route.name:
            a["workspace"] = None if decode else workspace(fn)
        return lambda: call_launcher(fn, a, params)

    def check(route, params):
        states[0].copy_(state0)
        make(route, params, 0)()
        _sync()
        ref_o, _ = _ref_call(route, q, k, v, g, beta, state0, positions, slots)
        states[0].copy_(state0)
        return rel_rms(o, ref_o)

    return Bench(case, t, ctx, per, nc, make, check, [states])


def build_conv1d(case: MatchCase, t: int, ctx: int | None, copies: int | None, seed: int = 0) -> Bench:
    m = case.match
    c, kk = int(m["n"]), int(m["k"])
    decode = m.get("phase") == "decode"
    gen = _gen(seed)
    n_slots, positions, slots = _columns(t, decode, 10, 3)
    x = _randn((t, c), gen)
    weight = _randn((kk, c), gen, 0.5)
    state0 = _randn((n_slots, kk - 1, c), gen)
    per = state0.numel() * 2 * 2 + weight.numel() * 2
    nc = n_copies(per) if copies is None else copies
    states = [state0.clone() for _ in range(nc)]
    out = torch.empty(t, c, dtype=torch.bfloat16, device=_dev())

    def make(route, params, i):
        fn = route.load_launcher()
        a = dict(x=x, weight=weight, conv_state=states[i], positions=positions, slots=slots, out=out)
        return lambda: call_launcher(fn, a, params)

    def check(route, params):
        states[0].copy_(state0)
        make(route, params, 0)()
        _sync()
        ref_out, _ = _ref_call(route, x, weight, state0, positions, slots)
        states[0].copy_(state0)
        return rel_rms(out, ref_out)

    return Bench(case, t, ctx, per, nc, make, check, [states])


def _gating_operands(t: int, hv: int, gen: torch.Generator):
    """GDN gating's per-head parameters and outputs: a_log, dt_bias [hv] f32; g, beta [t, hv] f32."""
    a_log = torch.rand(hv, device=_dev(), generator=gen)
    dt_bias = torch.rand(hv, device=_dev(), generator=gen)
    g = torch.empty(t, hv, dtype=torch.float32, device=_dev())
    beta = torch.empty(t, hv, dtype=torch.float32, device=_dev())
    return a_log, dt_bias, g, beta


def build_gdn_gating(case: MatchCase, t: int, ctx: int | None, copies: int | None, seed: int = 0) -> Bench:
    hv = int(case.match.get("n") or case.shapes["a"][1])
    gen = _gen(seed)
    a = _randn((t, hv), gen)
    b = _randn((t, hv), gen)
    a_log, dt_bias, g, beta = _gating_operands(t, hv, gen)

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(a=a, b=b, a_log=a_log, dt_bias=dt_bias, g=g, beta=beta)
        return lambda: call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        _sync()
        rg, rb = _ref_call(route, a, b, a_log, dt_bias)
        return max(rel_rms(g, rg), rel_rms(beta, rb))

    return Bench(case, t, ctx, 0, 1, make, check)


def build_gdn_gating_proj(case: MatchCase, t: int, ctx: int | None, copies: int | None, seed: int = 0) -> Bench:
    """Fused GDN a/b projections + gating: the bf16 [Hv, K] weight pair is the cold operand."""
    hv = int(case.match.get("n") or case.shapes["a_weight"][0])
    k = int(case.match.get("k") or case.shapes["a_weight"][1])
    gen = _gen(seed)
    x = _randn((t, k), gen)
    cold = 2 * hv * k * 2
    n = copies or n_copies(cold)
    ws = [(_randn((hv, k), gen, 0.02), _randn((hv, k), gen, 0.02)) for _ in range(n)]
    a_log, dt_bias, g, beta = _gating_operands(t, hv, gen)

    def make(route, params, i):
        fn = route.load_launcher()
        wa, wb = ws[i % n]
        args = dict(x=x, a_weight=wa, b_weight=wb, a_log=a_log, dt_bias=dt_bias, g=g, beta=beta)
        return lambda: call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        _sync()
        rg, rb = _ref_call(route, x, ws[0][0], ws[0][1], a_log, dt_bias)
        return max(rel_rms(g, rg), rel_rms(beta, rb))

    return Bench(case, t, ctx, cold, n, make, check)


def build_rmsnorm(case: MatchCase, t: int, ctx: int | None, copies: int | None, seed: int = 0) -> Bench:
    h = int(case.match.get("n") or case.shapes["weight"][0])
    eps = float(case.attrs.get("eps", 1e-6))
    gen = _gen(seed)
    x = _randn((t, h), gen)
    w = _randn((h,), gen, 0.1)
    out = torch.empty(t, h, dtype=torch.bfloat16, device=_dev())

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(x=x, weight=w, out=out, eps=eps)
        return lambda: call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        _sync()
        return rel_rms(out, _ref_call(route, x, w, eps))

    return Bench(case, t, ctx, 0, 1, make, check)


def build_head_norm(case: MatchCase, t: int, ctx: int | None, copies: int | None, seed: int = 0) -> Bench:
    """head_rmsnorm (x [T, heads, D]) and gated_rmsnorm (x, z [T, Hv, Dv] -> [T, Hv*Dv])."""
    _, heads, d = case.shapes["x"]
    eps = float(case.attrs.get("eps", 1e-6))
    gen = _gen(seed)
    x = _randn((t, heads, d), gen)
    w = _randn((d,), gen, 0.1)
    gated = case.family == "gated_rmsnorm"
    z = _randn((t, heads, d), gen) if gated else None
    out = torch.empty(*((t, heads * d) if gated else (t, heads, d)), dtype=torch.bfloat16, device=_dev())

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(x=x, weight=w, out=out, eps=eps)
        if gated:
            args["z"] = z
        return lambda: call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        _sync()
        ref = _ref_call(route, x, z, w, eps) if gated else _ref_call(route, x, w, eps)
        return rel_rms(out, ref)

    return Bench(case, t, ctx, 0, 1, make, check)


def build_qk_norm_rope(case: MatchCase, t: int, ctx: int | None, copies: int | None, seed: int = 0) -> Bench:
    _, hq, d = case.shapes["q"]
    _, hk, _ = case.shapes["k"]
    eps = float(case.attrs.get("eps", 1e-6))
    rot = int(case.attrs.get("rotary_dim", d))
    theta = float(case.attrs.get("theta", 1e7))
    gen = _gen(seed)
    q = _randn((t, hq, d), gen)
    k = _randn((t, hk, d), gen)
    qw = _randn((d,), gen, 0.1)
    kw = _randn((d,), gen, 0.1)
    positions = torch.arange(7, 7 + t, dtype=torch.int32, device=_dev())
    qo = torch.empty_like(q)
    ko = torch.empty_like(k)

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(q=q, k=k, q_weight=qw, k_weight=kw, positions=positions, q_out=qo, k_out=ko,
                    eps=eps, rotary_dim=rot, theta=theta)
        return lambda: call_launcher(fn, args, params)

    def check(route, params):
        make(route, params, 0)()
        _sync()
        rq, rk = _ref_call(route, q, k, qw, kw, positions, eps, rot, theta)
        return max(rel_rms(qo, rq), rel_rms(ko, rk))

    return Bench(case, t, ctx, 0, 1, make, check)


def build_kv_append(case: MatchCase, t: int, ctx: int | None, copies: int | None, seed: int = 0) -> Bench:
    from ..kernels.kv_cache.reference import cache_as_float

    _, hkv, d = case.shapes["k"]
    quant = case.match.get("kv_dtype") == "int8_g64"
    gen = _gen(seed)
    k = _randn((t, hkv, d), gen)
    v = _randn((t, hkv, d), gen)
    positions = torch.arange(t, dtype=torch.int32, device=_dev())
    slots = torch.zeros(t, dtype=torch.int32, device=_dev())
    shape = (1, t, hkv, d)
    if quant:
        kc = torch.zeros(shape, dtype=torch.int8, device=_dev())
        vc = torch.zeros_like(kc)
        ks = torch.zeros(*shape[:3], d // 64, dtype=torch.float16, device=_dev())
        vs = torch.zeros_like(ks)
    else:
        kc = torch.zeros(shape, dtype=torch.bfloat16, device=_dev())
        vc = torch.zeros_like(kc)
        ks = vs = None

    def make(route, params, i):
        fn = route.load_launcher()
        args = dict(k=k, v=v, positions=positions, slots=slots, k_cache=kc, v_cache=vc,
                    k_scale=ks, v_scale=vs)
        return lambda: call_launcher(fn, args, params)

    def check(route, params):
        z = [torch.zeros_like(a) for a in (kc, vc)] + ([torch.zeros_like(ks), torch.zeros_like(vs)]
                                                       if quant else [None, None])
        make(route, params, 0)()
        _sync()
        rk, rv, rks, rvs = _ref_call(route, k, v, positions, slots, *z)
        return max(rel_rms(cache_as_float(kc, ks), cache_as_float(rk, rks)),
                   rel_rms(cache_as_float(vc, vs), cache_as_float(rv, rvs)))

    return Bench(case, t, ctx, 0, 1, make, check)


BUILDERS: dict[str, Callable[..., Bench]] = {
    "linear": build_linear,
    "attention": build_attention,
    "gated_delta_rule": build_gated_delta_rule,
    "conv1d": build_conv1d,
    "gdn_gating": build_gdn_gating,
    "gdn_gating_proj": build_gdn_gating_proj,
    "rmsnorm": build_rmsnorm,
    "head_rmsnorm": build_head_norm,
    "gated_rmsnorm": build_head_norm,
    "qk_norm_rope": build_qk_norm_rope,
    "kv_append": build_kv_append,
}


def build(case: MatchCase, t: int, ctx: int | None = None, copies: int | None = None, seed: int = 0) -> Bench:
    b = BUILDERS.get(case.family)
    if b is None:
        raise RouteError(f"tune: no GPU builder for family {case.family}")
    return b(case, t, ctx, copies, seed)


# --------------------------------------------------------------------------- precompile (workers)
def precompile_job(job: tuple) -> list[str]:
    """Worker entry point: build one (case, T, ctx) with a single copy and launch every candidate
    once, so the Triton kernels land in the on-disk cache before the timed pass. Returns error
    lines (the timed pass reports failures itself)."""
    case_data, t, ctx, cands = job
    case = MatchCase(**case_data)
    errs = []
    try:
        from ..kernels.registry import get_route

        bench = build(case, t, ctx, copies=1)
        for name, params in cands:
            try:
                bench.launches(get_route(name), params)[0]()
            except Exception as exc:  # noqa: BLE001
                errs.append(f"{name} {params}: {type(exc).__name__}: {str(exc)[:200]}")
        torch.cuda.synchronize()
        del bench
        torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001
        errs.append(f"{case.key} T={t}: {type(exc).__name__}: {str(exc)[:200]}")
    return errs


def _worker_init() -> None:
    import signal
    import warnings

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the pool
    warnings.filterwarnings("ignore")
    torch.cuda.init()
