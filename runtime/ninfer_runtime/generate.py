"""Generation: continuous batching of C concurrent sequences over the plan's extents, driven
through the step API (steps.py `Stepper`, which `ninfer-serve` drives too).

Each sequence owns one state slot (KV cache rows, GDN conv + recurrent state) from admission to
its end; a finished sequence frees its slot for the next request. A step of the loop:
1. admit waiting requests into free slots: chunked prefill (the plan's prefill extent, chunk by
   chunk, state carried between chunks; a tail chunk runs narrowed to its n columns); the
   extent's sampling launch picks the first token from the last prompt column's logits;
2. one decode step for all active sequences: the smallest decode extent with C >= active (extra
   columns are padding in free slots, position 0, greedy), replayed from its CUDA graph on a GPU;
   its sampling launch picks every column's next token with that sequence's parameters
   (sampling.py: per-row device inputs), so the step's only device->host transfer is the read of
   the C new ids (what streaming and stopping need), and its inputs go up in one pinned buffer.
With `spec=` (a plan with a draft window K; speculative/rounds.py, docs/SPECULATIVE.md) step 2 is
a speculative round instead: all active sequences verify their last token + K drafts together and
each emits accepted + 1 tokens, in order until it stops (a sequence too close to the context end
takes a plain step). A sequence stops by `steps.finish_reason`: "stop" on a stop id (the
artifact's eos ids, plus `stop_ids`), "length" after `max_new_tokens` or when prompt + generated
tokens fill the plan's max context.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from .frontend import StreamDecoder
from .sampling import SamplingParams, require_device_sampling
from .steps import Stepper, decode_step, finish_reason, prefill  # noqa: F401 (prefill, decode_step: the step API)


@dataclass
class GenerationResult:
    index: int
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str | None = None
    finish_reason: str | None = None  # "stop" | "length" (steps.finish_reason)
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


def stream(engine, prompts, max_new_tokens: int = 32, *, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 1.0, seed: int = 0, greedy: bool | None = None, sampling: SamplingParams | None = None,
           stop_ids: Iterable[int] | None = None, ignore_eos: bool = False, chat: bool = False,
           concurrency: int | None = None, return_logits: bool = False, use_graphs: bool = True,
           spec=None, _results: list | None = None) -> Iterator[TokenEvent]:
    """Yield a `TokenEvent` per generated token, as produced (prompts in order of admission).
    `spec`: speculative decoding on a plan with a draft window (docs/SPECULATIVE.md): "mtp" |
    "ngram" | "none" | None (the plan's default: mtp when it has MTP draft extents, else none) | a
    drafter factory `callable(prompt_tokens) -> drafter` (`.extend(tokens)`, `.propose(k)`)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    steps = Stepper(engine, spec=spec, use_graphs=use_graphs, keep_logits=return_logits)
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
    if steps.speculative:
        steps.stats.update({"mode": steps.spec_mode, "k": engine.draft_tokens, "rounds": 0, "lane_rounds": 0,
                            "proposed": 0, "accepted": 0, "tokens": 0, "plain_steps": 0})
        stats["spec"] = steps.stats
    engine.last_stats = stats

    def emit(seq: _Seq, tok: int, logits_row: torch.Tensor | None) -> TokenEvent:
        res = seq.result
        res.tokens.append(tok)
        if res.logits is not None and logits_row is not None:
            res.logits.append(logits_row.float().cpu().clone())
        text = seq.decoder.push(tok) if seq.decoder is not None else ""
        reason = finish_reason(tok, len(res.tokens), len(seq.prompt), stop_ids=seq.stop, max_tokens=seq.max_new,
                               max_context=engine.max_context)
        if reason:
            seq.done = True
            res.finish_reason = reason
            steps.release(seq.slot)
            if seq.decoder is not None:
                text += seq.decoder.flush()
                res.text = seq.decoder.sent
        return TokenEvent(seq.index, tok, text, seq.done, reason)

    while waiting or active:
        # admission: a waiting sequence takes a free slot (while fewer than `limit` run), its prompt is
        # prefilled and its first token emitted; a sequence done at once gives its slot back
        while waiting and free and len(active) < limit:
            seq = waiting.popleft()
            seq.slot = free.pop(0)
            t0 = time.perf_counter()
            row, tok = steps.admit(seq.slot, seq.prompt, seq.params)
            stats["prefill_s"] += time.perf_counter() - t0
            stats["prefill_tokens"] += len(seq.prompt)
            seq.pos = len(seq.prompt)  # the first generated token goes to this position
            yield emit(seq, tok, row)
            if seq.done:
                free.append(seq.slot)
                free.sort()
            else:
                active.append(seq)
        if not active:
            continue
        t0 = time.perf_counter()
        n0 = steps.launches
        outs = steps.step([(s.result.tokens[-1], s.pos, s.slot) for s in active], (), [s.params for s in active])
        stats["decode_s"] += time.perf_counter() - t0
        stats["decode_steps"] += steps.launches - n0
        still = []
        for s, out in zip(active, outs):
            for j, tok in enumerate(out.tokens):  # a round's tokens in order, until the sequence stops
                s.pos += 1
                stats["decode_tokens"] += 1
                if out.verified:
                    steps.stats["tokens"] += 1
                yield emit(s, tok, out.rows[j] if out.rows is not None else None)
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
