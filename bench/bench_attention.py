"""H200 benchmark of the attention routes (27B shape: Hq=24, Hkv=4, D=256).

Decode (split-KV flash-decoding) at 4K and 32K context, bf16 and int8-g64 caches, C = 1, 4
sequences (one column each, full context) vs the KV-traffic floor (cache bytes read / measured copy
bandwidth). Prefill of 1K / 4K columns of one sequence (causal, chunk = whole prompt) vs torch
SDPA (flash backend, GQA, no gate) in the same run. Writes attention.json and attention.md to --out.

    python bench/bench_attention.py --out bench/results
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _common import copy_bandwidth, eager, streaming_read, env_info, out_dir, pick_best, timed, try_config, write_results  # noqa: E402
from ninfer_compile.kernels.attention import launch  # noqa: E402
from ninfer_compile.kernels.kv_cache.reference import quantize_g64  # noqa: E402

HQ, HKV, D = 24, 4, 256


def caches(C, ctx, int8):
    k = torch.randn(C, ctx, HKV, D, device="cuda").bfloat16()
    v = torch.randn(C, ctx, HKV, D, device="cuda").bfloat16()
    if not int8:
        return k, v, None, None
    kc, ks = quantize_g64(k)
    vc, vs = quantize_g64(v)
    return kc, vc, ks, vs


def bench_decode(ctx, C, int8, bw, res):
    kc, vc, ks, vs = caches(C, ctx, int8)
    q = torch.randn(C, HQ, D, device="cuda").bfloat16()
    gate = torch.randn(C, HQ, D, device="cuda").bfloat16()
    out = torch.empty(C, HQ * D, dtype=torch.bfloat16, device="cuda")
    slots = torch.arange(C, dtype=torch.int32, device="cuda")
    pos = torch.full((C,), ctx - 1, dtype=torch.int32, device="cuda")
    nbytes = C * ctx * HKV * D * 2 * (1 if int8 else 2) + (C * ctx * HKV * (D // 64) * 2 * 2 if int8 else 0)
    row = {"ctx": ctx, "C": C, "kv": "int8_g64" if int8 else "bf16", "floor_us": nbytes / bw * 1e6, "configs": {}}
    for split in (256, 512, 1024, 2048):
        for bn in ((64,) if split == 2048 else (32, 64)):
            ws = torch.empty(max(1, launch.decode_workspace_numel(C, HQ, D, ctx, split)), device="cuda")
            fn = lambda: launch.attention_decode(q, gate, kc, vc, pos, slots, out, workspace=ws,  # noqa: E731
                                                 k_scale=ks, v_scale=vs, split_tokens=split, block_n=bn)
            try_config(row, f"s{split}_n{bn}", fn)
    pick_best(row)
    res["decode"].append(row)
    print(f"decode ctx={ctx} C={C} {row['kv']}: ours {row['ours_us']:.1f} us ({row['best_config']}), "
          f"floor {row['floor_us']:.1f} us", flush=True)


def bench_prefill(T, int8, res):
    kc, vc, ks, vs = caches(1, T, int8)
    q = torch.randn(T, HQ, D, device="cuda").bfloat16()
    gate = torch.randn(T, HQ, D, device="cuda").bfloat16()
    out = torch.empty(T, HQ * D, dtype=torch.bfloat16, device="cuda")
    slots = torch.zeros(T, dtype=torch.int32, device="cuda")
    pos = torch.arange(T, dtype=torch.int32, device="cuda")
    row = {"T": T, "kv": "int8_g64" if int8 else "bf16", "configs": {}}
    for bm, bn, nw in ((64, 32, 8), (64, 64, 8), (128, 32, 8), (32, 64, 4), (64, 32, 4)):
        fn = lambda: launch.attention_prefill(q, gate, kc, vc, pos, slots, out, k_scale=ks, v_scale=vs,  # noqa: E731
                                              block_m=bm, block_n=bn, num_warps=nw)
        try_config(row, f"m{bm}_n{bn}_w{nw}", fn, measure=eager)
    pick_best(row)
    flops = 4 * HQ * D * T * T / 2  # causal QK^T + PV
    row["ours_tflops"] = flops / (row["ours_us"] * 1e-6) / 1e12
    if not int8:
        qs = q.transpose(0, 1)[None]  # [1, Hq, T, D]
        kk = kc[0].transpose(0, 1)[None]
        vv = vc[0].transpose(0, 1)[None]
        try:
            fn = lambda: F.scaled_dot_product_attention(qs, kk, vv, is_causal=True, enable_gqa=True)  # noqa: E731
            row["sdpa_us"] = eager(fn)["eager_us"]
        except Exception as exc:  # noqa: BLE001
            kr, vr = kk.repeat_interleave(HQ // HKV, 1), vv.repeat_interleave(HQ // HKV, 1)
            fn = lambda: F.scaled_dot_product_attention(qs, kr, vr, is_causal=True)  # noqa: E731
            row["sdpa_us"] = eager(fn)["eager_us"]
            row["sdpa_note"] = f"enable_gqa failed ({type(exc).__name__}); K/V pre-expanded"
        ref = F.scaled_dot_product_attention(qs.float(), kk.repeat_interleave(6, 1).float(),
                                             vv.repeat_interleave(6, 1).float(), is_causal=True)
        launch.attention_prefill(q, gate, kc, vc, pos, slots, out)
        want = (ref[0].transpose(0, 1) * torch.sigmoid(gate.float())).reshape(T, -1)
        row["max_abs_diff_vs_sdpa_fp32"] = (out.float() - want).abs().max().item()
    res["prefill"].append(row)
    print(f"prefill T={T} {row['kv']}: ours {row['ours_us']:.1f} us ({row['best_config']}), "
          f"sdpa {row.get('sdpa_us', float('nan')):.1f} us", flush=True)


def markdown(res) -> str:
    e = res["env"]
    lines = [f"# Attention routes on {e['gpu']} ({e['date']})", "",
             f"driver {e['driver']}, torch {e['torch']}, triton {e['triton']}; copy bandwidth "
             f"{res['copy_bw_TBps']:.2f} TB/s (read+write); streaming read {res.get('stream_read_TBps', float('nan')):.2f} TB/s "
             f"(the KV floor's rate). Hq=24, Hkv=4, D=256.", "",
             "## Decode (one column per sequence, full context; CUDA-graph replay)", "",
             "| ctx | C | KV | ours µs | config | KV floor µs | ours/floor |", "|---|---|---|---|---|---|---|"]
    for r in res["decode"]:
        lines.append(f"| {r['ctx']} | {r['C']} | {r['kv']} | {r['ours_us']:.1f} | {r['best_config']} | "
                     f"{r['floor_us']:.1f} | {r['ours_us'] / r['floor_us']:.2f}x |")
    lines += ["", "## Prefill (one sequence, causal; eager)", "",
              "| T | KV | ours µs | config | TFLOP/s | SDPA µs | ours/SDPA | max|Δ| vs fp32 |", "|---|---|---|---|---|---|---|---|"]
    for r in res["prefill"]:
        sd = r.get("sdpa_us", float("nan"))
        lines.append(f"| {r['T']} | {r['kv']} | {r['ours_us']:.1f} | {r['best_config']} | {r['ours_tflops']:.0f} | "
                     f"{sd:.1f} | {r['ours_us'] / sd:.2f}x | {r.get('max_abs_diff_vs_sdpa_fp32', float('nan')):.2e} |")
    for err in res.get("errors", []):
        lines += ["", f"error: {err}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    out = out_dir(__doc__, argv)
    res = {"env": env_info(), "decode": [], "prefill": []}
    res["copy_bw_TBps"] = copy_bandwidth() / 1e12
    bw = streaming_read()  # decode reads the KV cache: its floor is the streaming read rate
    res["stream_read_TBps"] = bw / 1e12
    res["errors"] = []
    for T in (1024, 4096):
        for int8 in (False, True):
            try:
                bench_prefill(T, int8, res)
            except Exception as exc:  # noqa: BLE001
                res["errors"].append(f"prefill T={T} int8={int8}: {type(exc).__name__}: {str(exc)[:300]}")
    for ctx in (4096, 32768):
        for int8 in (False, True):
            for C in (1, 4):
                try:
                    bench_decode(ctx, C, int8, bw, res)
                except Exception as exc:  # noqa: BLE001
                    res["errors"].append(f"decode ctx={ctx} C={C} int8={int8}: {type(exc).__name__}: {str(exc)[:300]}")
    print("errors:", res["errors"], flush=True)
    write_results(out, "attention", res, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
