"""CUDA graphs: one captured graph per decode extent (GPU only).

A decode extent has a fixed column count T = C and fixed arena offsets, so its launch list is
captured once at load and replayed every step: the engine writes the step's ids / positions /
slots into the extent's (static) input buffers, replays, and reads the static logits buffer.
Capture runs the list twice on a side stream first (Triton compiles its kernels there), then
records it; the state written by those dummy steps (distinct free slots, position 0) is zeroed.
"""

from __future__ import annotations

import torch


def _dummy_inputs(runner) -> None:
    c = runner.t
    runner.inputs["ids"].zero_()
    runner.inputs["positions"].zero_()
    runner.inputs["slots"].copy_(torch.arange(c, dtype=torch.int32, device=runner.inputs["slots"].device)
                                 % runner.engine.slots)
    if "logit_rows" in runner.inputs:
        runner.inputs["logit_rows"].zero_()


def capture_decode_graphs(engine) -> dict[str, torch.cuda.CUDAGraph]:
    graphs: dict[str, torch.cuda.CUDAGraph] = {}
    for runner in engine.decode_runners:
        if not runner.capture:
            continue
        _dummy_inputs(runner)
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
        g.replay()
    else:
        runner.run()
