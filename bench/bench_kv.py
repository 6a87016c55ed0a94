"""KV-cache formats (kernels/kv_cache/formats.py): speed per format vs bf16, attention error vs a
float64 oracle, perplexity of the trained tiny model.

    python bench/bench_kv.py --out bench/results            # GPU: decode at 4K / 32K depth, prefill,
                                                            #   append, per format vs bf16 + the oracle error
    python bench/bench_kv.py --dry --out /tmp/kv            # CPU: the same code paths at tiny shapes under
                                                            #   the Triton interpreter (no timings; a test runs it)
    python bench/bench_kv.py --quality --out bench/results  # CPU: perplexity per format (HF transformers with
                                                            #   the format's quantize -> dequantize on K / V)

Shapes (GPU): the 27B's attention, Hq = 24, Hkv = 4, D = 256. Decode: one column per sequence at
depth 4K and 32K, C = 1 and 4, CUDA-graph replay, best of a small split sweep. Prefill: a 1024-column
chunk at depth 0 and one ending at 4K. Append: T = 1 and 1024. Caches are filled by the format's own
kv_append kernel from Gaussian K / V with outlier channels.

Oracle error: relative RMS error of the attention output against float64 attention over the
unquantized (bf16) K / V, on K with outlier channels (4 channels x 20) and V with outlier channels
(2 channels x 8); `format` = the format's own error (quantize -> dequantize -> float64 attention),
`kernel` = what the route's kernel returns. Writes kv_formats.json / .md (GPU), kv_dry.json (--dry),
kv_quality.json / .md (--quality).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from ninfer_compile.kernels.kv_cache import formats as F  # noqa: E402
from ninfer_compile.kernels.kv_cache import reference as R  # noqa: E402

HQ, HKV, D = 24, 4, 256
CONTEXT, STRIDE = 512, 384  # bench/quality.py's protocol (bench/quality.md)


def make_caches(name, slots_n, ctx, hkv, d, device):
    bufs = [torch.zeros(s, dtype=R._TORCH[dt], device=device)
            for _, s, dt in F.cache_buffers(F.FORMATS[name], slots_n, ctx, hkv, d)]
    return bufs + [None] * (4 - len(bufs))


def outlier_kv(n, hkv, d, gen, device):
    """Gaussian K / V [n, hkv, d] with outlier channels (K: 4 channels x 20, V: 2 channels x 8)."""
    k = torch.randn(n, hkv, d, generator=gen)
    v = torch.randn(n, hkv, d, generator=gen)
    k[..., [3, 17, d // 2 + 5, d - 9]] *= 20.0
    v[..., [1, d // 3]] *= 8.0
    return k.bfloat16().to(device), v.bfloat16().to(device)


def fill(name, k, v, slots_n, device, chunk=1024):
    """Caches of format `name` holding k, v [ctx, hkv, d] in slot 0 (every slot when slots_n > 1),
    written by the format's kv_append kernel in chunks."""
    from ninfer_compile.kernels.kv_cache import launch as kv_launch

    ctx, hkv, d = k.shape
    caches = make_caches(name, slots_n, ctx, hkv, d, device)
    for s in range(slots_n):
        for a in range(0, ctx, chunk):
            b = min(ctx, a + chunk)
            pos = torch.arange(a, b, dtype=torch.int32, device=device)
            sl = torch.full((b - a,), s, dtype=torch.int32, device=device)
            kv_launch.kv_append(k[a:b], v[a:b], pos, sl, *caches)
    return caches


def oracle_f64(q, gate, k, v, scale):
    """float64 gated attention of q [T, Hq, D] (every column at the last position) over k, v [n, Hkv, D]."""
    rep = q.shape[1] // k.shape[1]
    K = k.double().repeat_interleave(rep, 1)
    V = v.double().repeat_interleave(rep, 1)
    s = torch.einsum("thd,nhd->thn", q.double(), K) * scale
    o = torch.einsum("thn,nhd->thd", torch.softmax(s, -1), V) * torch.sigmoid(gate.double())
    return o.reshape(q.shape[0], -1)


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def oracle_errors(ctx: int, device: str, names=F.KV_DTYPES, seed: int = 0) -> dict:
    """Per format: the attention output's relative error vs the float64 oracle at the 27B head shape
    (decode, one column at depth ctx): the format's own (quantize -> dequantize) and the kernel's."""
    from ninfer_compile.kernels.attention import launch

    gen = torch.Generator().manual_seed(seed)
    k, v = outlier_kv(ctx, HKV, D, gen, device)
    q = torch.randn(1, HQ, D, generator=gen).bfloat16().to(device)
    gate = torch.randn(1, HQ, D, generator=gen).bfloat16().to(device)
    scale = D ** -0.5
    want = oracle_f64(q.cpu(), gate.cpu(), k.cpu(), v.cpu(), scale)
    out = {}
    for name in names:
        fmt = F.FORMATS[name]
        kq, vq = R.roundtrip(fmt, k.cpu(), v.cpu())
        own = rel(oracle_f64(q.cpu(), gate.cpu(), kq, vq, scale), want)
        kc, vc, ks, vs = fill(name, k, v, 1, device)
        o = torch.empty(1, HQ * D, dtype=torch.bfloat16, device=device)
        split = 512 if ctx > 512 else ctx
        ws = torch.empty(max(1, launch.decode_workspace_numel(1, HQ, D, ctx, split)), device=device)
        pos = torch.full((1,), ctx - 1, dtype=torch.int32, device=device)
        sl = torch.zeros(1, dtype=torch.int32, device=device)
        launch.attention_decode(q, gate, kc, vc, pos, sl, o, workspace=ws, k_scale=ks, v_scale=vs,
                                split_tokens=split, block_n=64 if ctx >= 64 else 16)
        out[name] = {"format": own, "kernel": rel(o.cpu(), want)}
    return out


# ------------------------------------------------------------------ GPU timings

def gpu_bench(res: dict, save=lambda: None) -> None:
    from _common import pick_best, timed, eager, try_config
    from ninfer_compile.kernels.attention import launch
    from ninfer_compile.kernels.kv_cache import launch as kv_launch

    dev = "cuda"
    gen = torch.Generator().manual_seed(1)
    for ctx in (4096, 32768):
        k, v = outlier_kv(ctx, HKV, D, gen, dev)
        for name in F.KV_DTYPES:
            for C in (1, 4):
                caches = fill(name, k, v, C, dev)
                q = torch.randn(C, HQ, D, device=dev).bfloat16()
                gate = torch.randn(C, HQ, D, device=dev).bfloat16()
                o = torch.empty(C, HQ * D, dtype=torch.bfloat16, device=dev)
                sl = torch.arange(C, dtype=torch.int32, device=dev)
                pos = torch.full((C,), ctx - 1, dtype=torch.int32, device=dev)
                row = {"ctx": ctx, "C": C, "kv": name, "configs": {},
                       "kv_bytes": C * ctx * HKV * F.FORMATS[name].row_bytes(D)}
                for split in (512, 1024, 2048):
                    ws = torch.empty(max(1, launch.decode_workspace_numel(C, HQ, D, ctx, split)), device=dev)
                    fn = lambda ws=ws, split=split: launch.attention_decode(  # noqa: E731
                        q, gate, caches[0], caches[1], pos, sl, o, workspace=ws, k_scale=caches[2],
                        v_scale=caches[3], split_tokens=split)
                    try_config(row, f"s{split}", fn)
                pick_best(row)
                res["decode"].append(row)
                print(f"decode ctx={ctx} C={C} {name}: {row['ours_us']:.1f} us ({row['best_config']})", flush=True)
                del caches
        del k, v
        torch.cuda.empty_cache()
        save()
    T = 1024
    for depth in (0, 3072):
        k, v = outlier_kv(depth + T, HKV, D, gen, dev)
        for name in F.KV_DTYPES:
            caches = fill(name, k, v, 1, dev)
            q = torch.randn(T, HQ, D, device=dev).bfloat16()
            gate = torch.randn(T, HQ, D, device=dev).bfloat16()
            o = torch.empty(T, HQ * D, dtype=torch.bfloat16, device=dev)
            sl = torch.zeros(T, dtype=torch.int32, device=dev)
            pos = torch.arange(depth, depth + T, dtype=torch.int32, device=dev)
            row = {"T": T, "depth": depth, "kv": name, "configs": {}}
            for bm, bn, nw in ((64, 32, 8), (128, 32, 8), (64, 64, 8)):
                fn = lambda bm=bm, bn=bn, nw=nw: launch.attention_prefill(  # noqa: E731
                    q, gate, caches[0], caches[1], pos, sl, o, k_scale=caches[2], v_scale=caches[3],
                    block_m=bm, block_n=bn, num_warps=nw)
                try_config(row, f"m{bm}_n{bn}_w{nw}", fn, measure=eager)
            pick_best(row)
            res["prefill"].append(row)
            print(f"prefill T={T} depth={depth} {name}: {row['ours_us']:.1f} us ({row['best_config']})", flush=True)
        save()
    for t in (1, 1024):
        k, v = outlier_kv(t, HKV, D, gen, dev)
        for name in F.KV_DTYPES:
            caches = make_caches(name, 1, 4096, HKV, D, dev)
            pos = torch.arange(t, dtype=torch.int32, device=dev)
            sl = torch.zeros(t, dtype=torch.int32, device=dev)
            row = {"T": t, "kv": name, "configs": {}}
            try_config(row, "default", lambda: kv_launch.kv_append(k, v, pos, sl, *caches))
            pick_best(row)
            res["append"].append(row)
            print(f"append T={t} {name}: {row['ours_us']:.1f} us", flush=True)
    save()
    for ctx in (4096, 32768):
        res["oracle"][str(ctx)] = oracle_errors(ctx, dev)
        print(f"oracle ctx={ctx}: {json.dumps(res['oracle'][str(ctx)])}", flush=True)
        save()


def markdown(res: dict) -> str:
    e = res.get("env", {})
    lines = [f"# KV formats on {e.get('gpu', '?')} ({e.get('date', '?')})", "",
             f"driver {e.get('driver')}, torch {e.get('torch')}, triton {e.get('triton')}. Hq=24, Hkv=4, D=256 "
             "(the 27B's attention). Routes: attention_decode_splitkv / attention_prefill_flash / kv_append_rows "
             "(the format dequantized on load / quantized on append).", "",
             "## Decode (one column per sequence at full depth; CUDA-graph replay, best split)", "",
             "| depth | C | KV | µs | vs bf16 | config | KV bytes read |", "|---|---|---|---:|---:|---|---:|"]
    base = {(r["ctx"], r["C"]): r["ours_us"] for r in res["decode"] if r["kv"] == "bf16"}
    for r in res["decode"]:
        b = base.get((r["ctx"], r["C"]))
        lines.append(f"| {r['ctx']} | {r['C']} | {r['kv']} | {r['ours_us']:.1f} | "
                     f"{(r['ours_us'] / b - 1) * 100:+.1f}% | {r['best_config']} | {r['kv_bytes']:,d} |")
    lines += ["", "## Prefill (a 1024-column chunk of one sequence; eager)", "",
              "| depth | KV | µs | vs bf16 | config |", "|---|---|---:|---:|---|"]
    base = {r["depth"]: r["ours_us"] for r in res["prefill"] if r["kv"] == "bf16"}
    for r in res["prefill"]:
        b = base.get(r["depth"])
        lines.append(f"| {r['depth']} | {r['kv']} | {r['ours_us']:.1f} | {(r['ours_us'] / b - 1) * 100:+.1f}% | "
                     f"{r['best_config']} |")
    lines += ["", "## Append (kv_append, CUDA-graph replay)", "", "| T | KV | µs |", "|---|---|---:|"]
    for r in res["append"]:
        lines.append(f"| {r['T']} | {r['kv']} | {r['ours_us']:.1f} |")
    lines += ["", "## Attention output vs a float64 oracle (K / V with outlier channels; decode, one column)", "",
              "| depth | KV | format (quantize -> dequantize) | kernel |", "|---|---|---:|---:|"]
    for ctx, rows in res["oracle"].items():
        for name, r in rows.items():
            lines.append(f"| {ctx} | {name} | {r['format']:.2e} | {r['kernel']:.2e} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ CPU: dry run, quality

def dry(res: dict) -> None:
    """The GPU bench's code paths at tiny shapes under the interpreter: fill, decode, prefill per
    format, and the oracle error at the 27B head shape over a short context."""
    from ninfer_compile.kernels.attention import launch

    gen = torch.Generator().manual_seed(2)
    hkv, d, hq, ctx = 1, 64, 2, 24
    k, v = outlier_kv(ctx, hkv, d, gen, "cpu")
    for name in F.KV_DTYPES:
        caches = fill(name, k, v, 1, "cpu", chunk=16)
        q = torch.randn(3, hq, d, generator=gen).bfloat16()
        gate = torch.randn(3, hq, d, generator=gen).bfloat16()
        o = torch.empty(3, hq * d, dtype=torch.bfloat16)
        sl = torch.zeros(3, dtype=torch.int32)
        pos = torch.tensor([ctx - 1, 5, 12], dtype=torch.int32)
        ws = torch.empty(max(1, launch.decode_workspace_numel(3, hq, d, ctx, 16)))
        launch.attention_decode(q, gate, caches[0], caches[1], pos, sl, o, workspace=ws, k_scale=caches[2],
                                v_scale=caches[3], split_tokens=16, block_n=16)
        dec = o.float().clone()
        launch.attention_prefill(q, gate, caches[0], caches[1], torch.tensor([10, 11, 12], dtype=torch.int32),
                                 sl, o, k_scale=caches[2], v_scale=caches[3], block_m=16, block_n=16)
        res["decode"].append({"kv": name, "finite": bool(torch.isfinite(dec).all()),
                              "prefill_finite": bool(torch.isfinite(o.float()).all())})
    res["oracle"]["64"] = oracle_errors(64, "cpu")


def quality(res: dict, tokens: int = 0) -> None:
    """Perplexity of the trained tiny model per format on the fixed corpus (bench/quality.md's
    protocol: windows 512, stride 384), HF transformers float32 with K / V quantized -> dequantized
    in the format (after the norms and RoPE, as our cache holds them; bf16-rounded first)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import transformers.models.qwen3_5.modeling_qwen3_5 as m

    from ninfer_runtime.perplexity import perplexity_of_ids
    from quality import support as S

    torch.set_num_threads(2)
    ids = S.heldout_ids()
    if tokens:
        ids = ids[:tokens]
    model = S.hf_model()
    orig = m.eager_attention_forward
    res.update({"corpus": "examples/tiny-trained/heldout.txt", "tokens": len(ids), "context": CONTEXT,
                "stride": STRIDE, "torch": torch.__version__, "rows": {}})
    for name in F.KV_DTYPES:
        fn = R.kv_roundtrip_fn(name)

        def attn(module, query, key, value, *a, fn=fn, **kw):
            k2, v2 = fn(key, value)  # [B, Hkv, S, D]: rows along D
            return orig(module, query, k2, v2, *a, **kw)

        m.eager_attention_forward = attn if name != "bf16" else orig
        t0 = time.perf_counter()
        try:
            ppl = perplexity_of_ids(S.hf_scorer(model), ids, CONTEXT, STRIDE)
        finally:
            m.eager_attention_forward = orig
        res["rows"][name] = {"perplexity": ppl, "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{name}: ppl {ppl:.4f} ({time.perf_counter() - t0:.0f}s)", flush=True)
    b = res["rows"]["bf16"]["perplexity"]
    for r in res["rows"].values():
        r["vs_bf16"] = r["perplexity"] / b - 1


def quality_markdown(res: dict) -> str:
    lines = [f"Perplexity per KV format, {res['tokens']:,d} tokens, windows {res['context']} / stride {res['stride']}",
             "", "| --kv-dtype | perplexity | vs bf16 |", "|---|---:|---:|"]
    for name, r in res["rows"].items():
        lines.append(f"| {name} | {r['perplexity']:.4f} | {r['vs_bf16'] * 100:+.3f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry", action="store_true", help="CPU, interpreter, tiny shapes: the code paths, no timings")
    ap.add_argument("--quality", action="store_true", help="CPU: perplexity of the trained tiny model per format")
    ap.add_argument("--quality-tokens", type=int, default=0, help="score only the corpus's first N tokens (0: all)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    res = {"decode": [], "prefill": [], "append": [], "oracle": {}}
    if args.quality:
        quality(res, args.quality_tokens)
        with open(os.path.join(args.out, "kv_quality.json"), "w") as f:
            json.dump(res, f, indent=1)
        md = quality_markdown(res)
        with open(os.path.join(args.out, "kv_quality.md"), "w") as f:
            f.write(md)
        print(md)
        return 0
    if args.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        dry(res)
        with open(os.path.join(args.out, "kv_dry.json"), "w") as f:
            json.dump(res, f, indent=1)
        print(json.dumps(res["oracle"], indent=1))
        return 0
    if not torch.cuda.is_available():
        print("error: the timings need a CUDA GPU (use --dry or --quality on the CPU)", file=sys.stderr)
        return 2
    from _common import env_info, write_results

    res["env"] = env_info()

    def save():  # partial results survive a timeout
        with open(os.path.join(args.out, "kv_formats.json"), "w") as f:
            json.dump(res, f, indent=1)

    try:
        gpu_bench(res, save)
    except Exception as exc:  # noqa: BLE001 - keep what was measured
        res.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}"[:400])
    write_results(args.out, "kv_formats", res, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
