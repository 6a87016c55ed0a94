"""A speculative stand-in for `EngineAdapter` (tests/serve/fake_engine.py's toy model plus an MTP-like
drafter with per-slot device state), for the scheduler's speculative paths at request counts the
interpreter cannot afford.

The toy MTP head: per slot a row per position p holding the token that FOLLOWED p when the row
was written (as the real MTP KV row p pairs the target's hidden state at p with the token at p+1).
A round asserts that the row before its first column holds the round's t0: a restored snapshot whose
MTP rows came from a different continuation fails there. Drafts: the target's true continuation for
the first `accept_of(position)` drafts, then wrong tokens; the target accepts the longest correct
prefix, consumes t0 + the accepted drafts (positions p..p+a, as the rollback leaves them) and emits
the accepted drafts plus its own next token.
"""

from __future__ import annotations

import torch

from ninfer_runtime.steps import StateSnapshot, StepOut

from .fake_engine import V, FakeAdapter, _mix, _next


class FakeSpecAdapter(FakeAdapter):
    spec_mode = "mtp"
    speculative = True

    def __init__(self, k: int = 3, accept_of=lambda pos: pos % 4, mode: str = "mtp", **kw):
        super().__init__(**kw)
        self.spec_mode = mode  # "ngram": a host drafter, no MTP rows (snapshots keyed as without speculation)
        self.draft_tokens = k
        self.accept_of = accept_of
        self.mtp = [[-1] * self.max_context for _ in range(self.slots)]
        self.lanes: dict[int, list[int]] = {}
        self.rounds = 0
        self.released: list[int] = []

    def reset(self, slot):
        super().reset(slot)
        self.mtp[slot] = [-1] * self.max_context

    def snapshot(self, slot, length, logits):
        s = super().snapshot(slot, length, logits)
        s.tensors["mtp"] = torch.tensor(self.mtp[slot][:length], dtype=torch.int64)
        return StateSnapshot(length, s.tensors, s.logits, s.nbytes + 8 * length)

    def restore(self, slot, snap):
        super().restore(slot, snap)
        m = snap.tensors["mtp"].tolist()
        self.mtp[slot][:len(m)] = m

    def prefill(self, slot, chunk, start, sampler=None, *, final=True, next_token=None):
        row, tok = super().prefill(slot, chunk, start, sampler, final=final)
        if self.spec_mode != "mtp":  # no MTP rows: the follower is not used
            return row, tok
        assert (next_token is None) == final, "the MTP chunk's follower: the next prompt token inside the prompt"
        follow = list(chunk[1:]) + [next_token if next_token is not None else tok]
        assert follow[-1] is not None, "a non-final MTP chunk needs the next prompt token"
        for i, f in enumerate(follow):
            self.mtp[slot][start + i] = int(f)
        return row, tok

    def start_lane(self, slot, prompt, first, sampler):
        assert slot not in self.lanes, f"slot {slot} already has a lane"
        self.lanes[slot] = list(prompt) + [int(first)]

    def release(self, slot):
        self.lanes.pop(slot)
        self.released.append(slot)

    def step(self, columns, busy, samplers):
        self.gate.wait(30)
        self.rounds += 1
        self.calls.append(("round", len(columns)))
        out = []
        k = self.draft_tokens
        for t0, p, slot in columns:
            assert slot in self.lanes and self.lanes[slot][-1] == t0
            if self.spec_mode == "mtp":
                assert self.mtp[slot][p - 1] == t0, \
                    f"slot {slot}: MTP row {p - 1} pairs with {self.mtp[slot][p - 1]}, not t0 {t0}"
            # the true continuation after t0 (what the target would emit)
            h, truth = self.h[slot], []
            hh = _mix(h, t0, p)
            for j in range(k + 1):
                truth.append(_next(hh))
                hh = _mix(hh, truth[-1], p + j + 1)
            n_right = min(k, self.accept_of(p))
            drafts = truth[:n_right] + [(t + 1) % V for t in truth[n_right:k]]
            a = 0
            while a < k and drafts[a] == truth[a]:
                a += 1
            self._feed(slot, t0, p)
            for j in range(a):
                self._feed(slot, drafts[j], p + 1 + j)
            emitted = truth[:a + 1]
            for j, tok in enumerate(emitted):  # MTP rows p..p+a pair with the token after them
                self.mtp[slot][p + j] = tok
            self.lanes[slot] += emitted
            row = torch.zeros(V)
            row[emitted[-1]] = 1.0
            out.append(StepOut(emitted, k, a, True, last_row=row))
        return out
