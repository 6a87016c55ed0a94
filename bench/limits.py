"""Physical limits every benchmark divides by, and the byte floor of a decode step.

Two read-bandwidth figures, measured in the same run as the thing they judge:
- `streaming_read_gbs`: a read-only Triton kernel (16-byte loads, one xor-reduced word per program
  written back) over rotated buffers that together exceed 3x the L2 -- the card's streaming read
  rate, the limit a weight-streaming GEMV can approach;
- `cublas_gemv_gbs`: bf16 cuBLAS GEMV over rotated cold 34816x5120 weights (bytes of W / time) --
  what a vendor GEMV reaches; it sits well under the streaming rate on an H200.

`step_floor_bytes(plan, extent, entry_bytes, context)`: the bytes a decode step must move at
least: every weight its launches bind once (the embedding table: one row per column), the GDN
recurrent and conv state of every active slot read and written, and the KV cache read at
`context` positions per slot (the frontier row written). `launch_floor_bytes` is the same per launch:
the per-kernel waterfall of `bench_e2e --profile` divides each kernel's device time by it.

The floors need only plan.json and the artifact's directory (CPU-testable); the two bandwidth
figures need a CUDA GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

# ---------------------------------------------------------------------------------- byte floors

_DTYPE_BYTES = {"bf16": 2, "f16": 2, "fp16": 2, "f32": 4, "fp32": 4, "i32": 4, "int8": 1, "u8": 1, "uint8": 1}


def _state_ref(v) -> str | None:
    return v.get("state") if isinstance(v, dict) else None


def _slot_bytes(buf: Mapping) -> int:
    """Bytes of one slot of a persistent state buffer (plan.json buffers.state entry)."""
    per = buf.get("per_slot_shape")
    if per is None:
        return int(buf["bytes"])
    return math.prod(per) * _DTYPE_BYTES.get(str(buf.get("dtype")), 2)


def expected_experts_hit(experts: int, top_k: int, columns: int) -> float:
    """Expected distinct experts a step of `columns` tokens hits under uniform routing (the MoE
    tuner's `expected_hits`: E * (1 - (1 - k/E)^T)); exactly k at T = 1."""
    from ninfer_compile.kernels.moe.tune import expected_hits

    return expected_hits(max(1, int(columns)), experts, top_k)


def _moe_banks_share(launch: Mapping, plan: Mapping) -> float:
    """Share of a `moe_experts` launch's banks one step reads: the expected distinct experts hit at
    its T columns (uniform routing) over E, with E and top_k taken from the router launch that
    writes the same expert_ids buffer; 1.0 for any other launch."""
    if launch.get("kind") != "moe_experts":
        return 1.0
    ids = launch["args"]["expert_ids"]["buffer"]
    for ext in plan["extents"].values():
        for L in ext["launches"]:
            if L.get("kind") == "moe_router" and L.get("outs", {}).get("expert_ids", {}).get("buffer") == ids:
                E, k = int(L["match"]["n"]) - 1, int(L["attrs"]["top_k"])
                return expected_experts_hit(E, k, int(launch.get("t", 1))) / E
    raise KeyError(f"moe_experts launch {launch.get('op')}: no router writes {ids}")


def launch_floor_bytes(launch: Mapping, plan: Mapping, entry_bytes: Callable[[str], int], *, slots: int,
                       context: int) -> int:
    """The least bytes one launch must move at decode with `slots` active sequences `context` deep.

    Weights: every bound weight object whole (the embedding table: one row of it per column; an
    expert bank: the rows of the experts a step is expected to hit, `_moe_banks_share`).
    State (`{"state": ...}` arguments): recurrent / conv state read + written per active slot; a
    KV cache (per-slot shape [ctx, heads, D]) read for `context` positions and one row written.
    Activations are not counted (kilobytes at decode)."""
    state = plan["buffers"]["state"]
    total = 0
    for name, v in launch["args"].items():
        if isinstance(v, dict) and "weight" in v:
            nbytes = entry_bytes(v["weight"])
            if launch.get("kind") == "embedding":
                rows = max(1, int(launch.get("match", {}).get("n", 1)))
                nbytes = math.ceil(nbytes / rows) * int(launch.get("t", 1))
            elif name in ("gate_up", "down"):
                nbytes = math.ceil(nbytes * _moe_banks_share(launch, plan))
            total += nbytes
            continue
        ref = _state_ref(v)
        if ref is None or ref not in state:
            continue
        buf = state[ref]
        per_slot = _slot_bytes(buf)
        if buf.get("kind") == "kv":
            per_pos = per_slot // max(1, int(buf["per_slot_shape"][0]))
            # attention reads `context` rows; kv_append writes one row (per column of the slot)
            reads = context if launch.get("kind") == "attention" else 0
            writes = 1 if launch.get("kind") != "attention" else 0
            total += slots * per_pos * (reads + writes)
        else:
            total += 2 * slots * per_slot
    return total


def decode_extent(plan: Mapping, c: int) -> tuple[str, Mapping]:
    """(name, extent) of the plan's plain decode extent at concurrency c."""
    for name, e in plan["extents"].items():
        if e.get("phase") == "decode" and not name.startswith("mtp") and int(e.get("concurrency", -1)) == c:
            return name, e
    raise KeyError(f"plan has no decode extent at C={c}")


def step_floor_bytes(plan: Mapping, extent: Mapping, entry_bytes: Callable[[str], int], *, context: int,
                     slots: int | None = None) -> dict[str, int]:
    """Byte floor of one decode step of `extent`, split into weights / state / kv (and their total).
    A weight bound by several launches counts once (it is read once per step at best)."""
    slots = int(extent.get("concurrency", 1)) if slots is None else slots
    seen: set[str] = set()
    out = {"weights": 0, "state": 0, "kv": 0}
    state = plan["buffers"]["state"]
    for L in extent["launches"]:
        for v in L["args"].values():
            if isinstance(v, dict) and "weight" in v:
                if v["weight"] in seen:
                    continue
                seen.add(v["weight"])
                one = {**L, "args": {k: a for k, a in L["args"].items() if a is v or k == "expert_ids"}}
                out["weights"] += launch_floor_bytes(one, plan, entry_bytes, slots=slots, context=context)
            elif _state_ref(v) in state:
                one = {"args": {"s": v}, "kind": L.get("kind")}
                key = "kv" if state[_state_ref(v)].get("kind") == "kv" else "state"
                out[key] += launch_floor_bytes(one, plan, entry_bytes, slots=slots, context=context)
    out["total"] = out["weights"] + out["state"] + out["kv"]
    return out


def route_kernel_names(plan_dir) -> dict[str, list[str]]:
    """route name -> its Triton kernel function names (from the plan's kernels/manifest.json)."""
    import json
    from pathlib import Path

    m = json.loads((Path(plan_dir) / "kernels" / "manifest.json").read_text())
    return {r: [k.split(":", 1)[1] for k in info.get("kernels", [])] for r, info in m.get("routes", {}).items()}


def floors_by_kernel(plan: Mapping, extent: Mapping, entry_bytes: Callable[[str], int],
                     kernels_of_route: Mapping[str, list[str]], *, context: int) -> dict[str, int]:
    """Byte floor per kernel name over one step: each launch's floor goes to its route's first
    (main) kernel; helper kernels (split-K reduces, second stages) get a floor of 0."""
    slots = int(extent.get("concurrency", 1))
    out: dict[str, int] = {}
    for L in extent["launches"]:
        names = kernels_of_route.get(L.get("route", ""), [])
        for k in names[1:]:
            out.setdefault(k, 0)
        key = names[0] if names else f"({L.get('route', '?')})"
        out[key] = out.get(key, 0) + launch_floor_bytes(L, plan, entry_bytes, slots=slots, context=context)
    return out


# ------------------------------------------------------------------------------ GPU measurements

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _stream_read_kernel(x_ptr, out_ptr, n_words, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """Each program reads BLOCK*ITERS int32 words (16-byte vector loads, L2-streaming) and writes
    their xor: the only store is one word per program, so the kernel is a pure read."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(x_ptr + offs, mask=offs < n_words, other=0, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.xor_sum(acc, 0))


def streaming_read_gbs(torch, *, buffer_mib: int = 256, buffers: int = 6, rounds: int = 3, trials: int = 3) -> dict:
    """The card's streaming read rate (GB/s): a read-only kernel over `buffers` rotated buffers of
    `buffer_mib` MiB (each alone > 3x L2, so every read is cold), launched back to back over all
    buffers `rounds` times between two events (per-launch event overhead amortised), median of
    `trials`, best launch config. Returns {"gbs", "config", "bytes_per_launch", "configs": {...}}."""
    import triton

    n_words = buffer_mib * (1 << 20) // 4
    bufs = [torch.randint(-2**31, 2**31 - 1, (n_words,), dtype=torch.int32, device="cuda") for _ in range(buffers)]
    configs = {}
    for block, iters, warps in ((1024, 8, 4), (2048, 4, 4), (2048, 8, 8), (4096, 4, 8), (4096, 8, 8),
                                (4096, 16, 16), (8192, 4, 16), (8192, 8, 32)):
        grid = (triton.cdiv(n_words, block * iters),)
        out = torch.empty(grid[0], dtype=torch.int32, device="cuda")
        run = lambda b: _stream_read_kernel[grid](b, out, n_words, BLOCK=block, ITERS=iters, num_warps=warps)  # noqa: E731
        for b in bufs:
            run(b)
        torch.cuda.synchronize()
        rates = []
        for _ in range(trials):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(rounds):
                for b in bufs:
                    run(b)
            e1.record()
            torch.cuda.synchronize()
            rates.append(rounds * buffers * n_words * 4 / (e0.elapsed_time(e1) / 1e3) / 1e9)
        rates.sort()
        configs[f"B{block}xI{iters}w{warps}"] = rates[len(rates) // 2]
    del bufs
    torch.cuda.empty_cache()
    best = max(configs, key=configs.get)
    return {"gbs": configs[best], "config": best, "bytes_per_launch": n_words * 4, "configs": configs}


def cublas_gemv_gbs(torch, n: int = 34816, k: int = 5120, copies: int = 8) -> float:
    """bf16 cuBLAS GEMV over `copies` rotated weight matrices (cold: together far larger than L2):
    bytes of W read / median time (GB/s)."""
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(k, device="cuda", dtype=torch.bfloat16)
    for w in ws:
        torch.mv(w, x)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        for w in ws:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            torch.mv(w, x)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3)
    times.sort()
    del ws
    torch.cuda.empty_cache()
    return n * k * 2 / times[len(times) // 2] / 1e9
