"""The MoE CPU path's figures (issue 32): random Qwen3_5MoeForCausalLM checkpoints packed with the
default recipe (Q4 / Q5 expert banks), compiled for sm 86 and run through their torch implementations.

    PYTHONPATH=.:runtime python bench/bench_moe_cpu.py [--work DIR] [--n-new 64] [--skip-big]

Rows: the tiny MoE model of tests/runtime/test_moe_e2e.py (graphs/tiny-moe.yaml's dims: hidden 96,
8 experts top-2, 4 layers): decode tok/s at C = 1; a larger random MoE (`BIG`: hidden 1024, 64
experts top-8 of 128 rows, 8 layers): the peak resident memory (ru_maxrss) of a fresh process that loads it and
decodes a few tokens (the CPU path's weight layouts are made at first use, so the decode counts),
and that process's decode tok/s. Each row carries the 1-minute load average of the box.
Not a test: numbers depend on the machine; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BIG = dict(vocab_size=1024, hidden_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
           head_dim=128, linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=8,
           linear_num_value_heads=16, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=128,
           shared_expert_intermediate_size=512)
PROMPT = list(range(3, 15))


def row(what: str, value: str, note: str = "") -> None:
    print(f"  {what:<34} {value:>14}  {note} (load {os.getloadavg()[0]:.2f})", flush=True)


def run(*args) -> None:
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        raise SystemExit(f"bench_moe_cpu: {' '.join(map(str, args[:3]))} ... failed ({p.returncode}): "
                         f"{(p.stderr or p.stdout).strip().splitlines()[-1:]}")


def build(work: Path, name: str, overrides: dict) -> tuple[Path, Path]:
    """(artifact, plan) of a random MoE checkpoint with `overrides` on the tiny dims (made once per work dir)."""
    hf, art, plan = work / f"{name}-hf", work / f"{name}.ninfer", work / f"{name}.sm86.plan"
    if not (hf / "model.safetensors").is_file():
        sys.path.insert(0, str(REPO / "tests"))
        from safetensors.torch import save_file

        from reference.hf_tiny_moe import make_hf_moe_model, per_expert

        model = make_hf_moe_model(seed=2, **overrides)
        sd = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
        hf.mkdir(parents=True, exist_ok=True)
        (hf / "config.json").write_text(json.dumps(model.config.to_dict()))
        save_file({k: v.contiguous() for k, v in per_expert(sd).items()}, str(hf / "model.safetensors"))
        del model, sd
    if not art.is_file():
        run(BIN / "ninfer-compile", "pack", hf, "-o", art, "--recipe", "default")
    if not (plan / "plan.json").is_file():
        run(BIN / "ninfer-compile", art, "--sm", "86", "-o", plan, "--quiet", "--max-context", "256",
            "--prefill-chunk", "16", "--concurrency", "1", "--no-binaries")
    return art, plan


def decode_rates(plan: Path, art: Path, n_new: int, repeats: int) -> tuple[list[float], str]:
    """Decode tok/s at C = 1 of `repeats` generations (a busy box's scheduler shows in single runs)."""
    import ninfer_runtime as nr

    rates = []
    with nr.load(plan, art, progress=False) as eng:
        eng.generate(PROMPT, 4, ignore_eos=True)  # first-use work (weight layouts) outside the timing
        for _ in range(repeats):
            eng.generate(PROMPT, n_new, ignore_eos=True)
            st = eng.last_stats
            rates.append(st["decode_tokens"] / st["decode_s"])
        return rates, eng.device_note


def summary(rates: list[float]) -> str:
    r = sorted(rates)
    return f"best {r[-1]:.1f}, median {r[len(r) // 2]:.1f} tok/s"


def child(plan: Path, art: Path, n_new: int, repeats: int) -> None:
    """Load, decode, print {rss_mib, rates} as one JSON line (a fresh process: its own peak)."""
    rates, _ = decode_rates(plan, art, n_new, repeats)
    print(json.dumps({"rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rates": rates}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=REPO / "out" / "bench_moe_cpu", help="scratch directory (kept)")
    ap.add_argument("--n-new", type=int, default=64, help="decode tokens per measurement (default 64)")
    ap.add_argument("--repeats", type=int, default=5, help="timed generations per model (default 5)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--skip-big", action="store_true", help="the tiny model's row only")
    ap.add_argument("--child", nargs=2, type=Path, metavar=("PLAN", "ARTIFACT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.child:
        child(*a.child, a.n_new, a.repeats)
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    print(f"bench_moe_cpu: {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"NINFER_CPU_FUSED={os.environ.get('NINFER_CPU_FUSED', '1')}")
    art, plan = build(a.work, "tiny-moe", {})
    rates, note = decode_rates(plan, art, a.n_new, a.repeats)
    row("tiny MoE: decode C=1", summary(rates), f"{a.repeats} x {a.n_new} tokens; {note}")
    if a.skip_big:
        return 0
    t0 = time.perf_counter()
    art, plan = build(a.work, "big-moe", BIG)
    row("big MoE: build, pack, compile", f"{time.perf_counter() - t0:.0f} s",
        f"hidden {BIG['hidden_size']}, {BIG['num_experts']} experts x {BIG['num_hidden_layers']} layers, "
        f"{art.stat().st_size / 2**20:.0f} MiB artifact")
    p = subprocess.run([sys.executable, __file__, "--child", str(plan), str(art), "--n-new", str(a.n_new // 4),
                        "--repeats", str(a.repeats), *(["--threads", str(a.threads)] if a.threads else [])],
                       capture_output=True, text=True, cwd=REPO, env=os.environ)
    if p.returncode != 0:
        raise SystemExit(f"bench_moe_cpu: the big model's child failed: {p.stderr.strip().splitlines()[-3:]}")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    row("big MoE: peak RSS (load + decode)", f"{got['rss_mib']:.0f} MiB", "ru_maxrss of a fresh process")
    row("big MoE: decode C=1", summary(got["rates"]), f"{a.repeats} x {a.n_new // 4} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
