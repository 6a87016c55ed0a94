"""The verify graph (docs/SPECULATIVE.md) under the IR executor on a random tiny model: one verify
round after prefill accepts exactly the drafts the target would have chosen, emits the target's tokens,
and leaves the GDN recurrent / conv state as a plain run over the accepted tokens would; the MTP
graphs' logits match reference/mtp.py on the same columns."""

from __future__ import annotations

import pytest
import torch

from compile.support import tiny_artifact
from ninfer_compile.artifact import Artifact
from ninfer_compile.contracts import check_artifact, find_contract
from ninfer_compile.ir.execute import ExecState, Executor, step_inputs
from ninfer_compile.ir.lower import LowerOptions, lower
from ninfer_compile.ir.types import Extent
from ninfer_compile.reference.model import ReferenceModel
from ninfer_compile.reference.weights import ArtifactWeights

PROMPTS = ([5, 17, 3, 99, 250], [7, 64, 12, 1, 33, 8, 120])  # rows at different positions


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_artifact(tmp_path_factory.mktemp("art") / "tiny.ninfer")
    art = Artifact.open(path)
    spec = find_contract(path, art.model_id).resolve_for(art)
    check_artifact(art, spec)
    weights = ArtifactWeights(art)
    yield art, spec, weights, ReferenceModel(spec, weights)
    art.close()


_GREEDY: dict = {}
MAX_K = 3


def _greedy(ref, prompt):
    """The reference's greedy run after `prompt` (cached per prompt): (cont = t0, d1..d_MAX_K, bonus,
    logits [len(prompt) + MAX_K + 1, V] of every position of prompt + cont[:-1])."""
    key = tuple(prompt)
    if key not in _GREEDY:
        st = ref.new_state()
        logits = [ref.prefill(list(prompt), st)]
        cont = []
        for _ in range(MAX_K + 2):
            cont.append(int(logits[-1][-1].argmax()))
            if len(cont) < MAX_K + 2:
                logits.append(ref.decode(cont[-1], st)[None])
        _GREEDY[key] = (cont, torch.cat(logits))
    return _GREEDY[key]


def _opts(c, k, **kw):
    return LowerOptions(prefill_chunk=16, concurrency=(c,), draft_tokens=k, max_context=32, **kw)


def _prefill(ex, spec, opts, tokens, slot, st, graph="text", **extra):
    """Run one sequence's columns through a prefill graph of exactly their length."""
    g = lower(spec, Extent(name=f"{graph}_prefill_t{len(tokens)}", graph=graph, phase="prefill", t=len(tokens)), opts)
    return ex.run(g, step_inputs(g, tokens, slot=slot, **extra), st)


def _verify_inputs(g, rows, w):
    """rows: [(ids of the row's W columns, first position, slot, n_drafts)] -> the verify extent's inputs."""
    ids = torch.tensor([t for r in rows for t in r[0]], dtype=torch.int32)
    pos = torch.tensor([r[1] + j for r in rows for j in range(w)], dtype=torch.int32)
    slots = torch.tensor([r[2] for r in rows for _ in range(w)], dtype=torch.int32)
    T = ids.shape[0]
    inp = {"ids": ids, "positions": pos, "slots": slots,
           "temperature": torch.zeros(T), "top_k": torch.zeros(T, dtype=torch.int32), "top_p": torch.ones(T),
           "seed": torch.zeros(T, 2, dtype=torch.int32), "sample_pos": pos + 1}
    if "n_drafts" in g.tensors:
        inp["n_drafts"] = torch.tensor([r[3] for r in rows], dtype=torch.int32)
    return inp


def _gdn_buffers(st, slot):
    return {n: b[slot].clone() for n, b in st.buffers.items() if n.startswith("gdn/")}


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("c, mode", [(1, "right"), (1, "wrong"), (2, "mixed")])
def test_verify_round_accepts_the_targets_drafts_and_rolls_back(tiny, c, k, mode):
    """right: the drafts are the target's greedy continuation (accepted = K, tokens = the target's);
    wrong: every draft differs (accepted = 0, tokens[0] = the target's next token); mixed: row 0 right,
    row 1 wrong, at different positions."""
    art, spec, weights, ref = tiny
    V = spec.dims["vocab_rows"]
    w = k + 1
    opts = _opts(c, k, mtp=False)
    ex = Executor(weights)
    st = ExecState.zeros([lower(spec, Extent(name="verify", phase="verify", t=c * w, concurrency=c,
                                             draft_tokens=k), opts)])
    rows, want = [], []
    for r in range(c):
        prompt = PROMPTS[r]
        cont, ref_logits = _greedy(ref, prompt)  # t0, d1..dK, bonus
        t0, good = cont[0], cont[1:w]
        right = mode == "right" or (mode == "mixed" and r == 0)
        drafts = good if right else [(d + 1) % V for d in good]
        _prefill(ex, spec, opts, prompt, r, st)  # the prompt consumed; t0 not yet
        rows.append(([t0, *drafts], len(prompt), r, k))
        acc = k if right else 0
        want.append((acc, cont[1:acc + 2], prompt + [t0] + drafts[:acc], ref_logits[len(prompt):len(prompt) + w]))
    g = lower(spec, Extent(name=f"verify_c{c}_k{k}", phase="verify", t=c * w, concurrency=c, draft_tokens=k), opts)
    out = ex.run(g, _verify_inputs(g, rows, w), st)
    assert out["accepted"].tolist() == [x[0] for x in want]
    for r, (acc, toks, consumed, ref_logits) in enumerate(want):
        # row r emits tokens[r*W .. r*W + accepted]: the accepted drafts, then the target's own token
        assert out["tokens"][r * w:r * w + acc + 1].tolist() == toks
        if acc == k:  # logits of every column = the target's at that position (its columns = the greedy run)
            torch.testing.assert_close(out["logits"][r * w:(r + 1) * w], ref_logits, rtol=1e-4, atol=1e-4)
        else:  # column 0 (t0) is the same whatever the drafts
            torch.testing.assert_close(out["logits"][r * w], ref_logits[0], rtol=1e-4, atol=1e-4)
        # after the round: GDN recurrent + conv state as if only the accepted tokens were consumed
        plain = ExecState.zeros([g])
        _prefill(ex, spec, opts, consumed, r, plain)
        got, exp = _gdn_buffers(st, r), _gdn_buffers(plain, r)
        assert set(got) == set(exp) and len(got) == 2 * spec.layer_kinds.count("gdn")
        for name in exp:
            torch.testing.assert_close(got[name], exp[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("head", ["full", "shortlist"])
def test_mtp_verify_graph_matches_reference(tiny, head):
    """MTP prefill over the prompt, then the shifted pass over one verify row's W columns (ids = the
    tokens at p + j + 1, hidden = the target's at p + j): logits as reference/mtp.py's."""
    art, spec, weights, ref = tiny
    k, w = 3, 4
    prompt = PROMPTS[1]
    L = len(prompt)
    seq = prompt + _greedy(ref, prompt)[0]  # prompt, t0, d1..dK, bonus
    ref.prefill(seq)
    hidden = ref.last_state.hidden  # [len(seq), H] the target's final-norm rows
    mtp = ref.mtp
    mstate = mtp.new_state()
    mtp.hidden(seq[1:L + 1], hidden[:L], mstate)
    h_ref = mtp.hidden(seq[L + 1:L + w + 1], hidden[L:L + w], mstate)  # [W, H]
    head_w = weights.get("text/output_head" if head == "full" else "text/draft_head").float()
    want_logits = h_ref @ head_w.T  # [W, V] or [W, draft_rows]
    opts = _opts(1, k, draft_head=head, prefill_logits="all")
    ex = Executor(weights)
    gv = lower(spec, Extent(name="mtp_verify_c1_k3", graph="mtp", phase="verify", t=w, draft_tokens=k), opts)
    st = ExecState.zeros([gv])
    _prefill(ex, spec, opts, seq[1:L + 1], 0, st, graph="mtp", hidden=hidden[:L])
    inp = _verify_inputs(gv, [(seq[L + 1:L + w + 1], L, 0, k)], w)
    out = ex.run(gv, {**inp, "hidden": hidden[L:L + w]}, st)
    torch.testing.assert_close(out["logits"], want_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["hidden"], h_ref, rtol=1e-4, atol=1e-4)
    rows = want_logits.argmax(-1)
    ids = rows if head == "full" else weights.get("text/draft_head_token_ids").long()[rows]
    assert out["ids"].tolist() == ids.tolist()  # greedy rows (shortlist: the row's token id through `take`)
