"""The sampling family's tuner share (`kernels/tuning.py`): a bench builder timing `sample_per_slot`
at T rows of the vocabulary (one route, no params: the measurement is the row's evidence).

Timed: every row sampled (temperature 0.8, top-k 50, top-p 0.95: the threshold bisections, the
costly path). Checked: the same logits with greedy rows, exactly (the ids against the reference's
argmax). No torch / triton at module level (the builder imports them).
"""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def build_sample(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    import torch

    from ninfer_compile.tune import measure as M

    from .sizing import workspace_elems

    V = int(case.match.get("n") or case.shapes["logits"][1])
    d = M.dev()
    gen = M.generator(seed)
    logits = M.randn((t, V), gen, 2.0)  # [T, V] bf16

    def params(sampled: bool):
        f = lambda v, dt: torch.full((t,), v, device=d, dtype=dt)  # noqa: E731
        seeds = torch.stack([torch.arange(t, device=d, dtype=torch.int32), torch.zeros(t, device=d, dtype=torch.int32)], 1)
        return dict(temperature=f(0.8 if sampled else 0.0, torch.float32), top_k=f(50, torch.int32),
                    top_p=f(0.95, torch.float32), seed=seeds.contiguous(),
                    sample_pos=torch.arange(t, device=d, dtype=torch.int32))

    timed, greedy = params(True), params(False)
    ids = torch.empty(t, device=d, dtype=torch.int32)  # [T]
    ws = torch.empty(workspace_elems(t, V), device=d, dtype=torch.float32)

    def make(route, p, i):
        fn = route.load_launcher()
        args = dict(logits=logits, **timed, ids=ids, workspace=ws)
        return lambda: M.call_launcher(fn, args, p)

    def check(route, p):
        M.call_launcher(route.load_launcher(), dict(logits=logits, **greedy, ids=ids, workspace=ws), p)
        M.sync()
        ref = M.ref_call(route, logits, *greedy.values())
        return M.rel_rms(ids.cpu().float() + 1.0, ref.cpu().float() + 1.0)  # + 1: id 0 counts

    return M.Bench(case, t, ctx, 0, 1, make, check)


TUNE = (TuneSpec(family="sampling", order=130, builder="ninfer_compile.kernels.sampling.tune:build_sample",
                 tol=1e-6, doc="T rows of the vocabulary (sampled rows timed, greedy rows checked exactly)"),)
