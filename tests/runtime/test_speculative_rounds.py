"""Speculative rounds (speculative/rounds.py + generate's spec=) on a fake engine (spec_fake.py): the
plan's extent names / shapes in one shared arena, computed by the float32 reference model of the
trained tiny model (examples/tiny-trained, which has an MTP head). No compiled plan, no kernels:
this checks the round protocol of docs/SPECULATIVE.md (column layout, emission, MTP ids shift and
hidden rows, chained drafts, index copies through engine buffers, plain steps near the context
end); tests/runtime/test_speculative_e2e.py runs the same on compiled plans."""

from __future__ import annotations

import pytest
import torch

from ninfer_runtime.generate import generate
from ninfer_runtime.speculative import NgramDrafter

from .spec_fake import FakeEngine

PROMPTS = [[5, 17, 99, 23, 5, 17, 99, 23, 5, 17], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 40, 41, 42]]
N_NEW = 14


@pytest.fixture(scope="module")
def model():
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import Qwen3_5TextConfig

    from ninfer_compile.convert.hf import convert_state_dict
    from ninfer_compile.reference import ReferenceModel
    from ninfer_compile.reference.weights import DictWeights
    from reference.hf_tiny import spec_for

    ckpt = Path(__file__).resolve().parents[2] / "examples" / "tiny-trained"
    cfg = Qwen3_5TextConfig.from_pretrained(str(ckpt))
    tensors = convert_state_dict(cfg.to_dict(), load_file(str(ckpt / "model.safetensors")))
    return ReferenceModel(spec_for(cfg, mtp=True), DictWeights(tensors))


def _prompts(model, c):
    V = model.dims.vocab_rows
    return [[t % V for t in p] for p in PROMPTS[:c]]


@pytest.fixture(scope="module")
def plain(model):
    """spec none outputs per C (the fake's plain decode steps)."""
    out = {}
    for c in (1, 2):
        eng = FakeEngine(model, k=1)
        res = generate(eng, _prompts(model, c), N_NEW, spec="none", ignore_eos=True, concurrency=c)
        assert not eng.violations
        out[c] = [r.tokens for r in res]
    return out


class Oracle:
    """Proposes the true greedy continuation (or, wrong=True, a token that is never it)."""

    def __init__(self, prompt, truth, V, wrong=False):
        self.seq, self.truth, self.V, self.wrong = list(prompt), truth, V, wrong
        self.n0 = len(prompt)

    def extend(self, toks):
        self.seq += list(toks)

    def propose(self, k):
        i = len(self.seq) - self.n0
        nxt = self.truth[i:i + k]
        return [(t + 1) % self.V for t in nxt] if self.wrong else nxt


def _oracle_factory(model, prompts, truths, wrong=False):
    def make(prompt):
        return Oracle(prompt, truths[prompts.index(prompt)], model.dims.vocab_rows, wrong)
    return make


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("c", [1, 2])
def test_mtp_rounds_match_plain(model, plain, k, c):
    eng = FakeEngine(model, k=k)
    res = generate(eng, _prompts(model, c), N_NEW, ignore_eos=True, concurrency=c)  # spec None -> mtp
    assert not eng.violations, eng.violations[:3]
    assert [r.tokens for r in res] == plain[c]
    sp = eng.last_stats["spec"]
    assert sp["mode"] == "mtp" and sp["k"] == k and sp["rounds"] >= 1
    assert sp["proposed"] == k * sp["lane_rounds"] and 0 <= sp["accepted"] <= sp["proposed"]
    assert sum(len(r.tokens) for r in res) == eng.last_stats["decode_tokens"] + c
    assert any(n.startswith("mtp_verify") for n in eng.runs) and any(n.startswith("verify_c") for n in eng.runs)
    assert sp["accepted"] > 0  # the trained MTP head drafts something right


def test_mtp_drafts_are_the_heads_chain(model):
    """Every verify row's drafts = the MTP head's greedy chain over the committed prefix: columns
    q < P pair the token at q+1 with the target's hidden at q (bf16, as the buffers hold it); drafts
    2..K continue from the previous draft and the previous MTP hidden row."""
    k = 3
    eng = FakeEngine(model, k=k)
    prompt = _prompts(model, 1)[0]
    r = generate(eng, prompt, N_NEW, ignore_eos=True)
    seq = prompt + r.tokens
    head = model.weights.output_head
    seen = [(s, p, d) for s, p, d in eng.drafts_seen if s == 0]
    assert seen
    for _, P, drafts in seen:
        with torch.no_grad():
            model.prefill(seq[:P])
            th = model.last_state.hidden.to(torch.bfloat16).float()  # [P, H]
            ids, hid = list(seq[1:P + 1]), th
            for i in range(k):
                x = model.mtp.hidden(ids, hid)
                row = (x[-1] @ head.T).to(torch.bfloat16).float()
                d = int(row.argmax())
                if drafts[i] != d:  # a near-tie only (the fake's hidden rows come from longer prefixes)
                    assert float(row[d] - row[drafts[i]]) <= 0.02 * float(row.max() - row.min()), (P, i, drafts, d)
                    break
                ids, hid = ids + [d], torch.cat([hid, x[-1:].to(torch.bfloat16).float()])


@pytest.mark.parametrize("k,c", [(1, 1), (3, 2), (5, 1)])
def test_ngram_rounds_match_plain(model, plain, k, c):
    eng = FakeEngine(model, k=k, mtp=False)
    res = generate(eng, _prompts(model, c), N_NEW, spec="ngram", ignore_eos=True, concurrency=c)
    assert not eng.violations
    assert [r.tokens for r in res] == plain[c]
    sp = eng.last_stats["spec"]
    assert sp["mode"] == "ngram" and sp["proposed"] > 0
    assert not any(n.startswith("mtp_") for n in eng.runs)


@pytest.mark.parametrize("k,c", [(3, 1), (5, 2)])
def test_oracle_and_wrong_drafters(model, plain, k, c):
    prompts = _prompts(model, c)
    for wrong in (False, True):
        eng = FakeEngine(model, k=k, mtp=False)
        res = generate(eng, prompts, N_NEW, spec=_oracle_factory(model, prompts, plain[c], wrong),
                       ignore_eos=True, concurrency=c)
        assert [r.tokens for r in res] == plain[c]
        sp = eng.last_stats["spec"]
        assert sp["mode"] == "custom" and sp["proposed"] > 0
        if wrong:
            assert sp["accepted"] == 0 and sp["tokens"] == sp["lane_rounds"]
        else:
            assert sp["accepted"] == sp["proposed"]
            assert sp["tokens"] == sum(len(r.tokens) - 1 for r in res)


def test_plain_steps_near_the_context_end(model):
    """max_context 18, prompt 10, K=5: a lane with fewer than W positions left (from position 13)
    takes plain steps; the output still equals the plain run's and stops when prompt + completion
    fill the context ("length", 8 tokens, well short of max tokens 40)."""
    prompt = _prompts(model, 1)[0]
    eng = FakeEngine(model, k=5, max_context=18)
    r = generate(eng, prompt, 40, ignore_eos=True)
    ref = FakeEngine(model, k=5, max_context=18)
    p = generate(ref, prompt, 40, spec="none", ignore_eos=True)
    assert r.tokens == p.tokens and r.finish_reason == p.finish_reason == "length"
    assert len(r.tokens) == 18 - len(prompt)
    assert eng.last_stats["spec"]["plain_steps"] >= 1 and not eng.violations


def test_stop_id_cuts_a_round(model, plain):
    prompt = _prompts(model, 1)[0]
    truth = plain[1][0]
    stop = truth[5]
    first = truth.index(stop)
    eng = FakeEngine(model, k=5, mtp=False)
    r = generate(eng, prompt, N_NEW, spec=_oracle_factory(model, [prompt], [truth]), stop_ids=[stop])
    assert r.tokens == truth[:first + 1] and r.finish_reason == "stop"
    eng = FakeEngine(model, k=5, mtp=False)
    r = generate(eng, prompt, 4, spec=_oracle_factory(model, [prompt], [truth]), ignore_eos=True)
    assert r.tokens == truth[:4] and r.finish_reason == "length"


def test_return_logits_rows(model, plain):
    eng = FakeEngine(model, k=3)
    prompt = _prompts(model, 1)[0]
    r = generate(eng, prompt, 6, ignore_eos=True, return_logits=True)
    assert len(r.logits) == len(r.tokens) == 6
    assert [int(x.argmax()) for x in r.logits] == r.tokens


def test_spec_argument_errors(model):
    eng = FakeEngine(model, k=3, mtp=False)
    with pytest.raises(ValueError, match="--spec mtp needs MTP draft extents"):
        generate(eng, [1, 2, 3], 2, spec="mtp")
    with pytest.raises(ValueError, match="spec must be one of"):
        generate(eng, [1, 2, 3], 2, spec="eagle")
    assert generate(eng, [1, 2, 3], 2, ignore_eos=True).tokens  # default: none without MTP extents
    assert "spec" not in eng.last_stats
    eng0 = FakeEngine(model, k=3)
    eng0.draft_tokens, eng0.verify_runners, eng0.has_mtp_drafts = 0, [], False
    for spec in ("mtp", "ngram", NgramDrafter):
        with pytest.raises(ValueError, match="needs a plan compiled with --draft-tokens"):
            generate(eng0, [1, 2, 3], 2, spec=spec)
