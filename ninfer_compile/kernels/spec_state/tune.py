"""The state_select family's tuner share (`kernels/tuning.py`): the bench builder (the rollback copy
of one verify round) and its param candidates; it joins the `--families gdn` group (it rolls back
the GDN recurrent and conv states). No torch / triton at module level (the builder imports them)."""

from __future__ import annotations

from ninfer_compile.kernels.tuning import TuneSpec


def state_select_candidates(route, t: int, quick: bool) -> list[dict]:
    return [{}, {"BLOCK": 2048}, {"BLOCK": 4096, "num_warps": 8}, {"BLOCK": 512}, {"num_warps": 8},
            {"BLOCK": 2048, "num_warps": 8}]


def build_state_select(case, t: int, ctx: int | None, copies: int | None, seed: int = 0):
    """Operands of one state_select at T slot entries (T = C * (K+1), rounded up to whole rows):
    every row rolls back (accepted = 0: the most a round copies); the columns are the cold operand."""
    import torch

    from ninfer_compile.tune import measure as M

    st = tuple(case.shapes["state"])  # [slots, *S]
    cs = tuple(case.shapes["columns"])  # [C, K, *S]
    kk = int(cs[1])
    w = kk + 1
    c = -(-t // w)
    per_slot = st[1:]
    # the match does not pin a dtype: the GDN recurrent state [slots, Hv, Dk, Dv] is f32, the conv state bf16
    dtype = torch.float32 if len(st) == 4 else torch.bfloat16
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
             candidates=state_select_candidates,
             doc="cold operands: each row's accepted column (read) and its slot's state (written)"),
)
