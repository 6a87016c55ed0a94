"""The step API: every call a generation loop makes into the engine, for `generate.stream`, the
speculative rounds (speculative/rounds.py) and `ninfer-serve` (serve/scheduler.py) alike.

A sequence owns one state slot (KV cache rows, GDN conv + recurrent state, MTP KV rows) from
admission to its end. The loops keep their own bookkeeping (which sequence is where, text, stop
strings, the prefix cache); the steps themselves live here, once:

- `finish_reason(...)`: THE stop rule. "stop" (a stop id) or "length" (max tokens, or the context
  is full: prompt + generated tokens = max_context, the server's `max_model_len`), as OpenAI's wire
  values; the CLI prints its own words for them.
- `prefill(engine, tokens, slot, params, start=)` / `prefill_chunk(...)`: the prompt (from position
  `start`: the slot already holds tokens[:start], e.g. restored from the prefix cache; `start` 0
  resets the slot) in chunks of the prefill extent; the chunk that ends the prompt samples the first
  token on the device with the sequence's `params` (None: greedy). With MTP drafts each chunk is
  followed by the MTP prefill chunk (`mtp=True`; its last id the next prompt token, or in the last
  chunk the sampled first token).
- `decode_step(engine, columns, params, busy=)`: one decode step for columns (token, position, slot).
  Padding columns never change a busy slot's state (`busy`: slots holding a sequence that is not in
  the step, e.g. one mid-prefill): they go to free slots, and when too few are free a busy slot is
  borrowed: its rows (whole GDN state, KV rows the padding writes) are saved and put back after.
  `padding_slots` is that rule, shared with the speculative round.
- `snapshot(engine, slot, length, logits)` / `restore(engine, slot, snap)`: the per-slot state after
  `length` tokens (kind "kv": rows [0, length); any other kind: the whole per-slot row), exact copies.
  On rank 0 of a --tp plan the other ranks snapshot / restore their own shards of the state in
  lockstep (`StateSnapshot.mirror`: the id they keep theirs under; `spill_snapshot` /
  `drop_snapshot` move theirs to host memory / free it as the prefix cache does with rank 0's).
- `Stepper(engine, spec=, use_graphs=, keep_logits=)`: the above with speculative decoding folded in:
  `admit_chunk` (admission: one prompt chunk; at the prompt's end the first token is read and the
  slot enters decode, with its `Lane` under speculation), `step(columns, busy, params)` (a plain
  decode step, or one speculative round for every column) -> a `StepOut` per column, `release`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from .errors import NinferRuntimeError
from .graphs import replay_or_run
from .sampling import SamplingParams, host_rows, require_device_sampling, upload_rows


def finish_reason(token: int, generated: int, prompt_len: int, *, stop_ids, max_tokens: int,
                  max_context: int) -> str | None:
    """Why a sequence ends with `token` (its `generated`-th token), or None: "stop" for a stop id,
    "length" after `max_tokens` or when the context is full: prompt and completion hold at most
    `max_context` tokens (OpenAI's context length; the server refuses a longer max_tokens)."""
    if int(token) in stop_ids:
        return "stop"
    if generated >= max_tokens or prompt_len + generated >= max_context:
        return "length"
    return None


def pick_runner(runners, a: int, what: str):
    """The smallest extent of `runners` with C >= a."""
    r = next((r for r in runners if r.concurrency >= a), None)
    if r is None:
        raise NinferRuntimeError(f"{a} concurrent sequences exceed the plan's largest {what} extent "
                                 f"(C={runners[-1].concurrency if runners else 0})")
    return r


# ----------------------------------------------------------------------------- slot state


@dataclass
class StateSnapshot:
    """Per-slot state after `length` tokens (device or host tensors) and the logits row of token
    length-1 (to sample the next token without recomputing it)."""

    length: int
    tensors: dict[str, torch.Tensor]
    logits: torch.Tensor | None
    nbytes: int
    mirror: int | None = None  # --tp rank 0: the id the other ranks keep their shards' snapshot under

    def to(self, device) -> "StateSnapshot":
        t = {k: v.to(device) for k, v in self.tensors.items()}
        lg = self.logits.to(device) if self.logits is not None else None
        return StateSnapshot(self.length, t, lg, self.nbytes, self.mirror)


def state_layout(engine) -> list[tuple[str, str, torch.Tensor]]:
    """(name, kind, tensor [slots, ...]) of every per-slot state buffer of the plan."""
    state = (engine.plan.get("buffers", {}).get("state") or {})
    return [(name, str(b.get("kind", "")), engine.state(name)) for name, b in sorted(state.items())]


def snapshot(engine, slot: int, length: int, logits: torch.Tensor | None) -> StateSnapshot:
    tensors, nbytes = {}, 0
    for name, kind, t in state_layout(engine):
        c = (t[slot][:length] if kind == "kv" else t[slot]).clone()
        tensors[name] = c
        nbytes += c.numel() * c.element_size()
    lg = logits.detach().clone() if logits is not None else None
    if lg is not None:
        nbytes += lg.numel() * lg.element_size()
    lockstep = getattr(engine, "lockstep", None)
    mirror = lockstep.snapshot(slot, length) if lockstep is not None else None
    return StateSnapshot(int(length), tensors, lg, nbytes, mirror)


def restore(engine, slot: int, snap: StateSnapshot) -> None:
    engine.reset_slot(slot)
    write_slot(engine, slot, snap)
    lockstep = getattr(engine, "lockstep", None)
    if lockstep is not None:
        if snap.mirror is None:
            raise NinferRuntimeError("a --tp plan restores only snapshots its ranks took together")
        lockstep.restore(slot, snap.mirror)


def write_slot(engine, slot: int, snap: StateSnapshot) -> None:
    """Copy a snapshot's state into the slot (reset already)."""
    for name, kind, t in state_layout(engine):
        src = snap.tensors[name]
        (t[slot][: src.shape[0]] if kind == "kv" else t[slot]).copy_(src)


def spill_snapshot(engine, snap: StateSnapshot) -> StateSnapshot:
    """The snapshot's host copy (the prefix cache's spill); a --tp plan's other ranks move theirs too."""
    lockstep = getattr(engine, "lockstep", None)
    if lockstep is not None and snap.mirror is not None:
        lockstep.spill(snap.mirror)
    return snap.to("cpu")


def drop_snapshot(engine, snap: StateSnapshot) -> None:
    """The prefix cache let go of `snap`: a --tp plan's other ranks free their part of it."""
    lockstep = getattr(engine, "lockstep", None)
    if lockstep is not None and snap.mirror is not None:
        lockstep.drop(snap.mirror)


@contextmanager
def padding_slots(engine, used, busy, n: int, rows: int):
    """`n` slots for padding rows (a padding row writes KV rows [0, rows) and the whole GDN state of
    its slot): free slots first (neither in `used` nor in `busy`), then borrowed busy slots whose
    rows are saved here and put back when the block ends. Yields the list."""
    used, busy = set(used), set(busy) - set(used)
    free = [s for s in range(engine.slots) if s not in used and s not in busy]
    borrow = sorted(busy)[:max(0, n - len(free))]
    if len(free) + len(borrow) < n:
        raise NinferRuntimeError(f"no slot left for {n} padding rows ({len(used)} sequences in the step)")
    layout = state_layout(engine) if borrow else []
    saved = [(s, save_slot_rows(layout, s, rows)) for s in borrow]
    lockstep = getattr(engine, "lockstep", None)  # a --tp plan's other ranks save / put back theirs too
    for s, _ in saved:
        if lockstep is not None:
            lockstep.save_slot(s, rows)
    try:
        yield (free + borrow)[:n]
    finally:
        for s, kept in saved:
            restore_slot_rows(layout, s, rows, kept)
            if lockstep is not None:
                lockstep.restore_slot(s)


def save_slot_rows(layout, s: int, rows: int) -> list:
    return [(t[s][:rows] if kind == "kv" else t[s]).clone() for _, kind, t in layout]


def restore_slot_rows(layout, s: int, rows: int, kept: list) -> None:
    for (_, kind, t), r in zip(layout, kept):
        (t[s][:rows] if kind == "kv" else t[s]).copy_(r)


# ----------------------------------------------------------------------------- prefill


def upload_columns(ids, pos, slots, chunk: list[int], start: int, slot: int) -> None:
    """One prefill chunk's columns into the extent's inputs: token ids, positions start.., the slot
    (one host tensor, three copies)."""
    n = len(chunk)
    host = torch.tensor([chunk, list(range(start, start + n)), [slot] * n], dtype=torch.int32)
    ids[:n].copy_(host[0])
    pos[:n].copy_(host[1])
    slots[:n].copy_(host[2])


def prefill_chunk(engine, slot: int, chunk: list[int], start: int, params: SamplingParams | None = None, *,
                  final: bool = True, next_token: int | None = None, mtp: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `chunk` (1..T tokens) at positions start.. into `slot` (no reset). `final`: the chunk ends
    the prompt, its last column samples with `params` (None: greedy) for position start + n. `mtp`:
    the MTP prefill chunk runs right after over the same columns (its last id `next_token`, the
    next prompt token, or with `final` the sampled first token). Returns the last column's
    (logits row [V], sampled id [1]) as device tensors (views valid until the next run)."""
    r = engine.prefill_runner
    require_device_sampling(r)
    T, n = r.t, len(chunk)
    if not 1 <= n <= T:
        raise NinferRuntimeError(f"prefill chunk of {n} tokens (the extent takes 1..{T})")
    if start + n > engine.max_context:
        raise NinferRuntimeError(f"prefill to position {start + n} exceeds the max context {engine.max_context}")
    if mtp and not final and next_token is None:
        raise NinferRuntimeError("an MTP prefill chunk inside the prompt needs the next prompt token")
    upload_columns(r.inputs["ids"], r.inputs["positions"], r.inputs["slots"], chunk, start, slot)
    rows = r.inputs.get("logit_rows")
    if rows is not None:
        rows.fill_(n - 1)
    logits = r.outputs["logits"]
    i = 0 if (rows is not None or logits.shape[0] != T) else n - 1  # the last column's row
    R = r.inputs["temperature"].shape[0]
    sel = [(None, 0)] * R
    if final:
        sel[i] = (params, start + n)
    upload_rows(r, host_rows(sel, R))
    r.run(None if n == T else n)
    if mtp:
        from .speculative.rounds import mtp_prefill_chunk

        got = mtp_prefill_chunk(engine, slot, chunk, start, i, None if final else int(next_token))
        if got is not None:
            return got
    return logits[i], r.outputs["ids"][i:i + 1]


def prefill(engine, tokens: list[int], slot: int, params: SamplingParams | None = None, *, start: int = 0,
            mtp: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt `tokens` from position `start` into `slot` in chunks of the prefill extent (`start`
    0: the slot is reset first; else it holds tokens[:start]); the last chunk samples with `params`.
    Returns the last column's (logits row [V], sampled id [1]) (device views)."""
    if not 0 <= start < len(tokens):
        raise NinferRuntimeError(f"prefill from position {start} of a {len(tokens)}-token prompt")
    if start == 0:
        engine.reset_slot(slot)
    T = engine.prefill_runner.t
    for s in range(start, len(tokens), T):
        chunk = tokens[s:s + T]
        final = s + T >= len(tokens)
        got = prefill_chunk(engine, slot, chunk, s, params, final=final,
                            next_token=None if final else tokens[s + T], mtp=mtp)
    return got


# ----------------------------------------------------------------------------- decode


def _pinned_words(engine, runner, n: int) -> torch.Tensor:
    """The runner's reusable host staging buffer of n int32 words (pinned on a GPU: asynchronous
    uploads; the step's read of its ids orders the next reuse after the copies)."""
    cache = engine.__dict__.setdefault("_upload_words", {})
    buf = cache.get(runner.name)
    if buf is None or buf.numel() != n:
        buf = torch.empty(n, dtype=torch.int32, pin_memory=engine.device.type == "cuda")
        cache[runner.name] = buf
    return buf


def decode_step(engine, columns: list[tuple[int, int, int]], params: list[SamplingParams | None] | None = None,
                *, use_graphs: bool = True, busy=(), rows: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One decode step for columns (token, position, slot), column i sampling with params[i] (None:
    greedy) for position + 1, in the smallest decode extent with C >= len(columns); padding columns
    (position 0, greedy) go to `padding_slots` (never changing a busy slot). Returns the device
    views (logits [len(columns), V], ids [len(columns)]). `rows` False (the caller needs no logits
    rows) with every column greedy runs a --tp plan's greedy twin instead (the distributed argmax:
    the same ids, logits None). Host work: one packed upload; no sync (the caller reads the ids)."""
    a = len(columns)
    ps = list(params) if params is not None else [None] * a
    twins = getattr(engine, "argmax_decode_runners", None)
    twin = not rows and bool(twins) and all(p is None or p.is_greedy for p in ps)
    runner = pick_runner(twins if twin else engine.decode_runners, a, "decode")
    C = runner.t
    if not twin:
        require_device_sampling(runner)
    with padding_slots(engine, {s for _, _, s in columns}, busy, C - a, 1) as pads:
        cols = list(columns) + [(0, 0, s) for s in pads]
        host = torch.cat([torch.tensor([[c[0] for c in cols], [c[1] for c in cols], [c[2] for c in cols]],
                                       dtype=torch.int32).reshape(-1),
                          *([] if twin else [host_rows([(p, c[1] + 1) for p, c in zip(ps, columns)], C)])])
        words = _pinned_words(engine, runner, host.numel())
        words.copy_(host)
        nb = words.is_pinned()
        runner.inputs["ids"].copy_(words[0:C], non_blocking=nb)
        runner.inputs["positions"].copy_(words[C:2 * C], non_blocking=nb)
        runner.inputs["slots"].copy_(words[2 * C:3 * C], non_blocking=nb)
        if not twin:
            upload_rows(runner, words[3 * C:], non_blocking=nb)
        replay_or_run(engine, runner, use_graphs)
    return (None if twin else runner.outputs["logits"][:a]), runner.outputs["ids"][:a]


# ----------------------------------------------------------------------------- the stepper


@dataclass
class StepOut:
    """One column's share of a step."""

    tokens: list[int]  # emitted, uncut: one for a plain step; accepted drafts + the target's own for a round
    proposed: int = 0  # drafts proposed / accepted (speculative rounds)
    accepted: int = 0
    verified: bool = False  # a verify round (not a plain step) produced them
    rows: list[torch.Tensor] | None = None  # float32 host logits row per token (keep_logits)
    last_row: torch.Tensor | None = None  # device view: the row tokens[-1] came from (None: MTP drafts, a
    # --tp greedy twin's step)


class SlotSteps:
    """Admission and decode entry over the primitives `prefill(slot, chunk, start, params, final=,
    next_token=) -> (row, first id or None)` and `start_lane(slot, prompt, first, params)` (the
    server's test fakes provide these too)."""

    def admit_chunk(self, slot: int, prompt: list[int], cursor: int, n: int, params) -> tuple[Any, int | None]:
        """Prefill prompt[cursor:cursor+n] into `slot` (which holds prompt[:cursor]). At the prompt's
        end the first token is sampled (with `params`) and read, and the slot enters decode (its
        speculative lane starts). Returns (logits row of the chunk's last column, first token or None)."""
        final = cursor + n == len(prompt)
        row, first = self.prefill(slot, prompt[cursor:cursor + n], cursor, params, final=final,
                                  next_token=None if final else prompt[cursor + n])
        if final:
            self.start_lane(slot, prompt, first, params)
        return row, first

    def admit(self, slot: int, prompt: list[int], params, start: int = 0) -> tuple[Any, int]:
        """The whole prompt from `start` (0: reset the slot first) -> (last logits row, first token)."""
        if start == 0:
            self.reset(slot)
        cursor = start
        while True:
            n = min(self.chunk, len(prompt) - cursor)
            row, first = self.admit_chunk(slot, prompt, cursor, n, params)
            cursor += n
            if first is not None:
                return row, first

    def start_lane(self, slot, prompt, first, params) -> None:
        pass

    def spill_snapshot(self, snap: StateSnapshot) -> StateSnapshot:
        """The prefix cache's host copy of a snapshot it moves out of device memory."""
        return snap.to("cpu")

    def drop_snapshot(self, snap: StateSnapshot) -> None:
        """The prefix cache let go of `snap` (nothing else holds a part of it here)."""

    def release(self, slot: int) -> None:
        pass


class Stepper(SlotSteps):
    """The engine as a generation loop drives it. `spec`: "mtp" | "ngram" | "none" | None (the
    plan's default) | a drafter factory (speculative/rounds.py `resolve_spec`); `keep_logits`: each
    emitted token's float32 logits row comes back in `StepOut.rows`. `stats` accumulates the
    speculative counters of `spec_round`; `launches` counts decode / verify launches."""

    def __init__(self, engine, *, spec=None, use_graphs: bool = True, keep_logits: bool = False):
        from .speculative.rounds import resolve_spec

        self.engine = engine
        self.use_graphs = use_graphs
        self.keep_logits = keep_logits
        self.spec_mode, self._drafter_factory = resolve_spec(engine, spec)  # ValueError (one line)
        self.draft_tokens = int(getattr(engine, "draft_tokens", 0) or 0)
        self.lanes: dict[int, Any] = {}
        self.stats: dict[str, int] = {}
        self.launches = 0
        self.device = engine.device
        self.slots = int(engine.max_concurrency)
        self.total_slots = int(engine.slots)
        self.max_context = int(engine.max_context)
        self.chunk = int(engine.prefill_runner.t)
        self.vocab_size = int(engine.vocab_rows)

    @property
    def speculative(self) -> bool:
        return self.spec_mode != "none"

    # ---------------------------------------------------------------- state
    def reset(self, slot: int) -> None:
        self.engine.reset_slot(slot)

    def snapshot(self, slot: int, length: int, logits) -> StateSnapshot:
        return snapshot(self.engine, slot, length, logits)

    def restore(self, slot: int, snap: StateSnapshot) -> None:
        restore(self.engine, slot, snap)

    def spill_snapshot(self, snap: StateSnapshot) -> StateSnapshot:
        return spill_snapshot(self.engine, snap)

    def drop_snapshot(self, snap: StateSnapshot) -> None:
        drop_snapshot(self.engine, snap)

    def sample_from(self, row: torch.Tensor, params: SamplingParams | None, position: int) -> int:
        """The token a prefill ending at `position` would sample from logits `row` [V]: the row is
        written where the prefill extent keeps its last column's logits and only the launch that
        produces the extent's ids runs (the noise depends on seed, position and token only)."""
        r = self.engine.prefill_runner
        require_device_sampling(r)
        ids, logits = r.outputs["ids"], r.outputs["logits"]
        launch = next((b for b in r.bound() if any(v is ids for v in b.kwargs.values())), None)
        if launch is None:
            raise NinferRuntimeError(f"extent {r.name}: no launch writes its ids")
        R = r.inputs["temperature"].shape[0]
        logits[0].copy_(row)
        sel = [(None, 0)] * R
        sel[0] = (params, position)
        upload_rows(r, host_rows(sel, R))
        launch()
        return int(ids[0].item())

    # ---------------------------------------------------------------- steps
    def prefill(self, slot: int, chunk: list[int], start: int, params=None, *, final: bool = True,
                next_token: int | None = None) -> tuple[torch.Tensor, int | None]:
        row, ids = prefill_chunk(self.engine, slot, chunk, start, params, final=final, next_token=next_token,
                                 mtp=self.spec_mode == "mtp")
        return row, (int(ids.tolist()[0]) if final else None)  # the chunk's one read: the first token

    def start_lane(self, slot: int, prompt: list[int], first: int, params) -> None:
        """`slot` enters decode with its first token `first` (sampled at position len(prompt)):
        under speculation its `Lane` (MTP: the drafts the last MTP prefill chunk left on the device;
        else a drafter over prompt + first)."""
        if not self.speculative:
            return
        from .speculative.rounds import Lane

        if slot in self.lanes:
            raise NinferRuntimeError(f"slot {slot} already has a speculative lane")
        drafter = self._drafter_factory(list(prompt)) if self._drafter_factory is not None else None
        lane = Lane(slot, params, drafter, keep_logits=self.keep_logits)
        lane.begin(int(first), len(prompt))
        self.lanes[slot] = lane

    def release(self, slot: int) -> None:
        self.lanes.pop(slot, None)

    def step(self, columns: list[tuple[int, int, int]], busy, params: list) -> list[StepOut]:
        """One step for columns (last token, its position, slot), column i sampling with params[i];
        `busy`: slots holding state outside the step (never changed by padding). Plain: one decode
        step; speculative: one round for every column's lane."""
        if not self.speculative:
            logits, ids = decode_step(self.engine, columns, params, use_graphs=self.use_graphs, busy=busy,
                                      rows=self.keep_logits)  # greedy, no rows kept: a --tp plan's twin
            toks = ids.tolist()  # the step's one device->host read: the new ids
            self.launches += 1
            return [StepOut([int(t)], rows=[logits[i].float().cpu().clone()] if self.keep_logits else None,
                            last_row=None if logits is None else logits[i]) for i, t in enumerate(toks)]
        from .speculative.rounds import spec_round

        lanes = []
        for t0, pos, slot in columns:
            lane = self.lanes.get(slot)
            if lane is None or lane.last != t0 or lane.position != pos:
                raise NinferRuntimeError(f"slot {slot}: the speculative lane is not at token {t0}, position {pos}")
            lanes.append(lane)
        before = [(l.proposed, l.accepted) for l in lanes]
        n0 = self.stats.get("rounds", 0) + self.stats.get("plain_steps", 0)
        out = spec_round(self.engine, lanes, self.use_graphs, busy=busy, stats=self.stats)
        self.launches += self.stats.get("rounds", 0) + self.stats.get("plain_steps", 0) - n0
        return [StepOut(em, l.proposed - p0, l.accepted - a0, l.last_step == "verify",
                        list(l.logits) if l.keep_logits else None, l.last_row)
                for l, em, (p0, a0) in zip(lanes, out, before)]
