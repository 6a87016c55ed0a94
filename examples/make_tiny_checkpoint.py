"""Write a tiny random Qwen3.5-architecture Hugging Face checkpoint, with a real tokenizer.

For parity tests (the demo uses the trained examples/tiny-trained/ instead): a 4-layer hybrid model (3 Gated DeltaNet layers + 1 gated
attention layer, hidden 96 — deliberately not a multiple of 128) whose shapes exercise the same
code paths as qwen3.6-27b. Weights are random (seeded), so generated text is gibberish; the point
is that every stage runs end to end on a CPU in seconds.

    python examples/make_tiny_checkpoint.py OUT_DIR [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# A small embedded corpus for the byte-level BPE tokenizer (no download needed).
CORPUS = """\
The quick brown fox jumps over the lazy dog. A compiler turns a model into a plan, and a runtime
turns the plan into tokens. Gated DeltaNet layers keep a recurrent state; attention layers keep a
key-value cache. Route tables map token columns to kernels, measured on each card.
Hello world! How are you today? I am a tiny model with random weights.
""" * 4

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer=trainer)
    return tok, specials


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(args.seed)
    vocab_rows = 512
    tok, specials = build_tokenizer(vocab_rows - 16)
    eos = tok.token_to_id("<|im_end|>")
    config = Qwen3_5TextConfig(
        vocab_size=vocab_rows,
        hidden_size=96,
        intermediate_size=160,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=24,
        rms_norm_eps=1e-6,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    model = Qwen3_5ForCausalLM(config).eval()
    # Random init leaves norms at 0 (zero-centred) and A_log/dt_bias tame; scale the matrices up a
    # little so the logits are not all flat and greedy decoding is not a sea of near-ties.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.mul_(2.5)
            elif name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.normal_(0.0, 0.1)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save(str(args.out / "tokenizer.json"))
    added = {str(tok.token_to_id(s)): {"content": s, "special": True} for s in specials}
    (args.out / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": added, "eos_token": "<|im_end|>"}, indent=2) + "\n"
    )
    (args.out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (args.out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [eos, tok.token_to_id("<|endoftext|>")]}, indent=2) + "\n"
    )
    print(f"wrote tiny Qwen3.5 checkpoint to {args.out} (vocab {vocab_rows}, 4 layers, seed {args.seed})")


if __name__ == "__main__":
    main()
