"""Perplexity of a text under a plan: `ninfer-run PLAN --artifact A --perplexity FILE`.

The text is tokenized with the artifact's tokenizer (no special tokens added) and every token after
the first is scored once. Texts longer than the context are scored with sliding windows
(`score_windows`): each window of at most `context` tokens starts `stride` tokens after the previous
one and scores only the tokens no earlier window scored, so every scored token sees at least
`context - stride` tokens of history (all of it in the first window). Each window is a fresh
prefill of slot 0 (prefill chunks of the plan's extent T); the scores need the logits of every
column, which a plan has only when compiled with `--prefill-logits all`.

perplexity = exp(sum of -log p(token | history) / scored tokens), log-softmax in float32 over the
plan's (bf16) logits.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch

from .errors import NinferRuntimeError
from .steps import upload_columns
from .sampling import greedy_rows

# The compile option that makes the prefill extent return every column's logits.
PREFILL_LOGITS_OPTION = "--prefill-logits all"
# Window length when none is given (capped by the plan's max context); stride default: half of it.
DEFAULT_CONTEXT = 1024


@dataclass(frozen=True)
class Window:
    begin: int         # first token of the window (its history starts here)
    end: int           # one past the window's last token
    first_target: int  # first token the window scores (the ones before were scored already)


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    scored: int        # tokens scored (every token after the first)
    nll_sum: float     # sum of -log p over the scored tokens (nats)
    windows: int

    def line(self) -> str:
        return f"perplexity {self.perplexity:.4f} over {self.scored} scored tokens"


def score_windows(n_tokens: int, context: int, stride: int) -> list[Window]:
    """Windows that together score tokens 1..n_tokens-1 exactly once (see the module docstring)."""
    if context < 2:
        raise ValueError(f"--ppl-context must be >= 2, got {context}")
    if not 1 <= stride <= context - 1:
        raise ValueError(f"--ppl-stride must be in [1, {context - 1}] (below --ppl-context {context}), got {stride}")
    if n_tokens < 2:
        raise ValueError(f"the text has {n_tokens} token(s): perplexity needs at least 2")
    out, begin, scored_to = [], 0, 1
    while True:
        end = min(begin + context, n_tokens)
        out.append(Window(begin, end, scored_to))
        scored_to = end
        if end == n_tokens:
            return out
        begin += stride


def nll_of_rows(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Sum of -log softmax(logits[i])[targets[i]] in float64 over float32 log-softmax rows."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    return -float(lp.gather(1, targets.view(-1, 1).to(torch.long)).double().sum())


def check_plan(plan: dict) -> None:
    """A plan returns all-position prefill logits only when compiled with --prefill-logits all."""
    mode = (plan.get("options") or {}).get("prefill_logits", "last")
    if mode != "all":
        raise NinferRuntimeError(f"--perplexity needs all-position prefill logits: this plan was compiled with "
                                 f"prefill_logits={mode!r}; recompile it with `ninfer-compile ... "
                                 f"{PREFILL_LOGITS_OPTION}`")


def prefill_all_logits(engine, tokens: list[int], slot: int = 0) -> torch.Tensor:
    """Every column's logits [len(tokens), V] (float32, host) of a fresh prefill of `slot`."""
    r = engine.prefill_runner
    T = r.t
    engine.reset_slot(slot)
    ids, pos, slots = r.inputs["ids"], r.inputs["positions"], r.inputs["slots"]
    logits = r.outputs["logits"]
    if logits.shape[0] != T or "logit_rows" in r.inputs:
        check_plan(engine.plan)  # names the option; a plan claiming "all" with [1, V] logits is broken
        raise NinferRuntimeError(f"prefill extent returns {logits.shape[0]} logits rows for T={T} columns")
    rows = []
    for start in range(0, len(tokens), T):
        chunk = tokens[start:start + T]
        n = len(chunk)
        upload_columns(ids, pos, slots, chunk, start, slot)
        greedy_rows(r)  # the plan's sampling launch, if any, takes its cheapest path
        r.run(None if n == T else n)
        rows.append(logits[:n].float().cpu())
    return torch.cat(rows)


def perplexity_of_ids(score_window, ids: list[int], context: int, stride: int, *, progress: bool = False,
                      desc: str = "perplexity") -> PerplexityResult:
    """`score_window(tokens) -> logits [len(tokens), V]` run over the sliding windows of `ids`."""
    wins = score_windows(len(ids), context, stride)
    total, scored = 0.0, 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(ids) - 1, unit="tok", desc=desc, file=sys.stderr, dynamic_ncols=True, leave=False)
    try:
        for w in wins:
            logits = score_window(ids[w.begin:w.end])
            # column j predicts token begin + j + 1; this window scores targets first_target..end-1
            lo = w.first_target - 1 - w.begin
            tgt = torch.tensor(ids[w.first_target:w.end], dtype=torch.long)
            total += nll_of_rows(logits[lo:lo + len(tgt)], tgt)
            scored += len(tgt)
            if bar is not None:
                bar.update(len(tgt))
    finally:
        if bar is not None:
            bar.close()
    return PerplexityResult(math.exp(total / scored), scored, total, len(wins))


def read_text(path) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as exc:
        raise NinferRuntimeError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise NinferRuntimeError(f"{path}: cannot read: {exc.strerror or exc}") from None


def engine_perplexity(engine, text: str, *, context: int | None = None, stride: int | None = None,
                      progress: bool = False) -> PerplexityResult:
    """Perplexity of `text` under a loaded engine (context default: DEFAULT_CONTEXT, at most the
    plan's max context; stride default: half the context)."""
    check_plan(engine.plan)
    if not engine.frontend.has_tokenizer:
        raise NinferRuntimeError("--perplexity needs the artifact's tokenizer (frontend/tokenizer.json)")
    ctx = min(DEFAULT_CONTEXT, engine.max_context) if context is None else int(context)
    if ctx > engine.max_context:
        raise ValueError(f"--ppl-context {ctx} exceeds the plan's max context {engine.max_context}")
    st = max(1, ctx // 2) if stride is None else int(stride)
    ids = engine.frontend.encode(text, add_special_tokens=False)
    return perplexity_of_ids(lambda toks: prefill_all_logits(engine, toks), ids, ctx, st, progress=progress)


def run_cli(args) -> int:
    """`ninfer-run PLAN --artifact A --perplexity FILE [--ppl-context N] [--ppl-stride S]`."""
    from .loader import load, read_plan

    if args.chat:
        raise ValueError("--chat does not apply to --perplexity (the file is scored as it is)")
    plan, _ = read_plan(args.plan)
    check_plan(plan)  # before any weight is uploaded
    text = read_text(args.perplexity)
    engine = load(args.plan, args.artifact, device=args.device, progress=not args.quiet,
                  verify_weights=bool(getattr(args, "verify_weights", False)))
    try:
        res = engine_perplexity(engine, text, context=args.ppl_context, stride=args.ppl_stride,
                                progress=not args.quiet)
        if not args.quiet:
            print(f"scored {args.perplexity} in {res.windows} window(s) with {engine.device_note}; "
                  f"mean NLL {res.nll_sum / res.scored:.5f} nats/token", file=sys.stderr)
        print(res.line())
        sys.stdout.flush()
    finally:
        engine.close()
    return 0
