"""`ninfer-compile reference ARTIFACT --tokens 1,2,3 --out logits.npy [--contract FILE]`.

Opens the artifact, finds its contract (`--contract`, then `graphs/<model_id>.yaml`, then
`<artifact>.contract.yaml`), checks the artifact against it, runs the float32 reference over the
tokens from position 0 and writes float32 logits `[len(tokens), vocab_rows]` with `numpy.save`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..errors import NinferError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", type=Path, help="the .ninfer artifact")
    parser.add_argument("--tokens", required=True, help="comma-separated token ids, e.g. 1,2,3")
    parser.add_argument("--out", required=True, type=Path, help="output .npy file (float32 [T, vocab_rows])")
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
