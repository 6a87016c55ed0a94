"""The end-to-end greedy oracle: every generated token must be the fp32 reference's argmax for its
prefix, or a near-tie: its reference logit within `NEAR_TIE` (2%) of that row's logit spread
(max - min) below the max. `judge_greedy` gives one `Verdict` per token (exact, near-tie or
violation), so the tests can assert on the violations and bench/exactness_counts.py can count all
three."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

NEAR_TIE = 0.02
EXACT, NEAR, VIOLATION = "exact", "near_tie", "violation"


@dataclass(frozen=True)
class Verdict:
    """Token `step` of a generation: `token`, the reference's `argmax`, their logit gap (0 when
    exact), the row's spread and the class (EXACT, NEAR or VIOLATION)."""

    step: int
    token: int
    argmax: int
    token_logit: float
    argmax_logit: float
    spread: float
    kind: str

    @property
    def gap(self) -> float:
        return self.argmax_logit - self.token_logit

    def describe(self) -> str:
        return (f"step {self.step}: got {self.token} ({self.token_logit:.4f}), reference argmax {self.argmax} "
                f"({self.argmax_logit:.4f}), spread {self.spread:.4f}")


def judge_greedy(logits_fn: Callable, prompt: Sequence[int], generated: Sequence[int],
                 tie: float = NEAR_TIE) -> list[Verdict]:
    """One `Verdict` per token of `generated`. `logits_fn(tokens)` -> the reference's teacher-forced
    logits [len(tokens), V] (row i predicts token i + 1); it is called once, on prompt + generated[:-1]."""
    if not prompt:
        raise ValueError("judge_greedy needs a non-empty prompt (the first token's row is its last)")
    generated = [int(t) for t in generated]
    if not generated:
        return []
    ref = logits_fn(list(prompt) + generated[:-1])
    out = []
    for i, tok in enumerate(generated):
        row = ref[len(prompt) - 1 + i]
        top = int(row.argmax())
        hi, spread = float(row[top]), float(row.max() - row.min())
        got = float(row[tok])
        kind = EXACT if tok == top else NEAR if hi - got <= tie * spread else VIOLATION
        out.append(Verdict(i, tok, top, got, hi, spread, kind))
    return out
