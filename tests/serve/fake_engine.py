"""A deterministic stand-in for `EngineAdapter` (the step API's primitives; admission, `admit_chunk`,
is the runtime's own `SlotSteps`), for the scheduler / HTTP tests that
need many requests: interpreter tokens cost seconds, these cost microseconds.

The toy model: a slot's state is a running hash of every (token, position) it was fed plus a KV-like
row of the tokens at their positions; the next token is a function of the hash, so a wrong restore,
a skipped or doubled column, or padding written into a busy slot changes the output. Text: one
character per token (ids 32..126 are ASCII; id 10 = newline is the stop id). `gate` (an Event)
holds every engine step while cleared, so tests fill the queue deterministically.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ninfer_runtime.steps import SlotSteps, StateSnapshot, StepOut

V = 128
STOP = 10
_M = (1 << 31) - 1


@dataclass
class _Sampler:
    seed: int
    temperature: float


class _Decoder:
    def __init__(self):
        self.sent = ""

    def push(self, tok: int) -> str:
        ch = chr(tok) if 32 <= tok < 127 else ""
        self.sent += ch
        return ch

    def flush(self) -> str:
        return ""


def _mix(h: int, tok: int, pos: int) -> int:
    return (h * 1_000_003 + tok * 7919 + pos * 104_729 + 12345) % _M


def _next(h: int) -> int:
    r = h % 97
    return STOP if r == 0 else 32 + (h // 97) % 95


class FakeAdapter(SlotSteps):
    speculative = False

    def __init__(self, slots: int = 4, max_context: int = 256, chunk: int = 8, decode_extents=(1, 4)):
        self.slots = slots
        self.total_slots = slots
        self.max_context = max_context
        self.chunk = chunk
        self.vocab_size = V
        self.stop_ids = frozenset({STOP})
        self.model_id = "fake-model"
        self.device = torch.device("cpu")
        self.has_tokenizer = True
        self.has_chat_template = True
        self.extents = sorted(decode_extents)
        self.h = [0] * slots
        self.kv = [[-1] * max_context for _ in range(slots)]
        self.gate = threading.Event()
        self.gate.set()
        self.prefill_tokens = 0
        self.decode_steps = 0
        self.padding_into_busy = 0
        self.closed = False
        self.step_delay = 0.0  # seconds per decode step (so a test can act while a stream runs)
        self.calls: list[tuple] = []  # ("prefill", slot, start, n) / ("decode", n_columns)

    # text
    def encode(self, text: str) -> list[int]:
        return [min(ord(c), 126) for c in text]

    def encode_chat(self, messages) -> list[int]:
        return self.encode("".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>")

    def decoder(self):
        return _Decoder()

    # sampling: the toy model is deterministic; the "logits" row is a one-hot of the next token
    def sampler(self, *, temperature, top_p, top_k, seed):
        return _Sampler(seed, temperature)

    def sample_from(self, row, sampler, position):
        return int(torch.argmax(row).item())

    def _row(self, h: int) -> torch.Tensor:
        r = torch.zeros(V)
        r[_next(h)] = 1.0
        return r

    # state
    def reset(self, slot):
        self.h[slot] = 0
        self.kv[slot] = [-1] * self.max_context

    def snapshot(self, slot, length, logits):
        t = {"h": torch.tensor([self.h[slot]], dtype=torch.int64),
             "kv": torch.tensor(self.kv[slot][:length], dtype=torch.int64)}
        lg = logits.clone() if logits is not None else None
        return StateSnapshot(length, t, lg, 8 + 8 * length + (lg.numel() * 4 if lg is not None else 0))

    def restore(self, slot, snap):
        self.reset(slot)
        self.h[slot] = int(snap.tensors["h"][0])
        kv = snap.tensors["kv"].tolist()
        self.kv[slot][:len(kv)] = kv

    def _feed(self, slot, tok, pos):
        assert self.kv[slot][pos] == -1 or pos == 0, f"slot {slot} position {pos} written twice"
        assert all(v != -1 for v in self.kv[slot][:pos]), f"slot {slot}: a hole before position {pos}"
        self.kv[slot][pos] = tok
        self.h[slot] = _mix(self.h[slot], tok, pos)

    # steps
    def prefill(self, slot, chunk, start, sampler=None, *, final=True, next_token=None):
        self.gate.wait(30)
        assert 1 <= len(chunk) <= self.chunk
        for i, tok in enumerate(chunk):
            self._feed(slot, tok, start + i)
        self.prefill_tokens += len(chunk)
        self.calls.append(("prefill", slot, start, len(chunk)))
        row = self._row(self.h[slot])
        return row, (int(torch.argmax(row).item()) if final else None)

    def step(self, columns, busy, samplers):
        self.gate.wait(30)
        a = len(columns)
        C = next(c for c in self.extents if c >= a)
        used = {s for _, _, s in columns}
        free = [s for s in range(self.slots) if s not in used and s not in busy]
        if len(free) < C - a:
            self.padding_into_busy += 1  # the real adapter saves and restores those rows
        self.decode_steps += 1
        self.calls.append(("decode", a))
        if self.step_delay:
            import time

            time.sleep(self.step_delay)
        out = []
        for tok, pos, slot in columns:
            self._feed(slot, tok, pos)
            out.append(self._row(self.h[slot]))
        return [StepOut([int(torch.argmax(row).item())], last_row=row) for row in out]

    def close(self):
        self.closed = True


def fake_generate(prompt: list[int], max_tokens: int, max_context: int = 256) -> list[int]:
    """What the toy model generates for `prompt` alone (the expected output)."""
    h = 0
    for p, t in enumerate(prompt):
        h = _mix(h, t, p)
    out = []
    while True:
        tok = _next(h)
        out.append(tok)
        if tok == STOP or len(out) >= max_tokens or len(prompt) + len(out) >= max_context:
            return out
        h = _mix(h, tok, len(prompt) + len(out) - 1)
