"""The spec_accept family's tuner share (`kernels/tuning.py`): a bench builder timing the launch of
a verify round at T = C * W columns: a verify case per draft window (W = K + 1, the case's `window`;
tune/shapes.py), measured at the round sizes T = C x W of `tune --verify-rows` (C = 1, 2, 4, 8);
a T that is no whole number of rows is rounded up to whole rows. No torch / triton at module level
(the builder imports them).

Timed: every row sampled (temperature 0.8, top-k 50, top-p 0.95: the threshold bisections, the
costly path) with real drafts, half of them the target's argmax. Checked: the same operands with
greedy rows, exactly (accepted counts and the emitted tokens against the reference; tokens past a
row's stop are unspecified and masked out).
"""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec

DEFAULT_WINDOW = 4  # the window of a case without one (an older measurement file's): K = 3


def build_spec_accept(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    import torch

    from ninfer_compile.tune import measure as M

    from .sizing import workspace_elems

    V = int(case.match.get("n") or case.shapes["logits"][1])
    W = int(getattr(case, "window", 0) or DEFAULT_WINDOW)  # the round's width
    C = -(-t // W)
    T = C * W
    d = M.dev()
    gen = M.generator(seed)
    logits = M.randn((T, V), gen, 2.0)  # [T, V] bf16
    am = torch.argmax(logits.float(), -1).to(torch.int32)  # [T]
    ids = torch.randint(0, V, (T,), device=d, generator=gen, dtype=torch.int32)
    ids[1:] = torch.where(torch.arange(1, T, device=d) % 2 == 1, am[:-1], ids[1:])  # odd drafts: the argmax
    ids[::W] = 0  # column 0 of a row: its last accepted token
    n_drafts = torch.full((C,), W - 1, device=d, dtype=torch.int32)  # [C]

    def params(sampled: bool):
        f = lambda v, dt: torch.full((T,), v, device=d, dtype=dt)  # noqa: E731
        seeds = torch.stack([torch.arange(T, device=d, dtype=torch.int32), torch.zeros(T, device=d, dtype=torch.int32)], 1)
        return dict(temperature=f(0.8 if sampled else 0.0, torch.float32), top_k=f(50, torch.int32),
                    top_p=f(0.95, torch.float32), seed=seeds.contiguous(), sample_pos=torch.arange(T, device=d, dtype=torch.int32))

    timed, greedy = params(True), params(False)
    tokens = torch.empty(T, device=d, dtype=torch.int32)  # [T]
    accepted = torch.empty(C, device=d, dtype=torch.int32)  # [C]
    ws = torch.empty(workspace_elems(T, V), device=d, dtype=torch.float32)

    def make(route, p, i):
        fn = route.load_launcher()
        args = dict(logits=logits, ids=ids, n_drafts=n_drafts, **timed, tokens=tokens, accepted=accepted, workspace=ws)
        return lambda: M.call_launcher(fn, args, p)

    def emitted(tok, acc):  # [C + T]: accepted, then the tokens at j <= accepted (others 0)
        keep = torch.arange(W, device=tok.device)[None, :] <= acc.long()[:, None]
        return torch.cat([acc.float(), torch.where(keep, tok.view(C, W), 0).float().flatten()])

    def check(route, p):
        fn = route.load_launcher()
        M.call_launcher(fn, dict(logits=logits, ids=ids, n_drafts=n_drafts, **greedy, tokens=tokens,
                                 accepted=accepted, workspace=ws), p)
        M.sync()
        ref_t, ref_a = M.ref_call(route, logits, ids, n_drafts, *greedy.values())
        return M.rel_rms(emitted(tokens.cpu(), accepted.cpu()), emitted(ref_t.cpu(), ref_a.cpu()))

    return M.Bench(case, t, ctx, 0, 1, make, check)


TUNE = (TuneSpec(family="spec_accept", order=135, builder="ninfer_compile.kernels.spec_accept.tune:build_spec_accept",
                 tol=1e-6,
                 doc="verify-round acceptance at T = C x W (a case per window W; sampled rows timed, greedy rows "
                     "checked)"),)
