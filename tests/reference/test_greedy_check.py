"""The end-to-end greedy oracle (ninfer_compile.reference.greedy_check) and the reference's
quantized KV cache (ReferenceModel(kv_dtype=...)), both shared by the e2e tests and
bench/exactness_counts.py."""

import pytest
import torch

from ninfer_compile.kernels.kv_cache.reference import kv_roundtrip_fn
from ninfer_compile.reference import DictWeights, ReferenceModel
from ninfer_compile.reference.greedy_check import EXACT, NEAR, NEAR_TIE, VIOLATION, judge_greedy

from .hf_tiny import PROMPT


def test_judge_greedy_classes_and_the_two_percent_rule():
    # rows 1..3 predict the three generated tokens; each row's spread is 10 (min 0, max 10)
    rows = torch.zeros(4, 5)
    rows[1, 2], rows[1, 3] = 10.0, 1.0                  # token 2: the argmax
    rows[2, 0], rows[2, 4] = 10.0, 10.0 - 0.2           # token 4: 0.2 = 2% of the spread below
    rows[3, 1], rows[3, 3] = 10.0, 10.0 - 0.21          # token 3: 2.1% below
    calls = []

    def logits(tokens):
        calls.append(list(tokens))
        return rows

    got = judge_greedy(logits, [7, 8], [2, 4, 3])
    assert calls == [[7, 8, 2, 4]]
    assert [v.kind for v in got] == [EXACT, NEAR, VIOLATION]
    assert [v.argmax for v in got] == [2, 0, 1] and got[0].gap == 0
    assert got[2].gap == pytest.approx(0.21) and got[2].spread == pytest.approx(10.0)
    assert got[2].describe().startswith("step 2: got 3 (9.7900), reference argmax 1 (10.0000)")
    assert [v.kind for v in judge_greedy(logits, [7, 8], [2, 4, 3], tie=0.03)] == [EXACT, NEAR, NEAR]
    assert NEAR_TIE == 0.02 and judge_greedy(logits, [7], []) == []
    with pytest.raises(ValueError, match="non-empty prompt"):
        judge_greedy(logits, [], [1])


def test_reference_kv_dtype_stores_the_formats_rows(tiny_spec, tiny_tensors):
    """kv_dtype="fp8": the first attention layer's cache (its input is the fp32 model's) holds exactly
    kv_roundtrip_fn("fp8") of the fp32 model's rows (clones keep the format); the logits move, but little."""
    w = DictWeights(tiny_tensors)
    plain, fp8 = ReferenceModel(tiny_spec, w), ReferenceModel(tiny_spec, w, kv_dtype="fp8")
    with torch.no_grad():
        a, b = plain.prefill(PROMPT), fp8.prefill(PROMPT)
    fn = kv_roundtrip_fn("fp8")
    first = min(plain.last_state.kv)
    want, got = plain.last_state.kv[first], fp8.last_state.kv[first]
    assert torch.equal(got.k, fn(want.k, want.v)[0]) and torch.equal(got.v, fn(want.k, want.v)[1])
    assert not torch.equal(got.k, want.k) and want.roundtrip is None
    assert got.clone().roundtrip is got.roundtrip is not None
    assert not torch.equal(a, b) and float((a - b).norm() / a.norm()) < 0.05
