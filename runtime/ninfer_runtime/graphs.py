"""CUDA graphs: one captured graph per decode-like extent (GPU only).

A decode extent (and, in a plan with a draft window, a verify extent and the MTP decode / verify
extents: docs/SPECULATIVE.md) has a fixed column count T and fixed arena offsets, so its launch
list is captured once at load and replayed every step: the engine writes the step's ids /
positions / slots (and, for the others, n_drafts / hidden) into the extent's (static) input
buffers, replays, and reads the static output buffers. Capture runs the list twice on a side
stream first (Triton compiles its kernels there), then records it; the state written by those
dummy steps (distinct slots per row, positions 0..) is zeroed. The extents captured are those
the plan marks `cuda_graph.capture` (`Engine.captured_runners`).
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
