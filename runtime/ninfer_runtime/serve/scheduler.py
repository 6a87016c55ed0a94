"""The engine loop: one thread owns the device and runs continuous batching over the plan's slots.

A step of the loop:
1. cancelled requests (client gone, drain deadline) leave: their slot is freed (within one step);
2. waiting requests are admitted into free slots, FIFO. Each looks up the prefix cache: the state
   of its longest cached prefix is restored into the slot (else the slot is reset) and only the
   rest of the prompt is prefilled; a prompt cached whole samples its first token from the stored
   logits right away;
3. prefill: chunks of the admitted prompts, oldest first, up to `prefill_budget` tokens per step (at
   least one chunk), so the running streams get a decode step between any two budgets of prefill;
   a prompt whose last chunk ran samples its first token and joins the decode batch;
4. one step for every sequence in decode (the runtime's step API, steps.py: padding never changes a
   busy slot), each sampling its next token(s).
A sequence ends by the runtime's `finish_reason` ("stop": a stop id, the artifact's eos ids;
"length": `max_tokens` or the plan's context) or a stop string ("stop"); its slot is freed and its
final state goes into the prefix cache. Prefill chunks, admission into decode and the steps are
the runtime's (the adapter is a `Stepper`); this module keeps request handling, scheduling policy
and the prefix cache.

Requests talk to the HTTP side through `Request.events` (a thread-safe callback into the asyncio
loop).

Speculative decoding (`adapter.spec_mode` "mtp" | "ngram"; "none" or absent: plain steps): step 4 is
one round for every sequence in decode (docs/SPECULATIVE.md: all of them in one verify extent); the
step returns each sequence's emitted tokens (accepted drafts + the correction or bonus) with its
proposed / accepted counts, and the tokens go out one by one (stop ids, stop strings, max_tokens and
the context cut them as for plain steps). A sequence gets its lane when its last prompt chunk runs
(`admit_chunk`) and loses it when it ends (`adapter.release`). Requests join and leave between
rounds; chunked prefill still runs between two rounds.
Prefix cache under speculative decoding: a snapshot is taken only where the slot's state is exactly
prompt + tokens[:-1] (a round whose emission was cut by a stop left the state ahead: no snapshot).
With the MTP drafter the snapshot also holds the MTP KV rows [0, L) (`mtp_kv/*` are state buffers
of the plan, so the adapter's snapshot copies them like `kv/*`); MTP row L-1 pairs the target's
hidden state at L-1 with the token that FOLLOWED (the next prompt token, the first sampled token or
the last emitted one), so such a snapshot is keyed by its L tokens plus that follower: it is restored
only for a request that continues with the same token, and its MTP state is then exactly a cold
run's (drafts, hence seeded sampling, do not depend on what was cached). The price: a prompt equal to
a cached one is not restored whole (its follower is sampled after the lookup); it restores the
deepest snapshot inside it and prefills the rest. (The alternative, re-running the MTP head over the
cached prefix, needs the target's hidden rows of the whole prefix: 2 x H bytes per token more in
every snapshot, and an MTP prefill per restore.) The n-gram drafter has no device state: its
snapshots are keyed and restored as without speculation.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ..steps import finish_reason
from .prefix_cache import PrefixCache


class QueueFull(Exception):
    pass


class Draining(Exception):
    pass


@dataclass
class Event:
    kind: str  # "delta" | "done" | "error"
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None


_ids = itertools.count(1)


class Request:
    def __init__(self, prompt: list[int], *, max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int | None = None, stop: list[str] | None = None, ignore_eos: bool = False,
                 endpoint: str = "completions", on_event: Callable[[Event], None] | None = None,
                 request_id: str | None = None):
        self.id = request_id or f"req-{next(_ids)}"
        self.endpoint = endpoint
        self.prompt = list(prompt)
        self.max_tokens = int(max_tokens)
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.seed = int(seed) if seed is not None else random.getrandbits(63)
        self.stop = [s for s in (stop or []) if s]
        self.ignore_eos = ignore_eos
        self.on_event = on_event or (lambda ev: None)
        self.arrival = time.monotonic()
        self.admitted: float | None = None
        self.first_token: float | None = None
        self.finished: float | None = None
        self.state = "waiting"  # waiting | prefill | decode | done
        self.slot = -1
        self.cursor = 0  # prompt tokens in the slot's state
        self.cached_tokens = 0
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.cancelled = False  # set from any thread; acted on at the next step
        self.cancel_reason = "cancelled"
        self.sampler = None
        self.decoder = None
        self.text = ""  # decoded text (stop strings not yet cut)
        self.sent = 0  # characters of self.text delivered
        self.last_logits = None
        self.error: str | None = None
        self.spec_rounds = 0  # speculative rounds this request took part in
        self.spec_proposed = 0  # draft tokens proposed for it
        self.spec_accepted = 0  # of which accepted
        self.state_ahead = False  # its slot consumed tokens it did not emit (a round cut by a stop)

    def cancel(self, reason: str = "cancelled") -> None:
        self.cancel_reason = reason
        self.cancelled = True

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)


class Scheduler:
    def __init__(self, adapter, *, max_queue: int = 64, prefill_budget: int | None = None,
                 cache_bytes: int = 2 << 30, host_cache_bytes: int = 0, snapshot_interval: int | None = None,
                 metrics=None, log: Any = None, idle_wait_s: float = 0.5):
        self.a = adapter
        self.spec_mode = str(getattr(adapter, "spec_mode", "none") or "none")
        self.follower_keys = self.spec_mode == "mtp"  # snapshots keyed with the token that follows (see above)
        self.max_queue = int(max_queue)
        T = adapter.chunk
        self.prefill_budget = max(1, int(prefill_budget or T))
        iv = int(snapshot_interval) if snapshot_interval else max(T, 2048)
        self.snapshot_interval = max(T, (iv + T - 1) // T * T)
        self.cache = PrefixCache(cache_bytes, host_cache_bytes, to_host=adapter.spill_snapshot,
                                 on_drop=adapter.drop_snapshot)
        self.metrics = metrics
        self.log = sys.stderr if log is None else log
        self.idle_wait_s = idle_wait_s
        self._cv = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []  # admitted, in admission order
        self._free = list(range(adapter.slots))
        self._stop = False
        self.draining = False
        self.steps = 0
        self.fatal: str | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control (any thread)
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
        self._thread.start()

    def submit(self, req: Request) -> None:
        with self._cv:
            if self.draining or self._stop:
                raise Draining("the server is shutting down")
            if self.fatal:
                raise Draining(f"the engine stopped: {self.fatal}")
            if len(self._waiting) >= self.max_queue + len(self._free):
                raise QueueFull(f"the queue is full ({self.max_queue} requests waiting)")
            self._waiting.append(req)
            self._gauges()
            self._cv.notify_all()

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def begin_drain(self) -> None:
        """Stop admitting: new submits get Draining; waiting requests are aborted."""
        with self._cv:
            self.draining = True
            self._cv.notify_all()

    def abort_all(self) -> None:
        with self._cv:
            for r in list(self._waiting) + list(self._running):
                r.cancel("abort")
            self._cv.notify_all()

    def idle(self) -> bool:
        with self._cv:
            return not self._waiting and not self._running

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def snapshot_state(self) -> dict[str, Any]:
        with self._cv:
            return {"waiting": len(self._waiting), "running": len(self._running),
                    "slots_used": self.a.slots - len(self._free), "slots": self.a.slots, "steps": self.steps,
                    "draining": self.draining, "engine_alive": self._thread is not None and self._thread.is_alive()
                    and self.fatal is None, "prefix_cache": self.cache.stats()}

    # ------------------------------------------------------------------ the loop (engine thread)
    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._stop and not self._waiting and not self._running:
                        self._cv.wait(self.idle_wait_s)
                    if self._stop:
                        break
                    if self.draining:
                        for r in list(self._waiting):
                            r.cancel("abort")
                self._step()
        except BaseException as exc:  # noqa: BLE001 - the engine failed: fail every request, stay up for /health
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.fatal = f"{type(exc).__name__}: {msg}"
            with self._cv:
                for r in list(self._waiting) + list(self._running):
                    self._fail(r, self.fatal)
                self._waiting.clear()
                self._running.clear()
        finally:
            with self._cv:
                for r in list(self._waiting) + list(self._running):
                    self._finish(r, "abort")
                self._waiting.clear()
                self._running.clear()

    def _step(self) -> None:
        self.steps += 1
        # 1. cancellations
        with self._cv:
            for r in [r for r in self._waiting if r.cancelled]:
                self._waiting.remove(r)
                self._finish(r, r.cancel_reason)
        for r in [r for r in self._running if r.cancelled]:
            self._finish(r, r.cancel_reason)
        # 2. admission
        while True:
            with self._cv:
                if not self._waiting or not self._free:
                    break
                r = self._waiting.popleft()
                r.slot = self._free.pop(0)
                self._running.append(r)
            self._admit(r)
        self._gauges()
        # 3. prefill within the token budget
        budget = self.prefill_budget
        for r in [r for r in self._running if r.state == "prefill"]:
            while budget > 0 and r.state == "prefill":
                n = min(self.a.chunk, len(r.prompt) - r.cursor, budget)
                budget -= n
                self._prefill_chunk(r, n)
            if budget <= 0:
                break
        # 4. decode
        batch = [r for r in self._running if r.state == "decode"]
        if batch:
            self._decode(batch)
        self._gauges()

    def _admit(self, r: Request) -> None:
        r.admitted = time.monotonic()
        if self.metrics is not None:
            self.metrics.queue_wait.observe(r.admitted - r.arrival)
            self.metrics.prompt_tokens.inc(len(r.prompt))
        r.sampler = self.a.sampler(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=r.seed)
        r.decoder = self.a.decoder()
        L, snap = self.cache.lookup(r.prompt) if self.cache.enabled else (0, None)
        if snap is not None:
            L = snap.length  # < the path's depth for a follower-keyed snapshot
        if snap is not None and (L < len(r.prompt) or snap.logits is not None):
            self.a.restore(r.slot, snap)
            r.cursor = r.cached_tokens = L
            if self.metrics is not None:
                self.metrics.cached_tokens.inc(L)
        else:
            self.a.reset(r.slot)
            r.cursor = 0
        self._cache_metrics()
        if r.cursor == len(r.prompt):
            tok = self.a.sample_from(snap.logits.to(self.a.device), r.sampler, len(r.prompt))
            r.state = "decode"
            self.a.start_lane(r.slot, r.prompt, tok, r.sampler)
            self._emit(r, tok, snap.logits)
        else:
            r.state = "prefill"

    def _prefill_chunk(self, r: Request, n: int) -> None:
        # the runtime's admission: at the prompt's end the first token is sampled and the slot enters decode
        row, tok = self.a.admit_chunk(r.slot, r.prompt, r.cursor, n, r.sampler)
        end = tok is not None
        r.cursor += n
        if self.cache.enabled and (end or r.cursor % self.snapshot_interval < n):
            self._remember(r.slot, r.prompt[:r.cursor], row, tok if end else r.prompt[r.cursor])
        if end:
            r.state = "decode"
            self._emit(r, tok, row)

    def _decode(self, batch: list[Request]) -> None:
        busy = {r.slot for r in self._running if r.state == "prefill"}
        cols = [(r.tokens[-1], len(r.prompt) + len(r.tokens) - 1, r.slot) for r in batch]
        # plain: one token per sequence; speculative: one round, each sequence's emitted tokens (>= 1:
        # accepted drafts, then the correction / bonus), leaving every slot's state at prompt + tokens[:-1]
        # once all of them are emitted, as a plain step does
        outs = self.a.step(cols, busy, [r.sampler for r in batch])
        m = self.metrics
        for r, out in zip(batch, outs):
            if self.spec_mode != "none":
                r.spec_rounds += 1
                r.spec_proposed += out.proposed
                r.spec_accepted += out.accepted
                if m is not None:
                    m.spec_rounds.inc()
                    m.spec_proposed.inc(out.proposed)
                    m.spec_accepted.inc(out.accepted)
            for i, tok in enumerate(out.tokens):
                if r.state != "decode":
                    break
                last = i == len(out.tokens) - 1
                r.state_ahead = not last  # finishing here leaves the slot's state past the emitted tokens
                self._emit(r, tok, out.last_row if last else None)

    def _remember(self, slot: int, tokens: list[int], logits, follower: int | None = None) -> None:
        """Snapshot the slot's state after `tokens`. With MTP drafts the snapshot is keyed by tokens +
        [follower] (the token MTP row len(tokens)-1 was computed with) and keeps no logits (it is
        never restored whole)."""
        if self.follower_keys:
            if follower is None:
                return
            n = len(tokens)
            self.cache.insert(list(tokens) + [int(follower)], lambda: self.a.snapshot(slot, n, None))
            return
        self.cache.insert(tokens, lambda: self.a.snapshot(slot, len(tokens), logits))

    # ------------------------------------------------------------------ tokens -> text -> events
    def _emit(self, r: Request, tok: int, logits) -> None:
        now = time.monotonic()
        if r.first_token is None:
            r.first_token = now
            if self.metrics is not None:
                self.metrics.ttft.observe(now - r.arrival)
        r.tokens.append(int(tok))
        r.last_logits = logits
        if self.metrics is not None:
            self.metrics.generation_tokens.inc()
        stop_ids = () if r.ignore_eos else self.a.stop_ids
        reason = finish_reason(tok, len(r.tokens), len(r.prompt), stop_ids=stop_ids, max_tokens=r.max_tokens,
                               max_context=self.a.max_context)
        is_stop = int(tok) in stop_ids
        if r.decoder is not None and not is_stop:
            r.text += r.decoder.push(int(tok))
            if reason is not None:
                r.text += r.decoder.flush()
        cut = self._stop_cut(r)
        if cut is not None:
            r.text = r.text[:cut]
            reason = "stop"
        if reason is not None:
            self._deliver(r, len(r.text), [int(tok)])
            self._finish(r, reason)
        else:
            self._deliver(r, len(r.text) - self._holdback(r), [int(tok)])

    def _stop_cut(self, r: Request) -> int | None:
        if not r.stop:
            return None
        lo = max(0, r.sent - max(len(s) for s in r.stop))
        hits = [i for i in (r.text.find(s, lo) for s in r.stop) if i >= 0]
        return min(hits) if hits else None

    def _holdback(self, r: Request) -> int:
        """Characters at the end of the text that could start a stop string (not sent yet)."""
        best = 0
        for s in r.stop:
            for k in range(min(len(s) - 1, len(r.text)), best, -1):
                if r.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _deliver(self, r: Request, upto: int, tokens: list[int]) -> None:
        upto = max(r.sent, upto)
        text = r.text[r.sent:upto]
        r.sent = upto
        self._safe(r, Event("delta", text, tokens))

    def _safe(self, r: Request, ev: Event) -> None:
        try:
            r.on_event(ev)
        except Exception:  # noqa: BLE001 - a dead client must not stop the loop
            r.cancelled = True

    def _finish(self, r: Request, reason: str) -> None:
        if r.state == "done":
            return
        was_decoding = r.state == "decode"
        r.state = "done"
        r.finish_reason = reason
        r.finished = time.monotonic()
        if r.slot >= 0:
            if was_decoding and self.cache.enabled and len(r.tokens) >= 2 and not r.state_ahead \
                    and reason in ("stop", "length"):
                # the state holds prompt + tokens[:-1]; tokens[-1] was sampled from last_logits (None
                # after a --tp greedy twin's step: the snapshot then serves longer prompts only)
                self._remember(r.slot, r.prompt + r.tokens[:-1], r.last_logits, r.tokens[-1])
            if was_decoding:
                self.a.release(r.slot)
            with self._cv:
                if r in self._running:
                    self._running.remove(r)
                self._free.append(r.slot)
                self._free.sort()
        r.last_logits = None
        self._record(r)  # logged before the client hears of it: a response implies its log line
        self._safe(r, Event("done", finish_reason=reason))

    def _fail(self, r: Request, msg: str) -> None:
        r.error = msg
        r.state = "done"
        r.finish_reason = "error"
        r.finished = time.monotonic()
        self._record(r)
        self._safe(r, Event("error", text=msg, finish_reason="error"))

    # ------------------------------------------------------------------ bookkeeping
    def _record(self, r: Request) -> None:
        m = self.metrics
        e2e = (r.finished or time.monotonic()) - r.arrival
        dec_s = (r.finished - r.first_token) if r.first_token is not None and r.finished is not None else 0.0
        dec_tps = (len(r.tokens) - 1) / dec_s if dec_s > 0 and len(r.tokens) > 1 else 0.0
        if m is not None:
            m.requests.labels(r.endpoint, r.finish_reason or "unknown").inc()
            m.latency.observe(e2e)
            if dec_s > 0 and len(r.tokens) > 1:
                m.tpot.observe(dec_s / (len(r.tokens) - 1))
        line = {"event": "request", "id": r.id, "endpoint": r.endpoint, "finish_reason": r.finish_reason,
                "prompt_tokens": len(r.prompt), "completion_tokens": len(r.tokens),
                "cached_tokens": r.cached_tokens,
                "queue_wait_s": round((r.admitted - r.arrival), 6) if r.admitted is not None else None,
                "ttft_s": round(r.first_token - r.arrival, 6) if r.first_token is not None else None,
                "decode_tok_s": round(dec_tps, 3), "e2e_s": round(e2e, 6)}
        if self.spec_mode != "none":
            line["spec"] = {"mode": self.spec_mode, "rounds": r.spec_rounds, "proposed": r.spec_proposed,
                            "accepted": r.spec_accepted,
                            "acceptance": round(r.spec_accepted / r.spec_proposed, 4) if r.spec_proposed else None,
                            "tokens_per_round": round((len(r.tokens) - 1) / r.spec_rounds, 3)
                            if r.spec_rounds and len(r.tokens) > 1 else None}
        if r.error:
            line["error"] = r.error
        self.log_line(line)

    def log_line(self, line: dict) -> None:
        try:
            self.log.write(json.dumps(line) + "\n")
            self.log.flush()
        except Exception:  # noqa: BLE001 - logging never stops serving
            pass

    def _gauges(self) -> None:
        m = self.metrics
        if m is None:
            return
        m.queue_depth.set(len(self._waiting))
        m.running.set(len(self._running))
        m.slots_used.set(self.a.slots - len(self._free))
        m.cache(self.cache.stats())

    def _cache_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.cache(self.cache.stats())
