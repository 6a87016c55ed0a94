"""The committed trained tiny model (examples/tiny-trained/) for the quality tests: its held-out
text, packed artifacts (bf16 and the default quantized recipe), the reference model over them and
HF transformers over the checkpoint itself."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "examples" / "tiny-trained"
HELDOUT = CKPT / "heldout.txt"
QUALITY_MD = REPO / "bench" / "quality.md"


def heldout_text() -> str:
    return HELDOUT.read_text(encoding="utf-8")


def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(CKPT / "tokenizer.json"))


def heldout_ids() -> list[int]:
    return list(tokenizer().encode(heldout_text(), add_special_tokens=False).ids)


def slice_text(n_tokens: int) -> str:
    """The text of the held-out corpus's first n_tokens tokens (decoded; every scorer then
    tokenizes this slice itself, so all of them score the same tokens)."""
    return tokenizer().decode(heldout_ids()[:n_tokens])


def pack(out: Path, recipe: str) -> Path:
    from ninfer_compile.convert.hf import pack_hf

    pack_hf(CKPT, out, recipe=recipe, model_id=f"tiny-trained-{recipe}", progress=False)
    return out


def reference_model(artifact: Path):
    from ninfer_compile.artifact import Artifact
    from ninfer_compile.contracts import find_contract
    from ninfer_compile.reference import ArtifactWeights, ReferenceModel

    art = Artifact.open(artifact)
    spec = find_contract(art.path, art.model_id, None).resolve_for(art)
    return ReferenceModel(spec, ArtifactWeights(art))


def hf_model():
    """Qwen3_5ForCausalLM over the committed checkpoint, float32 (the bf16 weights upcast), eager."""
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    return Qwen3_5ForCausalLM.from_pretrained(str(CKPT), dtype=torch.float32, attn_implementation="eager").eval()


def hf_scorer(model):
    import torch

    def score(tokens):
        with torch.no_grad():
            return model(torch.tensor([list(tokens)]), use_cache=False).logits[0].float()

    return score


def config() -> dict:
    return json.loads((CKPT / "config.json").read_text())
