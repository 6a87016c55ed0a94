"""The Markdown report of bench_spec.py (split out to keep the script under ~500 lines): the round
table, byte floors, targets, modelled and forced rows, and the --profile breakdown."""

from __future__ import annotations

import json


def _n(v, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def render_md(res: dict) -> str:
    prov = res["provenance"]
    lines = [f"# Speculative decoding, {res['label']}: {prov['gpu']}, {prov['date']}", "",
             f"driver {prov['driver']}, torch {prov['torch']}, triton {prov['triton']}; "
             f"{'DRY RUN (CPU interpreter): timings mean nothing; ' if res.get('dry') else ''}"
             f"context {res['context']}, {res['reps']} timed replays per extent after {res['warmup']} warm-up "
             f"(medians, {res['timer']})", ""]
    for k, opts in sorted(res.get("plans", {}).items()):
        lines.append(f"- K={k}: `{opts.get('path')}` options {json.dumps(opts.get('options'))}")
    lines += ["", "## Round cost against a plain step", "",
              "round = verify + MTP draft (mtp_verify + (K-1) x mtp_decode); ratios against decode_c{C}_k0 of the "
              "same plan.", "",
              "| C | K | plain ms | verify ms | MTP draft ms | round ms | verify / plain | round / plain |",
              "|---|---|---|---|---|---|---|---|"]
    for r in res["rounds"]:
        lines.append(f"| {r['C']} | {r['K']} | {r['plain_ms']:.3f} | {r['verify_ms']:.3f} | {_n(r['draft_ms'], '.3f')} "
                     f"| {r['round_ms']:.3f} | {r['verify_ratio']:.3f}x | {_n(r['round_ratio'], '.3f')}"
                     f"{'x' if r['round_ratio'] is not None else ''} |")
    if any("floor_ms" in r for r in res["rounds"]):
        sr = res.get("streaming_read") or {}
        lines += ["", f"Byte floors (weights once + state read/written + KV read at the context; at the streaming read "
                      f"rate {sr.get('gbs', 0):.0f} GB/s measured in this run): ms and the measured time's % of it.", "",
                  "| C | K | plain floor ms | plain % | verify floor ms | verify % | round floor ms | round % |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in res["rounds"]:
            f = r.get("floor_ms")
            if not f:
                continue
            rf = f["verify"] + (f.get("mtp_verify", 0.0) + (r["K"] - 1) * f.get("mtp_decode", 0.0)
                                if r.get("draft_ms") is not None else 0.0)
            lines.append(f"| {r['C']} | {r['K']} | {f['plain']:.3f} | {100 * f['plain'] / r['plain_ms']:.0f}% | "
                         f"{f['verify']:.3f} | {100 * f['verify'] / r['verify_ms']:.0f}% | {rf:.3f} | "
                         f"{100 * rf / r['round_ms']:.0f}% |")
    t = res.get("targets") or {}
    lines += ["", "## Targets", ""]
    if "mtp3_round_ratio" in t:
        lines.append(f"- MTP3 round at C=1: {t['mtp3_round_ratio']:.3f}x a plain step ({t['mtp3_ratio_of']}); "
                     f"target <= {t['round_ratio_target']:.2f}x: {'met' if t['mtp3_round_met'] else 'NOT met'}")
    else:
        lines.append("- MTP3 round at C=1: no K=3 plan measured")
    if "single_stream_tok_s" in t:
        lines.append(f"- single stream at {t['tokens_per_round']} tokens/round (modelled, K={t['single_stream_k']}): "
                     f"{t['single_stream_tok_s']:.0f} tok/s; target >= {t['tok_s_target']:.0f}: "
                     f"{'met' if t['single_stream_met'] else 'NOT met'}")
    else:
        lines.append(f"- single stream at {t.get('tokens_per_round')} tokens/round: no C=1 plan with K >= 3")
    lines += ["", "## Modelled tok/s (device round time; no host overhead)", "",
              "| C | K | tokens/round | source | round ms | tok/s | x plain |", "|---|---|---|---|---|---|---|"]
    for m in res["modelled"]:
        lines.append(f"| {m['C']} | {m['K']} | {m['tokens_per_round']:.2f} | {m['source']}"
                     f"{'' if m['mtp_draft_included'] else ' (no MTP draft cost)'} | {m['round_ms']:.3f} | "
                     f"{m['tok_s']:.1f} | {m['speedup_vs_plain']:.2f}x |")
    lines += ["", "## Forced acceptance through the runtime (label: forced)", "",
              "Host drafter with the plain run's greedy continuation, corrupted after a drafts per round; "
              "no MTP draft cost; host overhead included.", "",
              "| label | C | K | forced a | rounds | plain steps | acceptance | tokens/round | decode tok/s | "
              "plain tok/s | x plain |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in res["forced"]:
        lines.append(f"| {f['label']} | {f['C']} | {f['K']} | {f['forced_accept']} | {f['rounds']} | "
                     f"{f['plain_steps']} | {100 * f['acceptance']:.1f}% | {f['tokens_per_round']:.2f} | "
                     f"{f['tok_s']:.1f} | {f['plain_tok_s']:.1f} | {f['tok_s'] / f['plain_tok_s']:.2f}x |")
    if res.get("profiles"):
        from spec_profile import render_profiles

        lines += ["", "## Where the round's time goes (--profile)"] + render_profiles(res["profiles"])
    for e in res.get("errors", []):
        lines.append(f"\nerror: {e}")
    return "\n".join(lines) + "\n"
