"""Speculative decoding: drafters (what to propose) and acceptance (what the target keeps).

A round for one slot: the last accepted token plus K draft tokens form K+1 verify columns; the target's
logits at column j give its distribution for the token after columns 0..j. Acceptance keeps the longest
draft prefix the target agrees with and appends one token of the target's own (the correction at the
first rejection, or the bonus after K accepted drafts), so every round emits 1..K+1 tokens.
"""

from .accept import RoundOutcome, greedy_accept, speculative_accept
from .ngram import NgramDrafter

__all__ = ["NgramDrafter", "RoundOutcome", "greedy_accept", "speculative_accept"]
