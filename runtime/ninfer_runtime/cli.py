"""`ninfer-run PLAN --artifact A (--prompt TEXT | --tokens 1,2,3 | --perplexity FILE) [options]`.

Streams the generated text to stdout when the artifact has a tokenizer; the last line printed is
`tokens: <ids>` (the generated ids of sequence 0; with --concurrency C > 1, C copies of the prompt
run together and the other sequences' ids are printed first as `tokens[i]: ...`). Load time and
prefill / decode tokens/s go to stderr. Errors: one line `error: ...`, exit 2.
"""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ninfer-run", description="Run a compiled ninfer plan.")
    p.add_argument("plan", help="plan directory (ARTIFACT.smN.plan)")
    p.add_argument("--artifact", required=True, help="the .ninfer artifact the plan was compiled for")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs the artifact's tokenizer)")
    src.add_argument("--tokens", help="prompt token ids, comma separated")
    src.add_argument("--perplexity", metavar="FILE", help="score a UTF-8 text file; prints `perplexity P over N "
                     "scored tokens` (plan compiled with --prefill-logits all; ninfer_runtime/perplexity.py)")
    p.add_argument("--ppl-context", type=int, default=None, metavar="N",
                   help="--perplexity window length in tokens (default 1024, at most the plan's max context)")
    p.add_argument("--ppl-stride", type=int, default=None, metavar="S",
                   help="--perplexity window step in tokens (default: half the window)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--greedy", action="store_true", help="argmax decoding (default unless --temperature > 0)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=1, help="run C copies of the prompt concurrently")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the artifact's chat template")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop on the artifact's eos ids")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--no-graphs", action="store_true", help="launch decode steps eagerly (no CUDA graph replay)")
    p.add_argument("--quiet", action="store_true", help="no progress bar / timing lines on stderr")
    return p


def _tokens(text: str) -> list[int]:
    try:
        ids = [int(v) for v in text.replace(" ", ",").split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--tokens must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise ValueError("--tokens is empty")
    return ids


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .errors import NinferRuntimeError

    try:
        return _run(args)
    except (NinferRuntimeError, ValueError, OSError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 2


def _run(args) -> int:
    from .loader import load

    if args.perplexity is not None:
        from .perplexity import run_cli

        return run_cli(args)
    if args.greedy and args.temperature > 0:
        raise ValueError("--greedy and --temperature > 0 are exclusive")
    if args.concurrency < 1:
        raise ValueError("--concurrency must be >= 1")
    if args.chat and args.tokens is not None:
        raise ValueError("--chat needs --prompt")
    engine = load(args.plan, args.artifact, device=args.device, progress=not args.quiet)
    try:
        if not args.quiet:
            lt = engine.load_times
            print(f"loaded {args.plan}: {engine.device_note}; {engine.weight_bytes / 2**20:.1f} MiB weights; load "
                  f"{lt['total']:.2f}s (upload {lt['upload']:.2f}s, kernels {lt['kernels']:.2f}s, capture "
                  f"{lt['capture']:.2f}s)", file=sys.stderr)
        if args.prompt is not None:
            if not engine.frontend.has_tokenizer:
                raise ValueError("the artifact has no tokenizer: use --tokens")
            prompt = args.prompt
        else:
            prompt = _tokens(args.tokens)
        prompts = [prompt] * args.concurrency
        results = []
        streaming = engine.frontend.has_tokenizer
        for ev in engine.stream(prompts, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, seed=args.seed, greedy=True if args.greedy else None,
                                ignore_eos=args.ignore_eos, chat=args.chat, concurrency=args.concurrency,
                                use_graphs=not args.no_graphs, _results=results):
            if streaming and ev.index == 0 and ev.text:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
        if streaming:
            sys.stdout.write("\n")
        st = engine.last_stats
        if not args.quiet:
            pf = st["prefill_tokens"] / st["prefill_s"] if st["prefill_s"] else 0.0
            dc = st["decode_tokens"] / st["decode_s"] if st["decode_s"] else 0.0
            print(f"prefill: {st['prefill_tokens']} tokens, {pf:.1f} tok/s; decode: {st['decode_tokens']} tokens in "
                  f"{st['decode_steps']} steps, {dc:.1f} tok/s", file=sys.stderr)
        for r in results[1:]:
            print(f"tokens[{r.index}]: " + " ".join(str(t) for t in r.tokens))
        print("tokens: " + " ".join(str(t) for t in results[0].tokens))
        sys.stdout.flush()
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
