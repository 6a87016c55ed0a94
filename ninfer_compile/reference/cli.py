"""`ninfer-compile reference ARTIFACT --tokens 1,2,3 --out logits.npy [--contract FILE]`, or
`ninfer-compile reference ARTIFACT --perplexity FILE [--ppl-context N] [--ppl-stride S]`.

Opens the artifact, finds its contract (`--contract`, then `graphs/<model_id>.yaml`, then
`<artifact>.contract.yaml`), checks the artifact against it, runs the float32 reference over the
tokens from position 0 and writes float32 logits `[len(tokens), vocab_rows]` with `numpy.save`.
With `--perplexity` it scores a text file instead (reference/perplexity.py) and prints as its last
line `perplexity P over N scored tokens`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..errors import NinferError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", type=Path, help="the .ninfer artifact")
    parser.add_argument("--tokens", default=None, help="comma-separated token ids, e.g. 1,2,3")
    parser.add_argument("--out", default=None, type=Path, help="output .npy file (float32 [T, vocab_rows])")
    parser.add_argument("--perplexity", type=Path, default=None, metavar="FILE",
                        help="score a UTF-8 text file with the artifact's tokenizer instead of --tokens/--out")
    parser.add_argument("--ppl-context", type=int, default=1024, metavar="N", help="window length (default 1024)")
    parser.add_argument("--ppl-stride", type=int, default=None, metavar="S", help="window step (default N/2)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--contract", type=Path, default=None, help="model contract YAML (default: by model id)")


def parse_tokens(text: str) -> list[int]:
    """'1, 2,3' -> [1, 2, 3]; NinferError (one line) on empty input or a non-integer item."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(t == "" for t in items):
        raise NinferError(f"--tokens: expected comma-separated integers, got {text!r}")
    out = []
    for t in items:
        try:
            out.append(int(t, 10))
        except ValueError:
            raise NinferError(f"--tokens: {t!r} is not an integer") from None
    return out


def run(args) -> int:
    import torch

    from ..artifact.reader import Artifact
    from ..contracts import check_artifact, find_contract
    from .model import ReferenceModel
    from .weights import ArtifactWeights

    if args.perplexity is not None:
        if args.tokens is not None or args.out is not None:
            raise NinferError("--perplexity excludes --tokens/--out")
        return _run_perplexity(args)
    if args.tokens is None or args.out is None:
        raise NinferError("reference needs --tokens and --out (or --perplexity FILE)")
    tokens = parse_tokens(args.tokens)
    with Artifact.open(args.artifact) as artifact:
        spec = find_contract(args.artifact, artifact.model_id, args.contract).resolve_for(artifact)
        check_artifact(artifact, spec)
        vocab = int(spec.dims["vocab_rows"])
        for t in tokens:
            if not 0 <= t < vocab:
                raise NinferError(f"--tokens: token id {t} out of range [0, {vocab}) for {spec.model_id}")
        model = ReferenceModel(spec, ArtifactWeights(artifact))
        with torch.no_grad():
            logits = model.prefill(tokens).numpy().astype(np.float32, copy=False)
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "wb") as f:
            np.save(f, logits)
    except OSError as exc:
        raise NinferError(f"{args.out}: cannot write logits: {exc.strerror or exc}") from None
    print(f"wrote {args.out}: float32 {list(logits.shape)} (argmax of last position: {int(logits[-1].argmax())})")
    return 0


def _run_perplexity(args) -> int:
    from ..artifact.reader import Artifact
    from ..contracts import check_artifact, find_contract
    from .model import ReferenceModel
    from .perplexity import artifact_tokenizer, encode_text, read_text, reference_perplexity
    from .weights import ArtifactWeights

    text = read_text(args.perplexity)
    with Artifact.open(args.artifact) as artifact:
        spec = find_contract(args.artifact, artifact.model_id, args.contract).resolve_for(artifact)
        check_artifact(artifact, spec)
        ids = encode_text(artifact_tokenizer(artifact), text)
        model = ReferenceModel(spec, ArtifactWeights(artifact))
        res = reference_perplexity(model, ids, context=args.ppl_context, stride=args.ppl_stride,
                                   progress=not args.quiet)
    print(res.line())
    return 0
