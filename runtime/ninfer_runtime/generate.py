"""Generation: continuous batching of C concurrent sequences over the plan's extents.

Each sequence owns one state slot (KV cache rows, GDN conv + recurrent state) from admission to
its end; a finished sequence frees its slot for the next request. A step of the scheduler:
1. admit waiting requests into free slots: chunked prefill (the plan's prefill extent, chunk by
   chunk, state carried between chunks; a tail chunk runs narrowed to its n columns), then sample
   the first token from the last prompt column's logits;
2. one decode step for all active sequences: the smallest decode extent with C >= active (extra
   columns are padding in distinct free slots, position 0), replayed from its CUDA graph on a GPU;
   each sequence samples its next token from its logits row.
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
from .sampling import SamplingParams, sample_rows


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
        self.gen = params.generator(engine.device)
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


def _sync(engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def upload_columns(ids, pos, slots, chunk: list[int], start: int, slot: int) -> None:
    """One prefill chunk's columns into the extent's inputs: token ids, positions start.., the slot
    (one host tensor, three copies)."""
    n = len(chunk)
    host = torch.tensor([chunk, list(range(start, start + n)), [slot] * n], dtype=torch.int32)
    ids[:n].copy_(host[0])
    pos[:n].copy_(host[1])
    slots[:n].copy_(host[2])


def prefill(engine, tokens: list[int], slot: int) -> torch.Tensor:
    """Run the prompt through the prefill extent in chunks into `slot` (reset first); returns the
    last column's logits row (device tensor view [V])."""
    r = engine.prefill_runner
    T = r.t
    engine.reset_slot(slot)
    ids, pos, slots = r.inputs["ids"], r.inputs["positions"], r.inputs["slots"]
    rows = r.inputs.get("logit_rows")
    logits = r.outputs["logits"]
    n = 0
    for start in range(0, len(tokens), T):
        chunk = tokens[start:start + T]
        n = len(chunk)
        upload_columns(ids, pos, slots, chunk, start, slot)
        if rows is not None:
            rows.fill_(n - 1)
        r.run(None if n == T else n)
    if rows is not None or logits.shape[0] != T:
        return logits[0]
    return logits[n - 1]


def decode_step(engine, columns: list[tuple[int, int, int]], *, use_graphs: bool = True) -> torch.Tensor:
    """One decode step for columns (token, position, slot); returns logits [len(columns), V]."""
    a = len(columns)
    runner = next((r for r in engine.decode_runners if r.concurrency >= a), None)
    if runner is None:
        raise NinferRuntimeError(f"{a} concurrent sequences exceed the plan's largest decode extent "
                                 f"(C={engine.decode_runners[-1].concurrency})")
    C = runner.t
    used = {s for _, _, s in columns}
    free = [s for s in range(engine.slots) if s not in used]
    cols = list(columns) + [(0, 0, free[i]) for i in range(C - a)]
    host = torch.tensor([[c[0] for c in cols], [c[1] for c in cols], [c[2] for c in cols]], dtype=torch.int32)
    runner.inputs["ids"].copy_(host[0])
    runner.inputs["positions"].copy_(host[1])
    runner.inputs["slots"].copy_(host[2])
    replay_or_run(engine, runner, use_graphs)
    return runner.outputs["logits"][:a]


def stream(engine, prompts, max_new_tokens: int = 32, *, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 1.0, seed: int = 0, greedy: bool | None = None, sampling: SamplingParams | None = None,
           stop_ids: Iterable[int] | None = None, ignore_eos: bool = False, chat: bool = False,
           concurrency: int | None = None, return_logits: bool = False, use_graphs: bool = True,
           _results: list | None = None) -> Iterator[TokenEvent]:
    """Yield a `TokenEvent` per generated token, as produced (prompts in order of admission)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    token_lists, _single = normalize_prompts(engine, prompts, chat)
    params = _sampling(sampling, len(token_lists), temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                       greedy=greedy)
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

    while waiting or active:
        while waiting and free and len(active) < limit:
            seq = waiting.popleft()
            seq.slot = free.pop(0)
            t0 = time.perf_counter()
            row = prefill(engine, seq.prompt, seq.slot)
            tok = sample_rows(row[None], [seq.params], [seq.gen])[0]
            _sync(engine)
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
        logits = decode_step(engine, [(s.result.tokens[-1], s.pos, s.slot) for s in active], use_graphs=use_graphs)
        toks = sample_rows(logits, [s.params for s in active], [s.gen for s in active])
        _sync(engine)
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
