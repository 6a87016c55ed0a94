"""Drafter and acceptance rules of speculative decoding (pure torch, CPU)."""

from __future__ import annotations

import pytest
import torch

from ninfer_runtime.speculative import NgramDrafter, greedy_accept, speculative_accept
from ninfer_runtime.speculative.accept import _draw


# ------------------------------------------------------------------------------ n-gram drafter

def test_ngram_proposes_the_continuation_of_the_latest_longest_match():
    d = NgramDrafter([5, 1, 2, 3, 9, 1, 2, 3, 4, 7, 1, 2, 3], max_ngram=3)
    # "1 2 3" occurred twice before; the latest is followed by 4 7
    assert d.propose(2) == [4, 7]
    assert d.propose(8) == [4, 7, 1, 2, 3]  # up to the end of the known continuation


def test_ngram_prefers_the_longer_match_over_a_more_recent_shorter_one():
    # last tokens "8 3": the 2-gram "8 3" occurred at the start (-> 6); a more recent 1-gram "3" -> 0
    d = NgramDrafter([8, 3, 6, 3, 0, 8, 3], max_ngram=2)
    assert d.propose(1) == [6]


def test_ngram_without_match_proposes_nothing_and_k0_is_empty():
    d = NgramDrafter([1, 2, 3, 4])
    assert d.propose(3) == []
    assert NgramDrafter([1, 1, 1]).propose(0) == []


def test_ngram_incremental_extend_equals_building_at_once():
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9]
    inc = NgramDrafter(max_ngram=3)
    for i, tok in enumerate(seq):
        inc.extend([tok])
        whole = NgramDrafter(seq[:i + 1], max_ngram=3)
        assert inc.propose(4) == whole.propose(4), i


def test_ngram_current_suffix_is_never_its_own_match():
    d = NgramDrafter([7, 7])  # the 1-gram "7" ending at 1 is followed by 7; the suffix itself is not a match
    assert d.propose(3) == [7]
    with pytest.raises(ValueError):
        NgramDrafter(max_ngram=1, min_ngram=2)


# ------------------------------------------------------------------------------ greedy acceptance

def test_greedy_accept_prefix_correction_and_bonus():
    drafts = torch.tensor([[4, 5, 6], [4, 9, 6], [1, 5, 6], [4, 5, 6]])
    target = torch.tensor([[4, 5, 6, 8], [4, 5, 6, 8], [4, 5, 6, 8], [4, 5, 6, 8]])
    out = greedy_accept(drafts, target, n_valid=torch.tensor([3, 3, 3, 2]))
    assert out.accepted.tolist() == [3, 1, 0, 2]
    assert out.next_token.tolist() == [8, 5, 4, 6]
    assert out.tokens(drafts) == [[4, 5, 6, 8], [4, 5], [4], [4, 5, 6]]


def test_greedy_accept_refuses_misshapen_targets():
    with pytest.raises(ValueError):
        greedy_accept(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))


# ------------------------------------------------------------------------------ speculative sampling

def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def _rounds(p: torch.Tensor, drafts_row: list[int], n: int, seed: int, accept=speculative_accept):
    """n independent rounds of one slot against a context-free target (column j ~ p[j])."""
    K = len(drafts_row)
    g = torch.Generator().manual_seed(seed)
    drafts = torch.tensor([drafts_row] * n)
    probs = p[None].expand(n, K + 1, p.shape[-1]).contiguous()
    u1 = torch.rand(n, K + 1, generator=g, dtype=torch.float64)
    u2 = torch.rand(n, K + 1, generator=g, dtype=torch.float64)
    return drafts, accept(drafts, probs, u1, u2)


TOL = 0.02  # total variation; with 40k rounds the sampling error is ~0.006


def _check(p, drafts_row, out, drafts):
    V = p.shape[-1]
    first = torch.where(out.accepted > 0, drafts[:, 0], out.next_token)
    tv0 = _tv(torch.bincount(first, minlength=V).double(), p[0])
    # x1 exists when d0 was accepted; given x0 = d0 it must follow p[1] (context-free target)
    sel = out.accepted >= 1
    second = torch.where(out.accepted[sel] > 1, drafts[sel, 1], out.next_token[sel])
    tv1 = _tv(torch.bincount(second, minlength=V).double(), p[1])
    return tv0, tv1


def test_speculative_sampling_emits_the_target_distribution():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(4, 6, dtype=torch.float64) * 1.5, -1)  # K = 3, V = 6
    drafts_row = [int(p[0].argmax()), int(p[1].argmin()), 2]
    drafts, out = _rounds(p, drafts_row, 40_000, seed=1)
    tv0, tv1 = _check(p, drafts_row, out, drafts)
    assert tv0 < TOL and tv1 < TOL, (tv0, tv1)
    # acceptance of the first draft happens with probability p0(d0)
    assert abs(float((out.accepted >= 1).double().mean()) - float(p[0, drafts_row[0]])) < 0.015


def test_the_distribution_check_catches_a_biased_rule():
    """Negative control: resampling from p itself after a rejection (not the residual) over-weights
    the rejected draft; the same check must fail it."""

    def biased(drafts, probs, u1, u2, n_valid=None):
        B, K = drafts.shape
        ok = u1[:, :K] < torch.gather(probs[:, :K], 2, drafts[:, :, None])[:, :, 0]
        acc = torch.cumprod(ok.to(torch.int32), 1).sum(1)
        rows = probs[torch.arange(B), acc]
        return type(speculative_accept(drafts[:1], probs[:1], u1[:1], u2[:1]))(acc, _draw(rows, u2[torch.arange(B), acc]))

    torch.manual_seed(0)
    p = torch.softmax(torch.randn(4, 6, dtype=torch.float64) * 1.5, -1)
    drafts_row = [int(p[0].argmax()), int(p[1].argmin()), 2]
    drafts, out = _rounds(p, drafts_row, 40_000, seed=1, accept=biased)
    tv0, _ = _check(p, drafts_row, out, drafts)
    assert tv0 > 2 * TOL


def test_speculative_sampling_with_fewer_valid_drafts_samples_normally_at_the_cut():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]], dtype=torch.float64)
    drafts = torch.tensor([[0, 2]] * 20_000)
    g = torch.Generator().manual_seed(3)
    u1 = torch.rand(20_000, 3, generator=g, dtype=torch.float64)
    u2 = torch.rand(20_000, 3, generator=g, dtype=torch.float64)
    out = speculative_accept(drafts, p[None].expand(20_000, 3, 3), u1, u2, n_valid=torch.full((20_000,), 1))
    assert int(out.accepted.max()) <= 1
    # after an accepted d0 = 0, the cut column samples p[1] itself (draft 2 is not real: nothing removed)
    sel = out.accepted == 1
    assert _tv(torch.bincount(out.next_token[sel], minlength=3).double(), p[1]) < TOL


def test_speculative_sampling_is_a_function_of_its_uniforms():
    p = torch.softmax(torch.randn(2, 3, 5, dtype=torch.float64), -1)
    d = torch.tensor([[1, 2], [3, 0]])
    u1, u2 = torch.rand(2, 3, dtype=torch.float64), torch.rand(2, 3, dtype=torch.float64)
    a, b = speculative_accept(d, p, u1, u2), speculative_accept(d, p, u1, u2)
    assert torch.equal(a.accepted, b.accepted) and torch.equal(a.next_token, b.next_token)
    # slot 1's outcome does not depend on slot 0's inputs
    c = speculative_accept(d[1:], p[1:], u1[1:], u2[1:])
    assert int(c.accepted[0]) == int(a.accepted[1]) and int(c.next_token[0]) == int(a.next_token[1])
