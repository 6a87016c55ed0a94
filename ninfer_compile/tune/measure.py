"""GPU measurement of route candidates (imported only on the GPU path: it needs torch + CUDA).

For one `MatchCase` at one T (and context depth, for a family whose TuneSpec says `contexts`) the
family's builder (`TuneSpec.builder`, in `kernels/<family>/tune.py`) allocates the operands on the
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

The builders share the bench machinery below: `Bench`, `n_copies`, `rel_rms`, `call_launcher`,
`dev` / `sync` / `generator` / `randn`, `random_linear_weight` (random quantised weights),
`weight_bytes`, `ref_call`, `columns` (decode / prefill positions and slots) and `verify_window` /
`verify_columns` (a verify case's rows of W columns). This module names no family.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from ..errors import RouteError
from ..kernels.registry import Route
from ..kernels.tuning import DEFAULT_TOL, find_tune_spec
from .shapes import MatchCase

L2_BYTES = 50 * 2**20  # H200; the rotation target is a multiple of it
COLD_FACTOR = 3
MAX_COPIES = 256
MIN_LAUNCHES = 4



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
def param_candidates(route: Route, t: int, quick: bool) -> list[dict]:
    """The params tried for `route` at T (legal values only; the route's defaults always first).
    The family's TuneSpec proposes a curated set per schedule (`kernels/<family>/tune.py`; the full
    cartesian product of every ParamSpec is thousands of compiles); `quick` keeps the first two."""
    spec = find_tune_spec(route.family)
    cands = spec.raw_candidates(route, t, quick) if spec is not None else []
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


def tolerance(family: str) -> float:
    """Relative RMS tolerance of the reference check for `family` (its TuneSpec's `tol`)."""
    spec = find_tune_spec(family)
    return spec.tol if spec is not None else DEFAULT_TOL


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


# --------------------------------------------------------------------------- bench machinery
# Shared by the families' bench builders (`kernels/<family>/tune.py`, `TuneSpec.builder`).
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


def dev():
    if DEVICE is not None:
        return torch.device(DEVICE)
    return torch.device("cuda", torch.cuda.current_device())


def sync() -> None:
    if DEVICE is None or str(DEVICE).startswith("cuda"):
        torch.cuda.synchronize()


def generator(seed: int) -> torch.Generator:
    g = torch.Generator(device=dev())
    g.manual_seed(seed)
    return g


def randn(shape, gen, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, device=dev(), generator=gen) * scale).to(dtype)


def random_linear_weight(fmt: str, n: int, k: int, gen: torch.Generator):
    """A random, valid linear weight on the GPU: row-split planes (random codes, fp16 scales in
    [1e-3, 2.1e-2)) as a QuantWeight, or a bf16 [n, k] tensor."""
    if fmt == "BF16":
        return randn((n, k), gen, 0.02)
    from ..artifact.formats import row_split_geometry
    from ..kernels.linear.weights import from_payload

    geom = row_split_geometry(fmt, n, k)
    buf = torch.randint(0, 256, (geom.total,), dtype=torch.uint8, device=dev(), generator=gen)
    sc = (torch.rand(geom.scale_bytes // 2, device=dev(), generator=gen) * 0.02 + 1e-3).half()
    buf[geom.scale_offset:geom.scale_offset + geom.scale_bytes] = sc.view(torch.uint8)
    return from_payload(fmt, (n, k), buf)


def weight_bytes(w) -> int:
    return int(w.nbytes) if not isinstance(w, torch.Tensor) else w.numel() * w.element_size()


def ref_call(route: Route, *args, **kwargs):
    """The route's reference on the given operands; references written for the CPU are retried
    on CPU copies when the device call fails."""
    ref = route.load_reference()
    try:
        return ref(*args, **kwargs)
    except (RuntimeError, TypeError):
        mv = lambda v: v.cpu() if isinstance(v, torch.Tensor) else v  # noqa: E731
        return ref(*[mv(a) for a in args], **{k: mv(v) for k, v in kwargs.items()})


def columns(t: int, decode: bool, decode_pos: int, prefill_start: int):
    """(slots used, positions, slots) of t columns: decode = t sequences of one column each at
    position decode_pos (slot i = column i); prefill = one sequence's t consecutive columns from
    prefill_start in slot 0."""
    if decode:
        return (t, torch.full((t,), decode_pos, dtype=torch.int32, device=dev()),
                torch.arange(t, dtype=torch.int32, device=dev()))
    return (1, torch.arange(prefill_start, prefill_start + t, dtype=torch.int32, device=dev()),
            torch.zeros(t, dtype=torch.int32, device=dev()))


def verify_window(case: MatchCase) -> int:
    """W of a verify case: the case's round width (`window`), else the op's attribute `window`,
    else 4; 0 unless the case's match says phase verify or the case has a window."""
    w = int(getattr(case, "window", 0) or 0)
    if w:
        return w
    if case.match.get("phase") != "verify":
        return 0
    return int(case.attrs.get("window") or 4)


def verify_columns(t: int, window: int, pos0: int):
    """(slots used, positions, slots) of t = C * W verify columns: row r = slot r at positions
    pos0 .. pos0 + W - 1 (docs/SPECULATIVE.md's column layout)."""
    c = t // window
    slots = torch.arange(c, dtype=torch.int32, device=dev()).repeat_interleave(window)
    positions = (pos0 + torch.arange(window, dtype=torch.int32, device=dev())).repeat(c)
    return c, positions, slots


_dev = dev  # the earlier spelling (tests)


def build(case: MatchCase, t: int, ctx: int | None = None, copies: int | None = None, seed: int = 0) -> Bench:
    """The operands of one (case, T, context): the family's TuneSpec builder."""
    spec = find_tune_spec(case.family)
    if spec is None or not spec.tunable:
        raise RouteError(f"tune: no GPU builder for family {case.family}")
    return spec.load_builder()(case, t, ctx, copies, seed)


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
