"""Sliding windows and scoring of `ninfer-run --perplexity` (ninfer_runtime/perplexity.py), with
fake scorers: no plan, no kernels."""

from __future__ import annotations

import math

import pytest
import torch

from ninfer_runtime.errors import NinferRuntimeError
from ninfer_runtime.perplexity import check_plan, perplexity_of_ids, score_windows


@pytest.mark.parametrize("n,context,stride", [(2, 2, 1), (10, 4, 2), (10, 4, 3), (11, 5, 1), (7, 32, 16),
                                              (100, 16, 8), (33, 32, 31)])
def test_windows_score_every_token_after_the_first_once(n, context, stride):
    wins = score_windows(n, context, stride)
    scored = [t for w in wins for t in range(w.first_target, w.end)]
    assert scored == list(range(1, n))
    for i, w in enumerate(wins):
        assert w.end - w.begin <= context
        assert w.begin < w.first_target <= w.end
        history = w.first_target - w.begin
        # every window after the first gives each scored token >= context - stride tokens of history
        assert i == 0 or history >= context - stride
    assert wins[-1].end == n


@pytest.mark.parametrize("n,context,stride,msg", [(1, 8, 4, "at least 2"), (10, 1, 1, "--ppl-context"),
                                                  (10, 8, 8, "--ppl-stride"), (10, 8, 0, "--ppl-stride")])
def test_windows_reject_bad_arguments(n, context, stride, msg):
    with pytest.raises(ValueError, match=msg):
        score_windows(n, context, stride)


def test_uniform_scorer_gives_the_vocabulary_size():
    V = 37
    res = perplexity_of_ids(lambda toks: torch.zeros(len(toks), V), list(range(20)), 8, 3)
    assert res.scored == 19
    assert res.perplexity == pytest.approx(V, rel=1e-6)


def test_each_window_scores_with_its_own_history():
    """A scorer that is sure of token i+1 only when it has seen >= 3 tokens of history: with context
    8 and stride 4 every token after the third window start still has >= 4 tokens of history."""
    V = 50
    ids = [(7 * i + 3) % V for i in range(30)]

    def scorer(toks):
        out = torch.zeros(len(toks), V)
        for j in range(len(toks)):
            if j >= 2:  # position j has seen j+1 tokens of this window
                nxt = ids[ids.index(toks[0]) + j + 1] if ids.index(toks[0]) + j + 1 < len(ids) else 0
                out[j, nxt] = 30.0
        return out

    res = perplexity_of_ids(scorer, ids, 8, 4)
    # only the first window's targets 1 and 2 lack history: 2 tokens at ppl V, 27 near-certain
    expected = math.exp((2 * math.log(V)) / 29)
    assert res.perplexity == pytest.approx(expected, rel=1e-3)
    assert res.line() == f"perplexity {res.perplexity:.4f} over 29 scored tokens"


def test_plan_without_all_position_logits_is_refused_naming_the_option():
    with pytest.raises(NinferRuntimeError, match="--prefill-logits all"):
        check_plan({"options": {"prefill_logits": "last"}})
    check_plan({"options": {"prefill_logits": "all"}})
