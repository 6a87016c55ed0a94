"""`ninfer-run PLAN --artifact A (--prompt TEXT | --tokens 1,2,3 | --perplexity FILE) [options]`.

Streams the generated text to stdout when the artifact has a tokenizer; the last line printed is
`tokens: <ids>` (the generated ids of sequence 0; with --concurrency C > 1, C copies of the prompt
run together and the other sequences' ids are printed first as `tokens[i]: ...`). Load time,
prefill / decode tokens/s and why generation stopped (`stopped: eos | max tokens | context full`)
go to stderr. `--concurrency` takes compile's list form too (`1,2,4`): each C in turn, one block
of output per C. `--spec mtp|ngram|none` decodes in speculative rounds on a plan with a draft window
(stderr: `spec mtp K=3: acceptance 56.1%, 2.68 tokens/round, ...`). Errors: one line `error: ...` naming the flag, exit 2; SIGINT exits 130 and
SIGTERM 143, each with one line.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys

from .signal_mask import unblocked

SEED_MAX = 2**63 - 1
CONCURRENCY_MAX = 4096
STOP_WORDS = {"stop": "eos", "length": "max tokens"}  # finish_reason (steps.py) -> the CLI's word


class _Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler (SIGINT raises KeyboardInterrupt)."""


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line `error: ...` (exit 2)."""

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {message} (see ninfer-run --help)", file=sys.stderr)
        sys.exit(2)



def _rate(v: float) -> str:
    """tok/s for the summary line: one decimal, two significant digits below 1 (the interpreter's
    rates are well under 0.1 tok/s and must not print as 0.0)."""
    return f"{v:.1f}" if v >= 1 or v == 0 else f"{v:.2g}"

def _version() -> str:
    from . import __version__

    return f"ninfer-run {__version__}"


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="ninfer-run", description="Run a compiled ninfer plan: load it with its artifact, "
                       "generate from a prompt, stream the text, print the token ids last.")
    p.add_argument("--version", action="version", version=_version(), help="print the runtime version and exit")
    p.add_argument("plan", help="plan directory written by ninfer-compile (ARTIFACT.smN.plan)")
    p.add_argument("--artifact", required=True, help="the .ninfer artifact the plan was compiled for")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text, UTF-8 (needs the artifact's tokenizer)")
    src.add_argument("--tokens", help="prompt token ids, comma separated (e.g. 1,2,3)")
    src.add_argument("--perplexity", metavar="FILE", help="score a UTF-8 text file; prints `perplexity P over N "
                     "scored tokens` (plan compiled with --prefill-logits all; ninfer_runtime/perplexity.py)")
    p.add_argument("--ppl-context", type=int, default=None, metavar="N",
                   help="--perplexity window length in tokens (default 1024, at most the plan's max context)")
    p.add_argument("--ppl-stride", type=int, default=None, metavar="S",
                   help="--perplexity window step in tokens (default: half the window)")
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N",
                   help="stop after N generated tokens (default 32; also stops on eos or a full context)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding (the default unless --temperature > 0)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sample with softmax(logits / T); 0 (default) = greedy")
    p.add_argument("--top-p", type=float, default=None, metavar="P",
                   help="nucleus sampling: keep the smallest set of tokens with probability >= P, in (0, 1] "
                        "(needs --temperature > 0)")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sample among the K most likely tokens, 0 = all (needs --temperature > 0)")
    p.add_argument("--seed", type=_seed, default=0, metavar="S",
                   help=f"sampling seed in [0, 2^63-1] (sequence i uses S+i; default 0)")
    p.add_argument("--concurrency", default="1", metavar="C[,C...]",
                   help="run C copies of the prompt concurrently (default 1); a comma-separated list, as "
                        "given to ninfer-compile, runs each C in turn; each C must be a decode extent's C or "
                        "below the plan's largest")
    p.add_argument("--spec", default=None, metavar="MODE", choices=("mtp", "ngram", "none"),
                   help="speculative decoding (a plan compiled with --draft-tokens K): mtp (the artifact's MTP "
                        "head; the default when the plan has MTP draft extents), ngram (prompt lookup), none "
                        "(plain steps); stderr reports acceptance and tokens per round")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the artifact's chat template")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop on the artifact's eos ids")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--kernels", default=None, choices=("torch", "interpret"),
                   help="on the CPU, what runs the plan's launches: torch (default: the plan's torch "
                        "implementations) or interpret (its Triton kernels under Triton's interpreter, slow); "
                        "a GPU always runs the Triton kernels")
    p.add_argument("--no-graphs", action="store_true", help="launch decode steps eagerly (no CUDA graph replay)")
    p.add_argument("--verify-weights", action="store_true",
                   help="before loading, check the sha256 of every weight payload the plan binds against the "
                        "digests the compiler recorded (reads all weight bytes; refused for a plan without them)")
    p.add_argument("--quiet", action="store_true", help="no progress bar / timing / stop lines on stderr")
    return p


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = None
    if v is None or not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2^63-1], got {text!r}")
    return v


def _tokens(text: str) -> list[int]:
    try:
        ids = [int(v) for v in text.replace(" ", ",").split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--tokens must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise ValueError("--tokens is empty")
    return ids


def concurrency_list(text: str) -> list[int]:
    """`--concurrency` values: one integer or compile's comma-separated list (duplicates dropped,
    order kept)."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            c = int(part)
        except ValueError:
            raise ValueError(f"--concurrency must be an integer or a comma-separated list of integers, "
                             f"got {text!r}") from None
        if not 1 <= c <= CONCURRENCY_MAX:
            raise ValueError(f"--concurrency values must be in [1, {CONCURRENCY_MAX}], got {c}")
        if c not in out:
            out.append(c)
    return out


def _check_prompt_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        byte = ord(bad) - 0xDC00 if 0xDC80 <= ord(bad) <= 0xDCFF else None
        what = f"byte 0x{byte:02x}" if byte is not None else f"code point U+{ord(bad):04X}"
        raise ValueError(f"--prompt is not valid UTF-8 ({what} at character {exc.start})") from None


def check_args(args) -> None:
    """Flag-level checks, with the flags' own names (before anything is loaded)."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.greedy and args.temperature > 0:
        raise ValueError("--greedy and --temperature > 0 are exclusive")
    sampling = args.temperature > 0 and not args.greedy
    if args.top_p is not None:
        if not (math.isfinite(args.top_p) and 0.0 < args.top_p <= 1.0):
            raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
        if not sampling:
            raise ValueError(f"--top-p {args.top_p} needs --temperature > 0 (greedy decoding would ignore it)")
    if args.top_k is not None:
        if args.top_k < 0:
            raise ValueError(f"--top-k must be >= 0, got {args.top_k}")
        if not sampling:
            raise ValueError(f"--top-k {args.top_k} needs --temperature > 0 (greedy decoding would ignore it)")
    if not 0 <= args.seed <= SEED_MAX:  # main(argv) from Python may pass anything through _seed's twin
        raise ValueError(f"--seed must be an integer in [0, 2^63-1], got {args.seed}")
    args.concurrency_values = concurrency_list(args.concurrency)
    if args.chat and args.tokens is not None:
        raise ValueError("--chat needs --prompt")
    if args.prompt is not None:
        _check_prompt_text(args.prompt)
    args.token_ids = _tokens(args.tokens) if args.tokens is not None else None


_SIGNALLED: list[int] = []  # the signals received, in order (see _raise_if_signalled)


def _signal_exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else _Terminated()


def _on_signal(signum, frame):
    _SIGNALLED.append(signum)
    raise _signal_exception(signum)


def _raise_if_signalled() -> None:
    """A handler's exception raised inside a finalizer is printed ('Exception ignored') and dropped by
    Python, and the run would go on: the generation loop re-raises it at the next token."""
    if _SIGNALLED:
        raise _signal_exception(_SIGNALLED[0])


def main(argv: list[str] | None = None) -> int:
    _SIGNALLED.clear()
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with unblocked():  # an inherited mask blocking them would hold the signal back to the end
            return _main(argv)
    except KeyboardInterrupt:
        print("error: interrupted (SIGINT)", file=sys.stderr)
        return 130
    except _Terminated:
        print("error: terminated (SIGTERM)", file=sys.stderr)
        return 143
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _main(argv: list[str] | None) -> int:
    """Parse and run; every error is one line (interrupts are main's)."""
    try:
        args = _parser().parse_args(argv)
        from .errors import NinferRuntimeError
    except SystemExit as exc:  # --help / --version (0) or a usage error already printed in one line (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        check_args(args)
        if args.kernels is None:  # a GPU run: the weights stream to it while torch is being imported
            from .weight_stream import prestart

            prestart(args.plan, args.artifact, args.device)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        from .tensor_parallel import run_cli_ranks

        rc = run_cli_ranks(args)  # a --tp N plan: N rank processes (None: this process runs the plan)
        return _run(args) if rc is None else rc
    except (NinferRuntimeError, ValueError, OSError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - never a traceback; NINFER_TRACEBACK=1 shows it
        import os

        if os.environ.get("NINFER_TRACEBACK"):
            raise
        from .tensor_parallel import await_launcher

        await_launcher()  # a --tp rank: a peer's death (a broken collective) is the launcher's line
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else "(no message)"
        print(f"error: internal error ({type(exc).__name__}: {msg}); NINFER_TRACEBACK=1 shows where", file=sys.stderr)
        return 2


def spec_line(st: dict) -> str:
    """`spec mtp K=3: acceptance 56.1%, 2.68 tokens/round, N tok/s (R rounds, P plain steps)`:
    acceptance = accepted / proposed drafts, tokens per sequence round, decode tok/s (rounds and
    plain steps together)."""
    sp = st["spec"]
    acc = 100.0 * sp["accepted"] / sp["proposed"] if sp["proposed"] else 0.0
    per = sp["tokens"] / sp["lane_rounds"] if sp.get("lane_rounds") else 0.0
    tps = st["decode_tokens"] / st["decode_s"] if st["decode_s"] else 0.0
    r, p = sp["rounds"], sp["plain_steps"]
    return (f"spec {sp['mode']} K={sp['k']}: acceptance {acc:.1f}%, {per:.2f} tokens/round, {tps:.1f} tok/s "
            f"({r} round{'s' if r != 1 else ''}, {p} plain step{'s' if p != 1 else ''})")


def _stop_word(r, max_new_tokens: int) -> str:
    """The CLI's word for a finish reason: "length" short of max_new_tokens is a full context."""
    if r.finish_reason == "length" and len(r.tokens) < max_new_tokens:
        return "context full"
    return STOP_WORDS.get(r.finish_reason or "", r.finish_reason or "unknown")


def _stop_line(results, max_new_tokens: int) -> str:
    """`stopped: eos` (all sequences alike) or `stopped: seq 0 eos, seq 1 max tokens, ...`."""
    reasons = [_stop_word(r, max_new_tokens) for r in results]
    if len(set(reasons)) == 1:
        n = len(results[0].tokens)
        return f"stopped: {reasons[0]} after {n} token{'s' if n != 1 else ''}" + \
            (f" (all {len(results)} sequences)" if len(results) > 1 else "")
    return "stopped: " + ", ".join(f"seq {r.index} {w}" for r, w in zip(results, reasons))


def _run(args) -> int:
    from .loader import load

    if args.perplexity is not None:
        from .perplexity import run_cli

        return run_cli(args)
    engine = load(args.plan, args.artifact, device=args.device, kernels=args.kernels, progress=not args.quiet,
                  verify_weights=args.verify_weights)
    try:
        for c in args.concurrency_values:
            if c > engine.max_concurrency:
                raise ValueError(f"--concurrency {c} exceeds the plan's largest decode extent (C="
                                 f"{engine.max_concurrency}); recompile with --concurrency including {c}")
        if args.prompt is not None:
            if not engine.frontend.has_tokenizer:
                raise ValueError("the artifact has no tokenizer: use --tokens")
            prompt = args.prompt
        else:
            prompt = args.token_ids
            bad = [t for t in prompt if not 0 <= t < engine.vocab_rows]
            if bad:
                raise ValueError(f"--tokens: id {bad[0]} is outside the plan's vocabulary [0, {engine.vocab_rows})")
            if len(prompt) > engine.max_context:
                raise ValueError(f"--tokens: {len(prompt)} ids exceed the plan's max context {engine.max_context}")
        if not args.quiet:
            lt = engine.load_times
            print(f"loaded {args.plan}: {engine.device_note}; {engine.weight_bytes / 2**20:.1f} MiB weights; load "
                  f"{lt['total']:.2f}s (upload {lt['upload']:.2f}s, kernels {lt['kernels']:.2f}s, capture "
                  f"{lt['capture']:.2f}s)" + ("; weights verified" if args.verify_weights else ""), file=sys.stderr)
            from .triton_cache import format_phases

            print(f"load phases: {format_phases(getattr(engine, 'load_phases', {}))}", file=sys.stderr)
        for c in args.concurrency_values:
            _generate(engine, args, prompt, c, several=len(args.concurrency_values) > 1)
        sys.stdout.flush()
    finally:
        engine.close()
    return 0


def _generate(engine, args, prompt, concurrency: int, several: bool) -> None:
    prompts = [prompt] * concurrency
    results: list = []
    streaming = engine.frontend.has_tokenizer
    for ev in engine.stream(prompts, args.max_new_tokens, temperature=args.temperature,
                            top_k=args.top_k or 0, top_p=1.0 if args.top_p is None else args.top_p,
                            seed=args.seed, greedy=True if args.greedy else None, ignore_eos=args.ignore_eos,
                            chat=args.chat, concurrency=concurrency, use_graphs=not args.no_graphs,
                            spec=args.spec, _results=results):
        _raise_if_signalled()
        if streaming and ev.index == 0 and ev.text:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
    if streaming:
        sys.stdout.write("\n")
    st = engine.last_stats
    if not args.quiet:
        head = f"concurrency {concurrency}: " if several else ""
        pf = st["prefill_tokens"] / st["prefill_s"] if st["prefill_s"] else 0.0
        dc = st["decode_tokens"] / st["decode_s"] if st["decode_s"] else 0.0
        print(f"{head}prefill: {st['prefill_tokens']} tokens, {_rate(pf)} tok/s; decode: {st['decode_tokens']} tokens "
              f"in {st['decode_steps']} steps, {_rate(dc)} tok/s", file=sys.stderr)
        if "spec" in st:
            print(head + spec_line(st), file=sys.stderr)
        print(head + _stop_line(results, args.max_new_tokens), file=sys.stderr)
    for r in results[1:]:
        print(f"tokens[{r.index}]: " + " ".join(str(t) for t in r.tokens))
    print("tokens: " + " ".join(str(t) for t in results[0].tokens))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
