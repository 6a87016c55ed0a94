"""Perplexity under the float32 reference: `ninfer-compile reference A --perplexity FILE`.

Same tokenization (the artifact's `frontend/tokenizer.json`, no special tokens added), the same
sliding windows and the same scoring as the runtime's `ninfer-run --perplexity`
(ninfer_runtime/perplexity.py, whose window and scoring functions this module calls), with
`ReferenceModel.prefill` over each window from a fresh state.
"""

from __future__ import annotations

import torch

from ..errors import NinferError

TOKENIZER = "frontend/tokenizer.json"
DEFAULT_CONTEXT = 1024


def artifact_tokenizer(artifact):
    """The artifact's tokenizer (tokenizers.Tokenizer); NinferError when it has none."""
    from tokenizers import Tokenizer

    if TOKENIZER not in artifact.by_name:
        raise NinferError(f"{artifact.path}: no {TOKENIZER} resource: --perplexity needs the artifact's tokenizer")
    try:
        return Tokenizer.from_str(artifact.resource_bytes(TOKENIZER).decode("utf-8"))
    except Exception as exc:  # tokenizers raises plain Exception subclasses on bad JSON
        raise NinferError(f"{artifact.path}: {TOKENIZER}: cannot load tokenizer: {str(exc).splitlines()[0]}") from None


def encode_text(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def reference_perplexity(model, ids: list[int], *, context: int = DEFAULT_CONTEXT, stride: int | None = None,
                         progress: bool = False):
    """PerplexityResult of token ids under `model` (a ReferenceModel)."""
    from ninfer_runtime.perplexity import perplexity_of_ids

    st = max(1, context // 2) if stride is None else int(stride)

    def score(tokens):
        with torch.no_grad():
            return model.prefill(tokens)

    try:
        return perplexity_of_ids(score, ids, context, st, progress=progress, desc="reference perplexity")
    except ValueError as exc:
        raise NinferError(str(exc)) from None


def read_text(path) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as exc:
        raise NinferError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise NinferError(f"{path}: cannot read: {exc.strerror or exc}") from None
