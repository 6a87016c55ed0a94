"""Prompt-lookup drafting: propose the continuation of the most recent earlier occurrence of the
sequence's last n tokens (n from `max_ngram` down to `min_ngram`; the longest match wins).

No weights, any artifact: strong where the output repeats its context (code edits, summaries, agent
loops). The index is incremental: `extend()` adds each new token's n-grams once, so a proposal costs
O(max_ngram) dictionary lookups regardless of the sequence length.
"""

from __future__ import annotations


class NgramDrafter:
    """One sequence's n-gram index. `propose(k)` returns up to k draft tokens (possibly none)."""

    def __init__(self, tokens: list[int] | None = None, *, max_ngram: int = 4, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        # n-gram (tuple) -> end index (exclusive) of its most recent occurrence whose continuation is known,
        # i.e. an occurrence that is not the sequence's current suffix
        self._last: dict[tuple[int, ...], int] = {}
        self._pending: list[tuple[tuple[int, ...], int]] = []  # suffix n-grams not yet followed by a token
        self.extend(tokens or [])

    def extend(self, new_tokens) -> None:
        for tok in new_tokens:
            # the suffix n-grams of the sequence so far are now followed by `tok`: they become lookups
            for gram, end in self._pending:
                self._last[gram] = end
            self.tokens.append(int(tok))
            end = len(self.tokens)
            self._pending = [(tuple(self.tokens[end - n:end]), end)
                             for n in range(self.min_ngram, self.max_ngram + 1) if n <= end]

    def propose(self, k: int) -> list[int]:
        if k <= 0:
            return []
        toks = self.tokens
        for n in range(min(self.max_ngram, len(toks)), self.min_ngram - 1, -1):
            end = self._last.get(tuple(toks[len(toks) - n:]))
            if end is not None:
                return toks[end:end + k]
        return []
