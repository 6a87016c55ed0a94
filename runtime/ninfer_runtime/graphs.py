"""CUDA graphs: one captured graph per decode-like extent (GPU only).

A decode extent (and, in a plan with a draft window, a verify extent and the MTP decode / verify
extents: docs/SPECULATIVE.md) has a fixed column count T and fixed arena offsets, so its launch
list is captured once at load and replayed every step: the engine writes the step's ids /
positions / slots (and, for the others, n_drafts / hidden) into the extent's (static) input
buffers, replays, and reads the static output buffers. Capture runs the list twice on a side
stream first (Triton compiles its kernels there), then records it; the state written by those
dummy steps (distinct slots per row, positions 0..) is zeroed. The extents captured are those
the plan marks `cuda_graph.capture` (`Engine.captured_runners`). Those two side-stream runs are
what makes the capture safe; the load's warm-up run of every extent before it (`warm_kernels`) is
only for getting kernels compiled / loaded early, and is skipped when nothing is left to do
(`warmup_needed`).
"""

from __future__ import annotations

import torch


def dummy_inputs(runner) -> None:
    """Inputs a dummy run (warm-up, capture) may use: every input zero (greedy sampling rows,
    no real drafts, zero hidden rows), then one slot per row (a decode column, a verify row of
    W columns, a prefill chunk: slot 0) at positions 0.. within the row, inside the context."""
    eng = runner.engine
    dev = eng.device
    for t in runner.inputs.values():
        t.zero_()
    if "top_p" in runner.inputs:
        runner.inputs["top_p"].fill_(1.0)  # off (rows are greedy: temperature 0)
    T = runner.t
    C = max(1, int(runner.concurrency)) if runner.phase != "prefill" else 1
    W = max(1, T // C)
    col = torch.arange(T, dtype=torch.int32, device=dev)
    if "positions" in runner.inputs:
        runner.inputs["positions"].copy_((col % W) % eng.max_context)
    if "slots" in runner.inputs:
        runner.inputs["slots"].copy_((col // W) % eng.slots)


def warmup_needed(engine) -> bool:
    """Whether the load runs every extent once before capture (`warm_kernels`). What that run is for:
    - it gets every kernel an extent launches at T compiled (JIT) or loaded (cubin, launcher) inside
      the load rather than in the first request. With the plan's binaries `complete()` (every kernel
      the compiler saw launched preloaded from the plan, its cubin loaded and launcher built by
      `load_modules` in the background, nothing stale) that work is already done: skipped;
    - it is not what makes capture safe: `capture_decode_graphs` runs each captured extent twice on a
      side stream before recording it (torch's lazily loaded kernels, cuBLAS handles, any kernel
      that still needs a JIT or a module load), with or without a warm-up before;
    - it never covered a prefill's tail columns (n < T: other specialisations), which rely on the
      binaries (the compiler builds them) either way;
    - a --tp plan keeps it: each rank decides on its own binaries, and the ranks must issue the same
      collectives in the same order (the warm-up's, then the capture's).
    No warm-up off a GPU (`backend.warm`: false on the CPU's torch and interpreter paths)."""
    if not engine.backend.warm:
        return False
    if engine.tp is not None and engine.tp.world > 1:
        return True
    return engine.binaries is None or not engine.binaries.complete()


def warm_kernels(engine) -> None:
    """Run every extent once on dummy inputs (slot per row, positions 0..), so every kernel is
    loaded from the plan's binaries or JIT-compiled now, inside the load's "kernels" time; the
    state they write is zeroed."""
    for r in engine.extents.values():
        dummy_inputs(r)
        r.run()
    engine.backend.synchronize()
    engine.zero_state()
    engine.backend.synchronize()


def capture_decode_graphs(engine) -> dict[str, torch.cuda.CUDAGraph]:
    graphs: dict[str, torch.cuda.CUDAGraph] = {}
    for runner in engine.captured_runners():
        dummy_inputs(runner)
        side = torch.cuda.Stream(device=engine.device)
        side.wait_stream(torch.cuda.current_stream(engine.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                runner.run()
        torch.cuda.current_stream(engine.device).wait_stream(side)
        torch.cuda.synchronize(engine.device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            runner.run()
        graphs[runner.name] = g
    engine.zero_state()
    torch.cuda.synchronize(engine.device)
    return graphs


def replay_or_run(engine, runner, use_graph: bool = True) -> None:
    g = engine.graphs.get(runner.name) if use_graph else None
    if g is not None:
        if engine.lockstep is not None:  # --tp rank 0: the other ranks replay the same step
            engine.lockstep.run(runner, None, graph=True)
        g.replay()
    else:
        runner.run()
