"""Train the project's tiny Qwen3.5-architecture model (and its MTP layer) on the CPU.

    python examples/train_tiny.py OUT_DIR [--seed 0] [--steps 450] [--mtp-steps 150]

Corpus: the top-level `*.py` source files of the standard library of the interpreter running this
script (`sysconfig.get_paths()["stdlib"]`), sorted by name; the files in HELD_OUT are the held-out
split, everything else trains. The held-out text is also written to OUT_DIR/heldout.txt so tests
and `bench/quality.md` never depend on the machine's stdlib.

Steps: (1) a byte-level BPE of 2048 tokens (`tokenizers`), (2) the target `Qwen3_5ForCausalLM`
(AdamW, warm-up + cosine, gradient clipping 1.0), (3) the one MTP layer with the target frozen,
exactly as the reference head defines it (ninfer_compile/reference/mtp.py): column t pairs the
target's final-norm hidden state at t with the embedding of token t+1 and predicts token t+2.
It writes an HF checkpoint directory (bf16 safetensors incl. `mtp.*` under the Qwen3.5 checkpoint
names, config.json with `mtp_num_hidden_layers: 1`, tokenizer files, chat template, generation
config) plus loss_curve.csv, corpus_files.txt (name, bytes, sha256, split) and train_log.json.
Deterministic: same seed, same interpreter and same machine give the same bytes (2 threads).
Training is never part of CI; the committed result lives in examples/tiny-trained/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import sysconfig
import time
from pathlib import Path

# Held-out split: stdlib modules present (with little churn) in Python 3.10-3.13.
HELD_OUT = ("bisect.py", "colorsys.py", "fnmatch.py", "heapq.py", "queue.py", "shlex.py", "string.py",
            "textwrap.py")
# Never trained on: not ordinary hand-written Python source, or too big and repetitive.
EXCLUDED = ("__phello__.foo.py", "_pydecimal.py", "this.py", "antigravity.py")

VOCAB = 2048
SEQ = 256
BATCH = 4
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

MODEL = dict(
    vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=6,
    layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [4, 2, 2], "mrope_interleaved": True},
    tie_word_embeddings=False,
)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def corpus_files(stdlib: Path) -> tuple[list[Path], list[Path]]:
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file() and p.name not in EXCLUDED)
    names = {p.name for p in files}
    missing = [h for h in HELD_OUT if h not in names]
    if missing:
        sys.exit(f"error: {stdlib}: held-out files missing: {', '.join(missing)}")
    held = [p for p in files if p.name in HELD_OUT]
    train = [p for p in files if p.name not in HELD_OUT]
    return train, held


def read_text(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


def build_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def batch(stream, gen, torch):
    starts = torch.randint(0, len(stream) - SEQ - 2, (BATCH,), generator=gen)
    return torch.stack([stream[s:s + SEQ + 1] for s in starts.tolist()])


def windows(ids, torch, width: int = SEQ):
    """Non-overlapping [n, width+1] windows (token i+1 is the label of token i)."""
    n = (len(ids) - 1) // width
    return torch.stack([ids[i * width:i * width + width + 1] for i in range(n)])


class MTPLayer:
    """The MTP head's trainable parts under their checkpoint names (`mtp.*`); embedding and
    output head are the frozen target's (NInfer aliases them to the text ones)."""

    def __init__(self, target, torch):
        import copy

        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm
        cfg = copy.deepcopy(target.config)
        cfg.layer_types = ["full_attention"]
        cfg.num_hidden_layers = 1
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        m = torch.nn.Module()
        m.fc = torch.nn.Linear(2 * H, H, bias=False)
        m.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps)
        m.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps)
        m.layers = torch.nn.ModuleList([Qwen3_5DecoderLayer(cfg, 0)])
        m.norm = Qwen3_5RMSNorm(H, eps)
        with torch.no_grad():  # HF-like init: std 0.02 matrices, zero (= unit) norms
            for name, p in m.named_parameters():
                if p.ndim == 2:
                    p.normal_(0.0, 0.02)
        self.module, self.target, self.torch = m, target, torch

    def logits(self, ids, hidden):
        """ids [B, T]: tokens t+1; hidden [B, T, H]: target final-norm output at t -> [B, T, V]."""
        torch, m, tm = self.torch, self.module, self.target.model
        e = m.pre_fc_norm_embedding(tm.embed_tokens(ids))
        h = m.pre_fc_norm_hidden(hidden)
        x = m.fc(torch.cat([e, h], dim=-1))
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand(ids.shape[0], -1)
        x = m.layers[0](x, position_embeddings=tm.rotary_emb(x, pos), attention_mask=None, position_ids=pos)
        return self.target.lm_head(m.norm(x))


def heldout_loss(model, win, torch) -> float:
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(win), BATCH):
            b = win[i:i + BATCH]
            logits = model(b[:, :-1]).logits
            tot += float(torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), b[:, 1:].reshape(-1),
                                                           reduction="sum"))
            n += b[:, 1:].numel()
    model.train()
    return tot / n


def mtp_loss(mtp, win, torch, *, reduction="mean"):
    """Loss of the MTP head on windows [n, SEQ+1]: hidden at t, token t+1 -> token t+2."""
    with torch.no_grad():
        hidden = mtp.target.model(win[:, :-1]).last_hidden_state     # [n, SEQ, H] final-norm output
    logits = mtp.logits(win[:, 1:-1], hidden[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), win[:, 2:].reshape(-1),
                                             reduction=reduction), logits


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=450)
    ap.add_argument("--mtp-steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--device", default="cpu", help="torch device (default cpu, 2 threads; cuda: deterministic "
                                                   "algorithms, same batches)")
    args = ap.parse_args(argv)

    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    torch.set_num_threads(2)
    # GDN decays drive activations and gradients into subnormal floats as training goes on; on the
    # CPU those run ~100x slower. Flushing them to zero keeps the step time flat (and deterministic).
    torch.set_flush_denormal(True)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        import os
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    train_files, held_files = corpus_files(stdlib)
    train_texts = [read_text(p) for p in train_files]
    held_texts = [read_text(p) for p in held_files]
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus_files.txt", "w", encoding="utf-8") as f:
        f.write(f"# Python {platform.python_version()} stdlib ({stdlib.name}); name bytes sha256 split\n")
        for p, split in [(p, "train") for p in train_files] + [(p, "heldout") for p in held_files]:
            data = p.read_bytes()
            f.write(f"{p.name} {len(data)} {hashlib.sha256(data).hexdigest()} {split}\n")
    # held-out text: files in sorted order, each followed by a blank line (the quality corpus)
    heldout_text = "".join(t if t.endswith("\n") else t + "\n" for t in held_texts)
    (out / "heldout.txt").write_text(heldout_text, encoding="utf-8")

    tok = build_tokenizer(train_texts)
    eot = tok.token_to_id("<|endoftext|>")
    ids = []
    for enc in tok.encode_batch(train_texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    stream = torch.tensor(ids, dtype=torch.long)
    held_ids = torch.tensor(tok.encode(heldout_text, add_special_tokens=False).ids, dtype=torch.long)
    held_win = windows(held_ids, torch).to(dev)
    t_tok = time.perf_counter() - t_start
    print(f"corpus: {len(train_files)} train files ({len(stream)} tokens), {len(held_files)} held-out "
          f"({len(held_ids)} tokens, {len(heldout_text)} chars); tokenizer {tok.get_vocab_size()} ids "
          f"({t_tok:.1f}s)", file=sys.stderr)

    cfg = Qwen3_5TextConfig(**MODEL, eos_token_id=tok.token_to_id("<|im_end|>"), attn_implementation="sdpa")
    torch.manual_seed(args.seed)
    model = Qwen3_5ForCausalLM(cfg).to(dev)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed + 1)
    curve = []
    run_loss, run_n = 0.0, 0
    t0 = time.perf_counter()
    for step in range(args.steps):
        lr = lr_at(step, args.steps, args.lr, warmup=min(100, args.steps // 10 + 1))
        for g in opt.param_groups:
            g["lr"] = lr
        b = batch(stream, gen, torch).to(dev)
        logits = model(b[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), b[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run_loss += loss.item()
        run_n += 1
        last = step + 1 == args.steps
        if (step + 1) % args.eval_every == 0 or last:
            hl = heldout_loss(model, held_win[:16] if not last else held_win, torch)
            row = {"phase": "target", "step": step + 1, "lr": lr, "train_loss": run_loss / run_n,
                   "heldout_loss": hl, "elapsed_s": time.perf_counter() - t_start}
            curve.append(row)
            run_loss, run_n = 0.0, 0
            print(f"step {step + 1}/{args.steps} lr {lr:.2e} train {row['train_loss']:.3f} held-out {hl:.3f} "
                  f"({row['elapsed_s']:.0f}s)", file=sys.stderr)
    t_target = time.perf_counter() - t0
    model.eval()
    final_train = heldout_loss(model, windows(stream[:32 * SEQ + 1], torch).to(dev), torch)  # first 32 windows
    final_held = heldout_loss(model, held_win, torch)

    # MTP: target frozen
    for p in model.parameters():
        p.requires_grad_(False)
    mtp = MTPLayer(model, torch)
    mtp.module.to(dev)
    mparams = list(mtp.module.parameters())
    mopt = torch.optim.AdamW([{"params": [p for p in mparams if p.ndim == 2], "weight_decay": 0.1},
                              {"params": [p for p in mparams if p.ndim != 2], "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95))
    t1 = time.perf_counter()
    run_loss, run_n = 0.0, 0
    for step in range(args.mtp_steps):
        lr = lr_at(step, args.mtp_steps, args.lr, warmup=min(50, args.mtp_steps // 10 + 1))
        for g in mopt.param_groups:
            g["lr"] = lr
        loss, _ = mtp_loss(mtp, batch(stream, gen, torch).to(dev), torch)
        mopt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mparams, 1.0)
        mopt.step()
        run_loss += loss.item()
        run_n += 1
        last = step + 1 == args.mtp_steps
        if (step + 1) % args.eval_every == 0 or last:
            with torch.no_grad():
                hl = float(mtp_loss(mtp, held_win[:16] if not last else held_win, torch)[0])
            row = {"phase": "mtp", "step": step + 1, "lr": lr, "train_loss": run_loss / run_n, "heldout_loss": hl,
                   "elapsed_s": time.perf_counter() - t_start}
            curve.append(row)
            run_loss, run_n = 0.0, 0
            print(f"mtp step {step + 1}/{args.mtp_steps} lr {lr:.2e} train {row['train_loss']:.3f} held-out "
                  f"{hl:.3f} ({row['elapsed_s']:.0f}s)", file=sys.stderr)
    t_mtp = time.perf_counter() - t1
    with torch.no_grad():
        mloss, mlogits = mtp_loss(mtp, held_win, torch)
        mtp_top1 = float((mlogits.argmax(-1) == held_win[:, 2:]).float().mean())

    # checkpoint: bf16 safetensors, text + mtp.* names
    tensors = {n: t.detach().cpu().to(torch.bfloat16).contiguous() for n, t in model.state_dict().items()}
    tensors.update({"mtp." + n: t.detach().cpu().to(torch.bfloat16).contiguous()
                    for n, t in mtp.module.state_dict().items()})
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg_dict = cfg.to_dict()
    cfg_dict.update({"mtp_num_hidden_layers": 1, "dtype": "bfloat16", "architectures": ["Qwen3_5ForCausalLM"]})
    cfg_dict.pop("transformers_version", None)
    cfg_dict.pop("_attn_implementation_autoset", None)
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2, sort_keys=True) + "\n")
    tok.save(str(out / "tokenizer.json"))
    added = {str(tok.token_to_id(s)): {"content": s, "special": True} for s in SPECIALS}
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": added, "eos_token": "<|im_end|>", "bos_token": None,
         "model_max_length": 4096}, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [tok.token_to_id("<|im_end|>"), eot], "do_sample": False}, indent=2) + "\n")
    with open(out / "loss_curve.csv", "w", encoding="utf-8") as f:
        f.write("phase,step,lr,train_loss,heldout_loss\n")
        for r in curve:
            f.write(f"{r['phase']},{r['step']},{r['lr']:.6g},{r['train_loss']:.4f},{r['heldout_loss']:.4f}\n")
    log = {
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__, "tokenizers": __import__("tokenizers").__version__,
        "machine": platform.machine(), "threads": torch.get_num_threads(), "seed": args.seed,
        "device": str(dev) if dev.type == "cpu" else torch.cuda.get_device_name(dev),
        "steps": args.steps, "mtp_steps": args.mtp_steps, "batch": BATCH, "seq": SEQ, "peak_lr": args.lr,
        "train_tokens_corpus": len(stream), "heldout_tokens": len(held_ids),
        "params_target": sum(p.numel() for p in model.parameters()),
        "params_mtp": sum(p.numel() for p in mparams),
        "final_train_loss_fp32": final_train, "final_heldout_loss_fp32": final_held,
        "final_heldout_ppl_fp32": math.exp(final_held),
        "mtp_heldout_loss_fp32": float(mloss), "mtp_heldout_top1_fp32": mtp_top1,
        "time_tokenizer_s": round(t_tok, 1), "time_target_s": round(t_target, 1), "time_mtp_s": round(t_mtp, 1),
        "time_total_s": round(time.perf_counter() - t_start, 1),
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    print(json.dumps(log, indent=2))


if __name__ == "__main__":
    main()
