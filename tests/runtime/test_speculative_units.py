"""The n-gram drafter of speculative decoding (pure Python, CPU). The acceptance rule runs on the
device (kernels/spec_accept; its tests: tests/kernels/spec_accept)."""

from __future__ import annotations

import pytest

from ninfer_runtime.speculative import NgramDrafter


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
