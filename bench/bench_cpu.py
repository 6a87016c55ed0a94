"""The CPU path's figures (issue 28): plans run on the CPU through their torch implementations.

    python bench/bench_cpu.py [--work DIR] [--skip-08b] [--out bench/results/cpu_<date>.md]

Prints one table (and writes it as Markdown with its provenance when --out is given):
- the trained tiny model (examples/tiny-trained, default recipe, sm 86 plan): decode tok/s at
  C = 1, 2, 4; scoring the whole held-out file (examples/tiny-trained/heldout.txt) through the
  runtime (wall time, perplexity) beside the fp32 reference's perplexity of the same windows;
  speculative decoding (MTP, K = 2) tok/s and acceptance;
- `ninfer-serve` on the CPU (a child process on 127.0.0.1, a free port, bounded waits) answering
  the official `openai` client: first-token latency of a ~100-token prompt and streamed tok/s;
- a random ~0.8B Qwen3.5-architecture checkpoint (hidden 1024 x 24 layers, 3 GDN : 1 attention,
  the Qwen3.5 vocabulary of 248320 rows, tied embeddings) packed with the default recipe: decode
  tok/s beside the CPU's memory-read floor measured in the same run (the packed weight bytes one
  decode step reads / a measured streaming-read bandwidth: a torch sum over a 2 GiB buffer).
Not a test: numbers depend on the machine; nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CKPT = REPO / "examples" / "tiny-trained"
HELDOUT = CKPT / "heldout.txt"
PROMPT_TEXT = "def is_even(n):\n    "
ROWS: list[tuple[str, str, str]] = []  # (what, value, note)


def row(what: str, value: str, note: str = "") -> None:
    ROWS.append((what, value, note))
    print(f"  {what:<46} {value:>16}  {note}", flush=True)


def run(*args, quiet: bool = True) -> str:
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        raise SystemExit(f"bench_cpu: {' '.join(map(str, args[:3]))} ... failed ({p.returncode}): "
                         f"{(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return p.stdout + p.stderr


def compile_plan(art: Path, out: Path, *extra) -> Path:
    if not (out / "plan.json").is_file():
        run(BIN / "ninfer-compile", art, "--sm", "86", "-o", out, "--quiet", *extra)
    return out


def provenance() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpu": model, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine()}


# ----------------------------------------------------------------------------- the tiny model


def tiny_decode(plan: Path, art: Path, n_new: int) -> None:
    import ninfer_runtime as nr

    with nr.load(plan, art, progress=False) as eng:
        ids = eng.frontend.encode(PROMPT_TEXT, add_special_tokens=False)
        row("tiny: load", f"{eng.load_times['total']:.2f} s", eng.device_note)
        eng.generate(ids, 4, ignore_eos=True)  # first-use work (weight layout) outside the timing
        for c in (1, 2, 4):
            if c > eng.max_concurrency:
                continue
            eng.generate([ids] * c if c > 1 else ids, n_new, ignore_eos=True, concurrency=c)
            st = eng.last_stats
            row(f"tiny: decode C={c}", f"{st['decode_tokens'] / st['decode_s']:.1f} tok/s",
                f"{st['decode_tokens']} tokens in {st['decode_steps']} steps; prefill "
                f"{st['prefill_tokens'] / max(st['prefill_s'], 1e-9):.0f} tok/s")


def tiny_perplexity(plan: Path, art: Path, context: int, skip_reference: bool) -> None:
    import ninfer_runtime as nr
    from ninfer_runtime.perplexity import engine_perplexity

    text = HELDOUT.read_text(encoding="utf-8")
    with nr.load(plan, art, progress=False) as eng:
        n_ids = len(eng.frontend.encode(text, add_special_tokens=False))
        t0 = time.perf_counter()
        res = engine_perplexity(eng, text, context=context, progress=True)
        wall = time.perf_counter() - t0
    row("tiny: perplexity, whole held-out file", f"{wall:.1f} s",
        f"{n_ids} tokens, {res.windows} windows of {context}; {res.scored / wall:.0f} scored tok/s; "
        f"perplexity {res.perplexity:.4f}")
    if skip_reference:
        return
    t0 = time.perf_counter()
    out = run(BIN / "ninfer-compile", "reference", art, "--perplexity", HELDOUT, "--ppl-context", context, "--quiet")
    m = re.search(r"perplexity ([0-9.]+) over (\d+)", out)
    if not m:
        raise SystemExit(f"bench_cpu: no perplexity line in the reference's output: {out[-300:]}")
    ref = float(m.group(1))
    row("tiny: perplexity, fp32 reference", f"{ref:.4f}",
        f"{int(m.group(2))} tokens in {time.perf_counter() - t0:.1f} s; runtime / reference - 1 = "
        f"{100 * (res.perplexity / ref - 1):+.3f}%")


def tiny_spec(plan: Path, art: Path, n_new: int) -> None:
    import ninfer_runtime as nr

    with nr.load(plan, art, progress=False) as eng:
        ids = eng.frontend.encode(PROMPT_TEXT, add_special_tokens=False)
        plain = eng.generate(ids, 4, ignore_eos=True, spec="none")
        plain = eng.generate(ids, n_new, ignore_eos=True, spec="none")
        st = eng.last_stats
        row("tiny: decode C=1 (same plan, --spec none)", f"{st['decode_tokens'] / st['decode_s']:.1f} tok/s")
        r = eng.generate(ids, n_new, ignore_eos=True, spec="mtp")
        st, sp = eng.last_stats, eng.last_stats["spec"]
        row(f"tiny: speculative mtp K={sp['k']}", f"{st['decode_tokens'] / st['decode_s']:.1f} tok/s",
            f"acceptance {100 * sp['accepted'] / max(sp['proposed'], 1):.1f}%, "
            f"{sp['tokens'] / max(sp['lane_rounds'], 1):.2f} tokens/round; same tokens as plain: "
            f"{r.tokens == plain.tokens}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_serve(plan: Path, art: Path, n_new: int) -> None:
    """ninfer-serve in a child process (loopback, free port, bounded waits; always killed)."""
    import httpx
    import openai

    port = _free_port()
    proc = subprocess.Popen([str(BIN / "ninfer-serve"), str(plan), "--artifact", str(art), "--port", str(port),
                             "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() - t0 > 180:
                raise SystemExit(f"bench_cpu: ninfer-serve did not come up: {proc.stderr.read()[-500:] if proc.poll() is not None else 'timeout'}")
            time.sleep(0.2)
        row("serve: ready after", f"{time.monotonic() - t0:.1f} s", "process start, load, first /health")
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0)
        model = client.models.list().data[0].id
        import ninfer_runtime as nr

        with nr.load(plan, art, progress=False) as eng:  # a ~100-token prompt of held-out text
            ids = eng.frontend.encode(HELDOUT.read_text(encoding="utf-8"), add_special_tokens=False)[:100]
            prompt = eng.frontend.decode(ids)
            n_prompt = len(eng.frontend.encode(prompt, add_special_tokens=False))
        for attempt in range(2):  # the first request pays first-use costs; report the second
            t0 = time.perf_counter()
            first = last = None
            chunks = 0
            stream = client.completions.create(model=model, prompt=prompt, max_tokens=n_new, temperature=0,
                                               stream=True)
            for ch in stream:
                if ch.choices and ch.choices[0].text:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    chunks += 1
        row("serve: first token, openai client", f"{1000 * (first - t0):.0f} ms", f"{n_prompt}-token prompt, stream")
        row("serve: streamed", f"{(chunks - 1) / max(last - first, 1e-9):.1f} tok/s",
            f"{chunks} chunks after the first token")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# ----------------------------------------------------------------------------- ~0.8B random checkpoint

BIG = dict(vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
           num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_key_head_dim=128,
           linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16,
           linear_conv_kernel_dim=4, tie_word_embeddings=True)


def make_big(out: Path) -> int:
    """A random Qwen3_5ForCausalLM of BIG's shape saved as bf16 safetensors; returns its parameter count."""
    if (out / "model.safetensors").is_file():
        return json.loads((out / "params.json").read_text())["params"]
    sys.path.insert(0, str(REPO / "tests"))
    import reference.hf_tiny as tiny

    model = tiny.make_hf_model(0, **BIG).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, safe_serialization=True)
    (out / "params.json").write_text(json.dumps({"params": n}))
    del model
    return n


def read_bandwidth(gib: float = 2.0, reps: int = 5) -> float:
    """Bytes/s of a streaming read on this CPU: the best of `reps` sums over a buffer much larger than the caches."""
    buf = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    buf.sum()
    best = min(_timed(buf.sum) for _ in range(reps))
    return buf.numel() * 4 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def decode_weight_bytes(eng) -> int:
    """Packed bytes of the weights one C = 1 decode step reads (the embedding table: one row)."""
    r = eng.decode_runners[0]
    names, emb = set(), 0
    for L in r.entry["launches"]:
        for b in L.get("bind") or ():
            if "weight" in b:
                if L["kind"] == "embedding":
                    e = eng.artifact.objects[b["weight"]]
                    emb += e.bytes // int(e.shape[0])
                else:
                    names.add(b["weight"])
    return sum(int(eng.artifact.objects[n].bytes) for n in names) + emb


def big_model(work: Path, n_new: int) -> None:
    import ninfer_runtime as nr

    hf = work / "big-hf"
    t0 = time.perf_counter()
    params = make_big(hf)
    art = work / "big.ninfer"
    if not art.is_file():
        run(BIN / "ninfer-compile", "pack", hf, "-o", art, "--model-id", "qwen3.5-random-0.8b")
    plan = compile_plan(art, work / "big.sm86.plan", "--max-context", "256", "--prefill-chunk", "32",
                        "--concurrency", "1", "--no-binaries")
    row("0.8B: build, pack, compile", f"{time.perf_counter() - t0:.0f} s",
        f"{params / 1e9:.2f}B parameters, hidden {BIG['hidden_size']} x {BIG['num_hidden_layers']} layers")
    with nr.load(plan, art, progress=False) as eng:
        ids = list(range(1000, 1008))
        eng.generate(ids, 2, ignore_eos=True)  # first use: the CPU path's weight layout
        eng.generate(ids, n_new, ignore_eos=True)
        st = eng.last_stats
        tps = st["decode_tokens"] / st["decode_s"]
        nbytes = decode_weight_bytes(eng)
    bw = read_bandwidth()
    floor = bw / nbytes
    row("0.8B: decode C=1", f"{tps:.2f} tok/s", f"{st['decode_tokens']} tokens")
    row("0.8B: memory-read floor", f"{floor:.2f} tok/s",
        f"{nbytes / 2**20:.0f} MiB packed weights per token / {bw / 1e9:.1f} GB/s streaming read")
    row("0.8B: decode / floor", f"{100 * tps / floor:.1f}%")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=REPO / "out" / "bench_cpu", help="scratch directory (kept)")
    ap.add_argument("--n-new", type=int, default=128, help="decode tokens per measurement (default 128)")
    ap.add_argument("--context", type=int, default=1024, help="perplexity window (default 1024)")
    ap.add_argument("--skip-08b", action="store_true", help="skip the ~0.8B checkpoint")
    ap.add_argument("--skip-reference", action="store_true", help="skip the fp32 reference's perplexity")
    ap.add_argument("--out", type=Path, default=None, help="also write the table as Markdown here")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--only-tiny", action="store_true", help="the tiny model's rows only (no serve, no 0.8B)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the children (ninfer-serve) too
    args.work.mkdir(parents=True, exist_ok=True)
    prov = provenance()
    print("bench_cpu: " + ", ".join(f"{k} {v}" for k, v in prov.items()), flush=True)
    art = args.work / "tiny.ninfer"
    t0 = time.perf_counter()
    if not art.is_file():
        run(BIN / "ninfer-compile", "pack", CKPT, "-o", art, "--model-id", "tiny-bench")
    plan = compile_plan(art, args.work / "tiny.sm86.plan", "--max-context", str(max(1024, args.context)),
                        "--prefill-chunk", "128", "--prefill-logits", "all", "--concurrency", "1,2,4", "--no-binaries")
    k2 = compile_plan(art, args.work / "tiny.sm86.k2.plan", "--max-context", "1024", "--prefill-chunk", "128",
                      "--draft-tokens", "2", "--no-binaries")
    row("tiny: pack + compile (2 plans)", f"{time.perf_counter() - t0:.0f} s", "default recipe, sm 86")
    tiny_decode(plan, art, args.n_new)
    tiny_perplexity(plan, art, args.context, args.skip_reference)
    tiny_spec(k2, art, args.n_new)
    if not args.only_tiny:
        tiny_serve(plan, art, args.n_new)
    if not args.skip_08b and not args.only_tiny:
        big_model(args.work, min(args.n_new, 32))
    if args.out is not None:
        lines = [f"# CPU path figures ({prov['date'][:10]})", "",
                 "`python bench/bench_cpu.py` (issue 28): plans run on the CPU through their torch implementations.", "",
                 "Provenance: " + ", ".join(f"{k} {v}" for k, v in prov.items()), "",
                 "| what | value | note |", "| --- | ---: | --- |"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in ROWS]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        print(f"bench_cpu: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
