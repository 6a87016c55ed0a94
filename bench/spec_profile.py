"""Per-op breakdown of the speculative extents (bench_spec.py --profile C[,C]): where a verify round's
time goes beside the plain step of the same plan.

For each listed concurrency C, the extents decode_c{C}_k0 (plain), verify_c{C}_k{K},
mtp_verify_c{C}_k{K} and mtp_decode_c{C}_k0 are replayed `steps` times under torch.profiler (CUDA
activity) with bench_spec's static inputs; each kernel is charged its critical-path time
(bench_e2e.critical_path: under programmatic dependent launch kernels overlap) and walked beside the
extent's launches (bench_e2e.per_op), so a row is one plan op summed over the layers
(`l12.mlp.gate_up` -> `mlp.gate_up`). The table puts the plain and verify µs of each op side by side
with their difference: the verify round's extra cost, op by op. Timings come from the profiler
(slightly above the CUDA-event medians of the round table)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def profile_extent(torch, engine, runner, launches: list[dict], kernels_of_route: dict, steps: int = 8) -> dict:
    """One extent's breakdown: {"us": µs per replay on the critical path, "idle_us", "launches",
    "ops": bench_e2e.per_op rows}."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from bench_e2e import critical_path, per_op
    from ninfer_runtime.graphs import replay_or_run

    for _ in range(3):
        replay_or_run(engine, runner)
    torch.cuda.synchronize(engine.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            replay_or_run(engine, runner)
        torch.cuda.synchronize(engine.device)
    events = [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
              if e.device_type == DeviceType.CUDA]
    charged, idle, _busy = critical_path(events)
    total = sum(us for _, us in charged) / steps
    ops = per_op(charged, launches, kernels_of_route, lambda L: 0, steps, max(total, 1e-9), None)
    # the walker pairs each launch with its route's first kernel; a launcher that runs that kernel more
    # than once (the tensor-core GEMV's second 16-column pass at T > 16) shifts later rows onto the next
    # ops: count the extra main-kernel runs so the table can say its per-op split is unreliable
    from bench_e2e import _short

    mains = [(kernels_of_route.get(L.get("route", ""), [None]) or [None])[0] for L in launches]
    seen = sum(1 for name, _ in charged if _short(name) in set(m for m in mains if m)) / steps
    extra = seen - sum(1 for m in mains if m)
    return {"us": total, "idle_us": idle / steps, "launches": len(launches), "ops": ops, "extra_main_runs": extra}


def profile_rounds(torch, engine, plan: dict, plan_dir, k: int, concurrency: list[int], context: int,
                   steps: int = 8) -> list[dict]:
    """[{"C", "K", "parts": {part: profile_extent(...)}}] for each C (see the module docstring)."""
    from bench_spec import fill_static, runner_of
    from limits import route_kernel_names

    kor = route_kernel_names(plan_dir)
    out = []
    for c in concurrency:
        parts = {}
        for part, name, w in (("plain", f"decode_c{c}_k0", 1), ("verify", f"verify_c{c}_k{k}", k + 1),
                              ("mtp_verify", f"mtp_verify_c{c}_k{k}", k + 1), ("mtp_decode", f"mtp_decode_c{c}_k0", 1)):
            r = runner_of(engine, name)
            if r is None or name not in plan["extents"]:
                continue
            fill_static(engine, r, c, w, context, k)
            parts[part] = profile_extent(torch, engine, r, plan["extents"][name]["launches"], kor, steps)
        engine.zero_state()
        out.append({"C": c, "K": k, "parts": parts})
        p, v = parts.get("plain"), parts.get("verify")
        if p and v:
            print(f"profile K={k} C={c}: plain {p['us']:.0f} µs ({p['launches']} launches), verify {v['us']:.0f} µs "
                  f"({v['launches']} launches)", flush=True)
    return out


def render_profiles(profiles: list[dict], top: int = 30) -> list[str]:
    """Markdown: per (C, K) the plain vs verify op table, then the MTP extents' ops."""
    lines: list[str] = []
    for pr in profiles:
        parts, c, k = pr["parts"], pr["C"], pr["K"]
        if "plain" not in parts or "verify" not in parts:
            continue
        p, v = parts["plain"], parts["verify"]
        lines += ["", f"### C={c}, K={k}: plain step vs verify (µs per replay, critical path under the profiler)", "",
                  f"plain {p['us']:.0f} µs in {p['launches']} launches (idle {p['idle_us']:.0f}); verify "
                  f"{v['us']:.0f} µs in {v['launches']} launches (idle {v['idle_us']:.0f}); difference "
                  f"{v['us'] - p['us']:+.0f} µs", ""]
        for nm, part in (("plain", p), ("verify", v)):
            if part.get("extra_main_runs", 0) > 0.5:
                lines += [f"**{nm}: {part['extra_main_runs']:.0f} kernel runs per replay beyond one per launch (multi-pass "
                          "launchers): the per-op split below is shifted between ops; only the totals are exact.**", ""]
        lines += [
                  "| op | plain route | plain µs | verify route | verify µs | verify - plain |", "|---|---|---|---|---|---|"]
        pm = {o["op"]: o for o in p["ops"]}
        vm = {o["op"]: o for o in v["ops"]}
        names = sorted(set(pm) | set(vm), key=lambda n: -abs((vm.get(n, {}).get("us_per_step", 0.0))
                                                             - (pm.get(n, {}).get("us_per_step", 0.0))))
        for n in names[:top]:
            a, b = pm.get(n), vm.get(n)
            au, bu = (a or {}).get("us_per_step", 0.0), (b or {}).get("us_per_step", 0.0)
            lines.append(f"| {n} | {(a or {}).get('route', '-')} | {au:.1f} | {(b or {}).get('route', '-')} | {bu:.1f} "
                         f"| {bu - au:+.1f} |")
        for part in ("mtp_verify", "mtp_decode"):
            m = parts.get(part)
            if not m:
                continue
            lines += ["", f"{part} (C={c}): {m['us']:.0f} µs in {m['launches']} launches (idle {m['idle_us']:.0f})", "",
                      "| op | route | launches | µs |", "|---|---|---|---|"]
            for o in m["ops"][:12]:
                lines.append(f"| {o['op']} | {o['route']} | {o['launches_per_step']:.0f} | {o['us_per_step']:.1f} |")
    return lines
