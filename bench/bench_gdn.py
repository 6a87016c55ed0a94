"""H200 benchmark of the Gated DeltaNet routes vs flash-linear-attention, each against its floor.

Decode: one recurrent step of a 27B GDN layer (Hk=16, Hv=48, Dk=Dv=128, fp32 state) for
C = 1, 2, 4, 8 concurrent sequences, cold state (rotated over copies > 3x L2, as in production);
floor = state bytes read + written / measured copy bandwidth.
Prefill: chunked, one sequence of T = 1024, 4096; floor = (q,k,v,g,beta in + o out + state r/w)
bytes / copy bandwidth. Both prefill routes are timed: gdn_chunked_prefill ("ours") and
gdn_chunked_wy_prefill ("fast", launch_chunked_wy; block_v x num_warps x num_stages sweep). fla (`fused_recurrent_gated_delta_rule`, `chunk_gated_delta_rule`) runs
in the same process on the same inputs (its output is also compared with ours).
Writes gdn.json and gdn.md to --out.

    python bench/bench_gdn.py --out bench/results
"""

from __future__ import annotations

import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from _common import best, copy_bandwidth, streaming_read, env_info, out_dir, pick_best, timed, try_config, write_results  # noqa: E402
from ninfer_compile.kernels.gdn import launch, launch_chunked_wy  # noqa: E402

HK, HV, DK, DV = 16, 48, 128, 128


def fla_funcs():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        return fused_recurrent_gated_delta_rule, chunk_gated_delta_rule, None
    except Exception as exc:  # noqa: BLE001
        return None, None, f"{type(exc).__name__}: {exc}"[:300]


def inputs(T, C, seed=0):
    g_ = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(T, HK, DK, device="cuda", generator=g_).bfloat16()
    k = torch.randn(T, HK, DK, device="cuda", generator=g_).bfloat16()
    v = torch.randn(T, HV, DV, device="cuda", generator=g_).bfloat16()
    g = -torch.rand(T, HV, device="cuda", generator=g_) * 0.5
    beta = torch.rand(T, HV, device="cuda", generator=g_)
    state = 0.1 * torch.randn(C, HV, DK, DV, device="cuda", generator=g_)
    return q, k, v, g.contiguous(), beta.contiguous(), state


def cold_copies(nbytes_one: int, l2_bytes: int = 50 << 20) -> int:
    """How many copies of a state rotate through more than 3x L2, so each step reads it from HBM
    (as in production, where 48 layers' states sit between two steps of one layer)."""
    return max(2, -(-3 * l2_bytes // nbytes_one))


def bench_decode(C, bw, fused_recurrent, res):
    q, k, v, g, beta, state = inputs(C, C, seed=C)
    slots = torch.arange(C, dtype=torch.int32, device="cuda")
    pos = torch.full((C,), 100, dtype=torch.int32, device="cuda")
    o = torch.empty(C, HV, DV, dtype=torch.bfloat16, device="cuda")
    floor_us = C * HV * DK * DV * 4 * 2 / bw * 1e6
    n = cold_copies(state.numel() * 4)
    row = {"C": C, "floor_us": floor_us, "configs": {}, "state_copies": n}
    per_call = lambda d: {k: v / n for k, v in d.items() if k.endswith("_us")} | {  # noqa: E731
        k: v for k, v in d.items() if not k.endswith("_us")}
    for bv in (16, 32, 64):
        for nw in (2, 4, 8):
            sts = [state.clone() for _ in range(n)]

            def fn(bv=bv, nw=nw, sts=sts):  # one step of n different layers' states: cold state
                for st in sts:
                    launch.gated_delta_rule_decode(q, k, v, g, beta, st, pos, slots, o, block_v=bv, num_warps=nw)
            try_config(row, f"bv{bv}_w{nw}", fn, measure=lambda f: per_call(timed(f)))
            del sts
    pick_best(row)
    if fused_recurrent is not None:
        q4, k4, v4 = q[None].transpose(0, 1), k[None].transpose(0, 1), v[None].transpose(0, 1)  # [C,1,H,D]
        g4, b4 = g[:, None], beta[:, None]
        sts = [state.clone() for _ in range(n)]

        def fla_fn():
            for st in sts:
                fused_recurrent(q4, k4, v4, g=g4, beta=b4, scale=1 / math.sqrt(DK), initial_state=st,
                                output_final_state=True, use_qk_l2norm_in_kernel=True)
        row["fla"] = per_call(timed(fla_fn))
        row["fla_us"] = best(row["fla"])
        del sts
        # agreement check on a fresh state
        s1 = state.clone()
        launch.gated_delta_rule_decode(q, k, v, g, beta, s1, pos, slots, o)
        of, sf = fused_recurrent(q4, k4, v4, g=g4, beta=b4, scale=1 / math.sqrt(DK), initial_state=state.clone(),
                                 output_final_state=True, use_qk_l2norm_in_kernel=True)
        row["max_abs_diff_o_vs_fla"] = (of[:, 0].float() - o.float()).abs().max().item()
        row["max_abs_diff_state_vs_fla"] = (sf.float() - s1).abs().max().item()
    res["decode"].append(row)
    print(f"decode C={C}: ours {row['ours_us']:.2f} us ({row['best_config']}), floor {floor_us:.2f} us, "
          f"fla {row.get('fla_us', float('nan')):.2f} us (cold state, {n} copies)", flush=True)


def bench_prefill(T, bw, chunk, res):
    q, k, v, g, beta, state = inputs(T, 1, seed=T)
    slots = torch.zeros(T, dtype=torch.int32, device="cuda")
    pos = torch.arange(5, 5 + T, dtype=torch.int32, device="cuda")
    o = torch.empty(T, HV, DV, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(launch.chunked_workspace_numel(T, HV, DK, DV), device="cuda")
    io = T * (2 * HK * DK * 2 + HV * DV * 2 + 2 * HV * 4 + HV * DV * 2) + 2 * HV * DK * DV * 4
    row = {"T": T, "floor_us": io / bw * 1e6, "configs": {}}
    for bv in (16, 32, 64):
        st = state.clone()
        fn = lambda: launch.gated_delta_rule_chunked(q, k, v, g, beta, st, pos, slots, o, ws, block_v=bv)  # noqa: E731
        try_config(row, f"bv{bv}", fn)
    pick_best(row)
    # route gdn_chunked_wy_prefill: its own workspace size (launch_chunked_wy.chunked_workspace_numel)
    ws_fast = torch.empty(launch_chunked_wy.chunked_workspace_numel(T, HV, DK, DV), device="cuda")
    fast = {"configs": {}}
    for bv in (32, 64):
        for nw in (4, 8):
            for ns in (1, 2, 3):
                name = f"bv{bv}_w{nw}_s{ns}"
                # GDN_FAST_CONFIGS=a,b limits the sweep ("none": skip the fast route); an illegal
                # access in one config kills the CUDA context for the rest of the run
                only = os.environ.get("GDN_FAST_CONFIGS")
                if only is not None and name not in only.split(","):
                    continue
                st = state.clone()
                fn = lambda bv=bv, nw=nw, ns=ns, st=st: launch_chunked_wy.gated_delta_rule_chunked_wy(  # noqa: E731
                    q, k, v, g, beta, st, pos, slots, o, ws_fast, block_v=bv, num_warps=nw, num_stages=ns)
                try_config(fast, name, fn)
    try:
        pick_best(fast)
        row["fast_configs"], row["fast_best_config"], row["fast_us"] = fast["configs"], fast["best_config"], fast["ours_us"]
        s1, s2 = state.clone(), state.clone()
        o1 = torch.empty_like(o)
        launch.gated_delta_rule_chunked(q, k, v, g, beta, s1, pos, slots, o1, ws)
        bv_, nw_, ns_ = (int(x) for x in re.fullmatch(r"bv(\d+)_w(\d+)_s(\d+)", fast["best_config"]).groups())
        launch_chunked_wy.gated_delta_rule_chunked_wy(q, k, v, g, beta, s2, pos, slots, o, ws_fast, block_v=bv_,
                                                  num_warps=nw_, num_stages=ns_)
        row["max_abs_diff_o_fast_vs_ours"] = (o.float() - o1.float()).abs().max().item()
        row["max_abs_diff_state_fast_vs_ours"] = (s2 - s1).abs().max().item()
    except ValueError:  # no fast config ran
        row["fast_configs"] = fast["configs"]
    if chunk is not None:
        st = state.clone()

        def fla_fn():
            return chunk(q[None], k[None], v[None], g=g[None], beta=beta[None], scale=1 / math.sqrt(DK),
                         initial_state=st, output_final_state=True, use_qk_l2norm_in_kernel=True)
        row["fla"] = timed(fla_fn)
        row["fla_us"] = best(row["fla"])
        s1 = state.clone()
        launch.gated_delta_rule_chunked(q, k, v, g, beta, s1, pos, slots, o, ws)
        of, sf = fla_fn()
        row["max_abs_diff_o_vs_fla"] = (of[0].float() - o.float()).abs().max().item()
        row["max_abs_diff_state_vs_fla"] = (sf.float() - s1).abs().max().item()
    res["prefill"].append(row)
    print(f"prefill T={T}: ours {row['ours_us']:.1f} us ({row['best_config']}), fast {row.get('fast_us', float('nan')):.1f} us "
          f"({row.get('fast_best_config')}), floor {row['floor_us']:.1f} us, fla {row.get('fla_us', float('nan')):.1f} us",
          flush=True)


def markdown(res) -> str:
    e = res["env"]
    lines = [f"# GDN routes on {e['gpu']} ({e['date']})", "",
             f"driver {e['driver']}, torch {e['torch']}, triton {e['triton']}, fla {res.get('fla_version')}; "
             f"copy bandwidth {res['copy_bw_TBps']:.2f} TB/s (read+write; the state floor's rate), streaming read "
             f"{res.get('stream_read_TBps', float('nan')):.2f} TB/s. Times: CUDA-graph replay "
             f"(eager in JSON).", "",
             "## Decode step (Hk=16, Hv=48, 128x128 fp32 state)", "",
             "| C | ours µs | config | fla µs | state floor µs | ours/floor | max|Δo| vs fla |",
             "|---|---|---|---|---|---|---|"]
    for r in res["decode"]:
        lines.append(f"| {r['C']} | {r['ours_us']:.2f} | {r['best_config']} | {r.get('fla_us', float('nan')):.2f} | "
                     f"{r['floor_us']:.2f} | {r['ours_us'] / r['floor_us']:.2f}x | "
                     f"{r.get('max_abs_diff_o_vs_fla', float('nan')):.2e} |")
    lines += ["", "## Chunked prefill (one sequence)", "",
              "| T | ours µs | config | fast µs | fast config | fla µs | IO floor µs | ours/fla | fast/fla | "
              "max|Δo| vs fla | max|Δo| fast vs ours |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["prefill"]:
        fla = r.get("fla_us", float("nan"))
        fast = r.get("fast_us", float("nan"))
        lines.append(f"| {r['T']} | {r['ours_us']:.1f} | {r['best_config']} | {fast:.1f} | {r.get('fast_best_config')} | "
                     f"{fla:.1f} | {r['floor_us']:.1f} | {r['ours_us'] / fla:.2f}x | {fast / fla:.2f}x | "
                     f"{r.get('max_abs_diff_o_vs_fla', float('nan')):.2e} | "
                     f"{r.get('max_abs_diff_o_fast_vs_ours', float('nan')):.2e} |")
    if res.get("chunk_fallbacks"):
        lines += ["", f"chunk size fallbacks (shared memory): {res['chunk_fallbacks']}"]
    for err in res.get("errors", []):
        lines += ["", f"error: {err}"]
    if res.get("fla_error"):
        lines += ["", f"fla unavailable: {res['fla_error']}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    out = out_dir(__doc__, argv)
    fused_recurrent, chunk, err = fla_funcs()
    res = {"env": env_info(), "decode": [], "prefill": [], "fla_error": err}
    try:
        import fla
        res["fla_version"] = getattr(fla, "__version__", "?")
    except Exception:  # noqa: BLE001
        res["fla_version"] = None
    bw = copy_bandwidth()  # the state is read and written: the copy rate is its floor's rate
    res["copy_bw_TBps"] = bw / 1e12
    res["stream_read_TBps"] = streaming_read() / 1e12
    res["errors"] = []
    for C in (1, 2, 4, 8):
        try:
            bench_decode(C, bw, fused_recurrent, res)
        except Exception as exc:  # noqa: BLE001
            res["errors"].append(f"decode C={C}: {type(exc).__name__}: {str(exc)[:300]}")
    for T in (1024, 4096):
        try:
            bench_prefill(T, bw, chunk, res)
        except Exception as exc:  # noqa: BLE001
            res["errors"].append(f"prefill T={T}: {type(exc).__name__}: {str(exc)[:300]}")
    res["chunk_fallbacks"] = {str(k_): v_ for k_, v_ in launch._CHUNK_FOR.items()}
    print("errors:", res["errors"], "chunk fallbacks:", res["chunk_fallbacks"], flush=True)
    write_results(out, "gdn", res, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
