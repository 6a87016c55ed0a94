"""Generation: continuous batching of C concurrent sequences over the plan's extents.

Each sequence owns one state slot (KV cache rows, GDN conv + recurrent state) from admission to
its end; a finished sequence frees its slot for the next request. A step of the scheduler:
1. admit waiting requests into free slots: chunked prefill (the plan's prefill extent, chunk by
   chunk, state carried between chunks; a tail chunk runs narrowed to its n columns); the
   extent's sampling launch picks the first token from the last prompt column's logits;
2. one decode step for all active sequences: the smallest decode extent with C >= active (extra
   columns are padding in distinct free slots, position 0, greedy), replayed from its CUDA graph on
   a GPU; its sampling launch picks every column's next token with that sequence's parameters
   (sampling.py: per-row device inputs), so the step's only device->host transfer is the read of
   the C new ids (what streaming and stopping need), and its inputs go up in one pinned buffer.
With `spec=` (a plan with a draft window K; speculative/rounds.py, docs/SPECULATIVE.md) step 2 is
a speculative round instead: all active sequences verify their last token + K drafts together and
each emits accepted + 1 tokens (a sequence too close to the context end takes a plain step).
A sequence stops on a stop id (the artifact's eos ids, plus `stop_ids`), after `max_new_tokens`,
or when its next position would exceed the plan's max context.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from .errors import NinferRuntimeError
from .frontend import StreamDecoder
from .graphs import replay_or_run
from .sampling import SamplingParams, host_rows, require_device_sampling, upload_rows


@dataclass
class GenerationResult:
    index: int
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str | None = None
    finish_reason: str | None = None  # "stop" | "length" | "context"
    logits: list[torch.Tensor] | None = None  # float32 [V] per generated token (return_logits=True)


@dataclass(frozen=True)
class TokenEvent:
    index: int  # which prompt
    token: int
    text: str  # newly decodable text ("" without a tokenizer)
    finished: bool
    finish_reason: str | None


class _Seq:
    def __init__(self, index: int, prompt: list[int], params: SamplingParams, max_new: int, stop: frozenset[int],
                 engine, keep_logits: bool):
        self.index = index
        self.prompt = prompt
        self.params = params
        self.max_new = max_new
        self.stop = stop
        self.slot = -1
        self.pos = 0
        self.result = GenerationResult(index, list(prompt), logits=[] if keep_logits else None)
        self.decoder = StreamDecoder(engine.frontend) if engine.frontend.has_tokenizer else None
        self.done = False


def _is_token_list(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in x)


def normalize_prompts(engine, prompts, chat: bool) -> tuple[list[list[int]], bool]:
    """(token lists, single) from a str, a token list, or a list of either."""
    single = isinstance(prompts, str) or (_is_token_list(prompts) and len(prompts) > 0) or \
        isinstance(prompts, torch.Tensor)
    items = [prompts] if single else list(prompts)
    out = []
    for p in items:
        if isinstance(p, torch.Tensor):
            p = [int(v) for v in p.reshape(-1).tolist()]
        if isinstance(p, str):
            ids = engine.frontend.encode_chat(p) if chat else engine.frontend.encode(p)
        elif _is_token_list(p):
            ids = [int(v) for v in p]
        else:
            raise ValueError(f"a prompt must be a string or a list of token ids, got {type(p).__name__}")
        if not ids:
            raise ValueError("empty prompt")
        V = engine.vocab_rows
        bad = [v for v in ids if not 0 <= v < V]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {V})")
        if len(ids) > engine.max_context:
            raise ValueError(f"prompt of {len(ids)} tokens exceeds the plan's max context {engine.max_context}")
        out.append(ids)
    return out, single


def _sampling(sampling: SamplingParams | None, n: int, *, temperature, top_k, top_p, seed, greedy) -> list[SamplingParams]:
    if sampling is None:
        sampling = SamplingParams(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
                                  seed=int(seed), greedy=greedy)
    # distinct seeds per sequence so C copies of one prompt do not sample identically
    return [SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed + i, sampling.greedy)
            for i in range(n)]


def upload_columns(ids, pos, slots, chunk: list[int], start: int, slot: int) -> None:
    """One prefill chunk's columns into the extent's inputs: token ids, positions start.., the slot
    (one host tensor, three copies)."""
    n = len(chunk)
    host = torch.tensor([chunk, list(range(start, start + n)), [slot] * n], dtype=torch.int32)
    ids[:n].copy_(host[0])
    pos[:n].copy_(host[1])
    slots[:n].copy_(host[2])


def prefill(engine, tokens: list[int], slot: int, params: SamplingParams | None = None, *,
            after_chunk=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the prompt through the prefill extent in chunks into `slot` (reset first); the last
    chunk samples with `params` (None: greedy) for position len(tokens). Returns the last column's
    (logits row [V], sampled id [1]) (device tensor views). `after_chunk(start, n, row)`, when
    given, runs after each chunk (columns start .. start+n-1; `row` = the logits / ids row of the
    chunk's last column) while the chunk's outputs are still in the arena (speculative/rounds.py:
    the MTP prefill chunk); it may return replacement (logits row, id) views for the last chunk."""
    r = engine.prefill_runner
    T = r.t
    engine.reset_slot(slot)
    ids, pos, slots = r.inputs["ids"], r.inputs["positions"], r.inputs["slots"]
    rows = r.inputs.get("logit_rows")
    logits, out = r.outputs["logits"], r.outputs["ids"]
    R = r.inputs["temperature"].shape[0]
    n = len(tokens) - (len(tokens) - 1) // T * T  # columns of the last chunk
    i = 0 if (rows is not None or logits.shape[0] != T) else n - 1  # the row of the last column
    for start in range(0, len(tokens), T):
        chunk = tokens[start:start + T]
        upload_columns(ids, pos, slots, chunk, start, slot)
        if rows is not None:
            rows.fill_(len(chunk) - 1)
        # the last chunk's row i samples with the sequence's parameters; every other row is greedy
        sel = [(None, 0)] * R
        if start + T >= len(tokens):
            sel[i] = (params, len(tokens))
        upload_rows(r, host_rows(sel, R))
        r.run(None if len(chunk) == T else len(chunk))
        if after_chunk is not None:
            got = after_chunk(start, len(chunk), i)
            if got is not None:
                return got
    return logits[i], out[i:i + 1]


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
                *, use_graphs: bool = True, busy=()) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step for columns (token, position, slot), column i sampling with params[i] (None:
    greedy) for position + 1. Returns the device views (logits [len(columns), V], ids [len(columns)]).
    Padding columns go to slots neither in `columns` nor in `busy` (slots holding other sequences).
    Host work: one packed upload of the step's inputs; no sync (the caller reads the ids)."""
    a = len(columns)
    runner = next((r for r in engine.decode_runners if r.concurrency >= a), None)
    if runner is None:
        raise NinferRuntimeError(f"{a} concurrent sequences exceed the plan's largest decode extent "
                                 f"(C={engine.decode_runners[-1].concurrency})")
    C = runner.t
    require_device_sampling(runner)
    used = {s for _, _, s in columns} | set(busy)
    free = [s for s in range(engine.slots) if s not in used]
    if len(free) < C - a:
        raise NinferRuntimeError(f"no free slot left to pad a decode step of {a} columns to C={C}")
    cols = list(columns) + [(0, 0, free[i]) for i in range(C - a)]
    ps = list(params) if params is not None else [None] * a
    host = torch.cat([torch.tensor([[c[0] for c in cols], [c[1] for c in cols], [c[2] for c in cols]],
                                   dtype=torch.int32).reshape(-1),
                      host_rows([(p, c[1] + 1) for p, c in zip(ps, columns)], C)])
    words = _pinned_words(engine, runner, host.numel())
    words.copy_(host)
    nb = words.is_pinned()
    runner.inputs["ids"].copy_(words[0:C], non_blocking=nb)
    runner.inputs["positions"].copy_(words[C:2 * C], non_blocking=nb)
    runner.inputs["slots"].copy_(words[2 * C:3 * C], non_blocking=nb)
    upload_rows(runner, words[3 * C:], non_blocking=nb)
    replay_or_run(engine, runner, use_graphs)
    return runner.outputs["logits"][:a], runner.outputs["ids"][:a]


def stream(engine, prompts, max_new_tokens: int = 32, *, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 1.0, seed: int = 0, greedy: bool | None = None, sampling: SamplingParams | None = None,
           stop_ids: Iterable[int] | None = None, ignore_eos: bool = False, chat: bool = False,
           concurrency: int | None = None, return_logits: bool = False, use_graphs: bool = True,
           spec=None, _results: list | None = None) -> Iterator[TokenEvent]:
    """Yield a `TokenEvent` per generated token, as produced (prompts in order of admission).
    `spec`: speculative decoding on a plan with a draft window (docs/SPECULATIVE.md): "mtp" |
    "ngram" | "none" | None (the plan's default: mtp when it has MTP draft extents, else none) | a
    drafter factory `callable(prompt_tokens) -> drafter` (`.extend(tokens)`, `.propose(k)`)."""
    from .speculative.rounds import resolve_spec

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    mode, factory = resolve_spec(engine, spec)
    token_lists, _single = normalize_prompts(engine, prompts, chat)
    params = _sampling(sampling, len(token_lists), temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                       greedy=greedy)
    for r in (engine.prefill_runner, *engine.decode_runners):
        require_device_sampling(r)
    stop = frozenset(() if ignore_eos else engine.frontend.stop_ids) | frozenset(int(s) for s in (stop_ids or ()))
    limit = engine.max_concurrency if concurrency is None else int(concurrency)
    if not 1 <= limit <= engine.max_concurrency:
        raise ValueError(f"concurrency {limit} is outside the plan's range [1, {engine.max_concurrency}]")
    seqs = [_Seq(i, t, p, max_new_tokens, stop, engine, return_logits) for i, (t, p) in enumerate(zip(token_lists, params))]
    if _results is not None:
        _results.extend(s.result for s in seqs)
    waiting = deque(seqs)
    active: list[_Seq] = []
    free = list(range(engine.slots))
    stats = {"prefill_tokens": 0, "prefill_s": 0.0, "decode_tokens": 0, "decode_s": 0.0, "decode_steps": 0}
    if mode != "none":
        stats["spec"] = {"mode": mode, "k": engine.draft_tokens, "rounds": 0, "lane_rounds": 0, "proposed": 0,
                         "accepted": 0, "tokens": 0, "plain_steps": 0}
    engine.last_stats = stats

    def emit(seq: _Seq, tok: int, logits_row: torch.Tensor | None) -> TokenEvent:
        res = seq.result
        res.tokens.append(tok)
        if res.logits is not None and logits_row is not None:
            res.logits.append(logits_row.float().cpu().clone())
        text = seq.decoder.push(tok) if seq.decoder is not None else ""
        reason = None
        if tok in seq.stop:
            reason = "stop"
        elif len(res.tokens) >= seq.max_new:
            reason = "length"
        elif len(seq.prompt) + len(res.tokens) > engine.max_context:
            reason = "context"  # no cache row left for this token
        if reason:
            seq.done = True
            res.finish_reason = reason
            if seq.decoder is not None:
                text += seq.decoder.flush()
                res.text = seq.decoder.sent
        return TokenEvent(seq.index, tok, text, seq.done, reason)

    if mode != "none":
        yield from _stream_spec(engine, waiting, free, limit, stats, emit, factory, use_graphs)
        return
    def start(seq: _Seq):
        row, tok_dev = prefill(engine, seq.prompt, seq.slot, seq.params)
        return row, int(tok_dev.tolist()[0])  # the one read of the step: the new id

    while waiting or active:
        yield from _admit(waiting, free, active, limit, stats, emit, start)
        if not active:
            continue
        t0 = time.perf_counter()
        logits, ids = decode_step(engine, [(s.result.tokens[-1], s.pos, s.slot) for s in active],
                                  [s.params for s in active], use_graphs=use_graphs)
        toks = ids.tolist()  # the one read of the step: the C new ids (a device->host copy; it syncs)
        stats["decode_s"] += time.perf_counter() - t0
        stats["decode_tokens"] += len(active)
        stats["decode_steps"] += 1
        still = []
        for i, (s, tok) in enumerate(zip(active, toks)):
            s.pos += 1
            yield emit(s, tok, logits[i])
            if s.done:
                free.append(s.slot)
            else:
                still.append(s)
        free.sort()
        active = still


def _admit(waiting, free, active, limit, stats, emit, start) -> Iterator[TokenEvent]:
    """Admission, shared by the plain and the speculative loops: while a sequence waits, a slot is
    free and fewer than `limit` run, take it, prefill it (`start(seq) -> (logits row or None, first
    token)`), emit its first token; a sequence done at once gives its slot back, others join `active`."""
    while waiting and free and len(active) < limit:
        seq = waiting.popleft()
        seq.slot = free.pop(0)
        t0 = time.perf_counter()
        row, tok = start(seq)
        stats["prefill_s"] += time.perf_counter() - t0
        stats["prefill_tokens"] += len(seq.prompt)
        seq.pos = len(seq.prompt)  # the first generated token goes to this position
        yield emit(seq, tok, row)
        if seq.done:
            free.append(seq.slot)
            free.sort()
        else:
            active.append(seq)


def _stream_spec(engine, waiting, free, limit, stats, emit, factory, use_graphs) -> Iterator[TokenEvent]:
    """`stream`'s loop in speculative rounds (speculative/rounds.py): admission = prefill_lane
    (+ MTP prefill chunks); then one `spec_round` per iteration for all active sequences, each
    round's tokens emitted in order until the sequence stops (stop ids / max tokens / context cut
    the emission). stats["spec"]: rounds (verify launches), lane_rounds (sequence rounds),
    proposed / accepted drafts, tokens (emitted by verify rounds), plain_steps (plain launches)."""
    from .speculative.rounds import Lane, prefill_lane, spec_round

    sp = stats["spec"]
    active: list[_Seq] = []
    def start(seq: _Seq):
        keep = seq.result.logits is not None
        seq.lane = Lane(seq.slot, seq.params, factory(list(seq.prompt)) if factory is not None else None,
                        keep_logits=keep)
        row, tok = prefill_lane(engine, seq.lane, seq.prompt)
        return (row if keep else None), tok

    while waiting or active:
        yield from _admit(waiting, free, active, limit, stats, emit, start)
        if not active:
            continue
        t0 = time.perf_counter()
        before = (sp["rounds"], sp["plain_steps"])
        emitted = spec_round(engine, [s.lane for s in active], use_graphs, stats=sp)
        stats["decode_s"] += time.perf_counter() - t0
        stats["decode_steps"] += (sp["rounds"] - before[0]) + (sp["plain_steps"] - before[1])
        still = []
        for s, toks in zip(active, emitted):
            for j, tok in enumerate(toks):
                s.pos += 1
                stats["decode_tokens"] += 1
                if s.lane.last_step == "verify":
                    sp["tokens"] += 1
                yield emit(s, tok, s.lane.logits[j] if s.lane.keep_logits else None)
                if s.done:
                    break
            if s.done:
                free.append(s.slot)
            else:
                still.append(s)
        free.sort()
        active = still


def generate(engine, prompts, max_new_tokens: int = 32, **kw) -> Any:
    """Generate for one prompt (str or token list) -> GenerationResult, or a list of prompts ->
    list[GenerationResult] (in prompt order). Keyword arguments as `stream`."""
    _, single = normalize_prompts(engine, prompts, kw.get("chat", False))
    results: list[GenerationResult] = []
    for _ in stream(engine, prompts, max_new_tokens, _results=results, **kw):
        pass
    for r in results:
        if r.text is None and engine.frontend.has_tokenizer:
            r.text = engine.frontend.decode(r.tokens)
    return results[0] if single else results
