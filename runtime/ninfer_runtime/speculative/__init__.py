"""Speculative decoding: drafters (what to propose).

A round for one slot: the last accepted token plus K draft tokens form K+1 verify columns; the target's
logits at column j give its distribution for the token after columns 0..j. Acceptance (on the device,
inside the verify extent: the compiler's `spec_accept` family) keeps the longest draft prefix the target
agrees with and appends one token of the target's own (the correction at the first rejection, or the
bonus after K accepted drafts), so every round emits 1..K+1 tokens.
"""

from .ngram import NgramDrafter

__all__ = ["NgramDrafter"]
