"""The state_select family's tuner share (`kernels/tuning.py`): the bench builder (the rollback copy
of one verify round) and its param candidates; it joins the `--families gdn` group (it rolls back
the GDN recurrent and conv states). Its match does not pin the state shape, so each state shape
and dtype of the model is a `variant` (a case of its own; the match's rows are picked on their
sum): the 27B's f32 recurrent state [48, 128, 128] and its bf16 conv state [3, 10240]. No torch /
triton at module level (the builder imports them)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def state_select_candidates(route, t: int, quick: bool) -> list[dict]:
    return [{}, {"BLOCK": 2048}, {"BLOCK": 4096, "num_warps": 8}, {"BLOCK": 512}, {"num_warps": 8},
            {"BLOCK": 2048, "num_warps": 8}]


def state_select_variant(shapes, dtypes, attrs) -> str:
    """`f32[48,128,128]`: the dtype and per-slot shape of the state (the op's `state` operand)."""
    st = tuple(shapes.get("state") or ())
    return f"{dtypes.get('state', '?')}[{','.join(map(str, st[1:]))}]" if st else ""


def build_state_select(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    """Operands of one state_select at T slot entries (T = C * (K+1), rounded up to whole rows):
    every row rolls back (accepted = 0: the most a round copies); the columns are the cold operand."""
    import torch

    from ninfer_compile.tune import measure as M

    st = tuple(case.shapes["state"])  # [slots, *S]
    cs = tuple(case.shapes["columns"])  # [C, K, *S]
    kk = int(case.window) - 1 if case.window else int(cs[1])
    w = kk + 1
    c = -(-t // w)
    per_slot = st[1:]
    # the match does not pin a dtype: the case's own (its variant), else the GDN recurrent state
    # [slots, Hv, Dk, Dv] is f32, the conv state bf16
    named = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    dtype = named.get((case.dtypes or {}).get("state", ""), torch.float32 if len(st) == 4 else torch.bfloat16)
    gen = M.generator(seed)
    n_slots = c + 1
    state0 = M.randn((n_slots, *per_slot), gen, dtype=dtype)
    cold = state0[0].numel() * state0.element_size() * c * 2  # one column per row read, one slot written
    nc = M.n_copies(cold) if copies is None else copies
    cols = [M.randn((c, kk, *per_slot), gen, dtype=dtype) for _ in range(nc)]
    states = [state0.clone() for _ in range(nc)]
    accepted = torch.zeros(c, dtype=torch.int32, device=M.dev())
    slots = torch.arange(c, dtype=torch.int32, device=M.dev()).repeat_interleave(w)

    def make(route, params, i):
        fn = route.load_launcher()
        a = dict(state=states[i], columns=cols[i], accepted=accepted, slots=slots)
        return lambda: M.call_launcher(fn, a, params)

    def check(route, params):
        states[0].copy_(state0)
        make(route, params, 0)()
        M.sync()
        want = M.ref_call(route, state0, cols[0], accepted, slots)
        return M.rel_rms(states[0], want)

    return M.Bench(case, t, ctx, cold, nc, make, check, [states, cols])


TUNE = (
    TuneSpec(family="state_select", order=145, group="gdn",
             builder="ninfer_compile.kernels.spec_state.tune:build_state_select",
             candidates=state_select_candidates, variant=state_select_variant,
             doc="cold operands: each row's accepted column (read) and its slot's state (written); one case "
                 "per state shape and dtype (variant)"),
)
