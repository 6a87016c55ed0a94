"""Structural checks of a parsed plan.json, before the loader reads it.

The integrity record (integrity.py) refuses a plan edited after compile; these checks give a plan
whose hash was re-computed after a careless or hostile edit (or a buggy compiler) one line naming
the member (`extents.X.launches[i] (op).t: ...`) instead of a traceback: the type and range of
every member the loader and the executor read. Launch-level semantics (route family, params the
kernels were emitted for, T domain) are checked when launches are bound (executor.py).
"""

from __future__ import annotations

from pathlib import Path

from .errors import PlanError


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_plan_shape(pj: Path, plan: dict) -> None:
    """The types of the members the loader reads, checked up front so a damaged or hand-edited
    plan is one line naming the member (not a traceback)."""
    def need(cond: bool, where: str, what: str) -> None:
        if not cond:
            raise PlanError(f"{pj}: {where}: {what}")

    tp = plan.get("tensor_parallel")
    if tp is not None:  # a --tp N plan: every rank's section is a one-GPU-shaped plan
        from .tensor_parallel import rank_view

        need(isinstance(tp, dict) and _is_int(tp.get("degree")) and tp["degree"] in (2, 4, 8)
             and isinstance(tp.get("ranks"), list) and len(tp["ranks"]) == tp["degree"], "tensor_parallel",
             "must be {degree: 2|4|8, ranks: [one section per rank]}")
        for r in range(tp["degree"]):
            check_plan_shape(pj, rank_view(plan, r))
        return
    need(isinstance(plan["artifact"], dict), "artifact", "must be a mapping")
    need(isinstance(plan["model_id"], str), "model_id", "must be a string")
    need(_is_int(plan["sm"]) and 1 <= plan["sm"] <= 1000, "sm", "must be an integer in [1, 1000]")
    opts = plan["options"]
    need(isinstance(opts, dict), "options", "must be a mapping")
    for key in ("max_context", "prefill_chunk"):
        need(_is_int(opts.get(key)) and 1 <= opts[key] <= 2**31 - 1, f"options.{key}",
             "must be an integer in [1, 2^31)")
    if opts.get("slots") is not None:
        need(_is_int(opts["slots"]) and 1 <= opts["slots"] <= 4096, "options.slots", "must be an integer in [1, 4096]")
    conc = opts.get("concurrency")
    if conc is not None:
        need(isinstance(conc, list) and conc and all(_is_int(c) and 1 <= c <= 4096 for c in conc),
             "options.concurrency", "must be a non-empty list of integers in [1, 4096]")
    need(_is_int(opts.get("draft_tokens", 0)), "options.draft_tokens", "must be an integer")
    buf = plan["buffers"]
    need(isinstance(buf, dict) and isinstance(buf.get("arena"), dict), "buffers.arena", "must be a mapping")
    need(_is_int(buf["arena"].get("bytes")) and 0 <= buf["arena"]["bytes"] <= 2**44, "buffers.arena.bytes",
         "must be an integer in [0, 2^44]")
    state = buf.get("state", {})
    need(isinstance(state, dict), "buffers.state", "must be a mapping")
    for name, b in state.items():
        need(isinstance(b, dict) and isinstance(b.get("shape"), list) and b["shape"]
             and all(_is_int(d) and 0 < d <= 2**40 for d in b["shape"]) and isinstance(b.get("dtype"), str),
             f"buffers.state.{name}", "needs shape (positive integers) and dtype")
    need(isinstance(plan["extents"], dict), "extents", "must be a mapping")
    for name, x in plan["extents"].items():
        where = f"extents.{name}"
        need(isinstance(x, dict), where, "must be a mapping")
        need(_is_int(x.get("t")) and 1 <= x["t"] <= 2**20, f"{where}.t", "must be an integer in [1, 2^20]")
        need(x.get("phase") in ("prefill", "decode", "verify"), f"{where}.phase", "must be prefill, decode or verify")
        need(_is_int(x.get("concurrency", 1)) and x.get("concurrency", 1) >= 1, f"{where}.concurrency",
             "must be an integer >= 1")
        need(x.get("arena_bytes") is None or (_is_int(x["arena_bytes"]) and 0 <= x["arena_bytes"] <= 2**44),
             f"{where}.arena_bytes", "must be an integer in [0, 2^44]")
        for key in ("tensors", "inputs", "outputs"):
            need(isinstance(x.get(key, {}), dict), f"{where}.{key}", "must be a mapping")
        for tname, t in x.get("tensors", {}).items():
            tw = f"{where}.tensors.{tname}"
            need(isinstance(t, dict) and isinstance(t.get("shape"), list)
                 and all(_is_int(d) and 0 <= d <= 2**40 for d in t["shape"]) and isinstance(t.get("dtype"), str),
                 tw, "needs shape (non-negative integers) and dtype")
            for key in ("offset", "byte_offset", "bytes", "row_stride", "col_offset"):
                if key in t:
                    need(_is_int(t[key]) and 0 <= t[key] <= 2**44, f"{tw}.{key}", "must be an integer in [0, 2^44]")
            if "view_of" in t:
                need(isinstance(t["view_of"], str) and "byte_offset" in t, tw, "a view needs view_of and byte_offset")
            else:
                need("offset" in t, tw, "needs offset (or view_of)")
        launches = x.get("launches")
        need(isinstance(launches, list), f"{where}.launches", "must be a list")
        for i, L in enumerate(launches):
            lw = f"{where}.launches[{i}]"
            need(isinstance(L, dict) and isinstance(L.get("op"), str) and isinstance(L.get("kind"), str), lw,
                 "needs op and kind (strings)")
            lw = f"{where}.launches[{i}] ({L['op']})"
            need(L.get("route") is None or isinstance(L["route"], str), f"{lw}.route", "must be a string or null")
            need(_is_int(L.get("t", x["t"])) and 1 <= L.get("t", x["t"]) <= x["t"], f"{lw}.t",
                 f"must be an integer in [1, {x['t']}]")
            for key in ("params", "attrs", "args", "outs"):
                need(isinstance(L.get(key) or {}, dict), f"{lw}.{key}", "must be a mapping")
            for group in ("args", "outs"):
                for operand, ref in (L.get(group) or {}).items():
                    rw = f"{lw}.{group}.{operand}"
                    need(isinstance(ref, dict) and len({"buffer", "state", "weight"} & set(ref)) == 1, rw,
                         "must reference exactly one buffer, state or weight")
                    for key in ("buffer", "state", "weight"):
                        if key in ref:
                            need(isinstance(ref[key], str), f"{rw}.{key}", "must be a string")
                    if "rows" in ref:
                        rows = ref["rows"]
                        need(isinstance(rows, list) and len(rows) == 2 and all(_is_int(r) for r in rows)
                             and rows[0] >= 0 and rows[1] >= 1, f"{rw}.rows", "must be [begin >= 0, count >= 1]")
                    if "shard" in ref:  # a --tp rank's copy: {rows|cols: [[begin >= 0, count >= 1], ...]}
                        sh = ref["shard"]
                        need("weight" in ref and isinstance(sh, dict) and set(sh) <= {"rows", "cols"} and sh and all(
                            isinstance(v, list) and v and all(isinstance(r, list) and len(r) == 2 and all(
                                _is_int(x) for x in r) and r[0] >= 0 and r[1] >= 1 for r in v) for v in sh.values()),
                             f"{rw}.shard", "must be a weight's {rows|cols: [[begin >= 0, count >= 1], ...]}")
            bind = L.get("bind")
            if bind is not None:
                need(isinstance(bind, list), f"{lw}.bind", "must be a list")
                for j, b in enumerate(bind):
                    bw = f"{lw}.bind[{j}]"
                    need(isinstance(b, dict) and isinstance(b.get("arg"), str)
                         and len(set(b) - {"arg", "format", "rows", "shard"}) == 1
                         and (set(b) - {"arg", "format", "rows", "shard"}) <= set(BIND_KINDS), bw,
                         f"must be {{arg, one of {'/'.join(BIND_KINDS)}}}")
                    kind = next(iter(set(b) - {"arg", "format", "rows", "shard"}))
                    if kind in ("buffer", "state", "weight"):
                        need(isinstance(b[kind], str), f"{bw}.{kind}", "must be a string")
                    if kind == "workspace":
                        need(_is_int(b[kind]) and 0 <= b[kind] <= 2**42, f"{bw}.workspace", "must be an integer in [0, 2^42]")
                    if "rows" in b:
                        rows = b["rows"]
                        need(kind == "weight" and isinstance(rows, list) and len(rows) == 2 and all(_is_int(r) for r in rows)
                             and rows[0] >= 0 and rows[1] >= 1, f"{bw}.rows", "must be [begin >= 0, count >= 1] of a weight")
        ws = x.get("workspace", {"numel": 0})
        need(isinstance(ws, dict) and _is_int(ws.get("numel")) and 0 <= ws["numel"] <= 2**42
             and ws.get("dtype", "f32") == "f32", f"{where}.workspace", "must be {numel: integer in [0, 2^42], dtype: f32}")


BIND_KINDS = ("buffer", "weight", "state", "scalar", "constexpr", "workspace", "group")


def check_bind(where: str, L: dict, info: dict) -> None:
    """The launch's `bind` list matches the route's argument list recorded in kernels/manifest.json
    (`args`: name, kinds, optional, parts): every argument is one of the route's, bound as a kind it
    takes, at most once, an operand to the same reference as the launch's `args` / `outs` (which
    the loader reads to load weights); every required argument is bound; the constexprs are one of
    the param sets the kernels were emitted for. `where` names the extent, the launch index and the
    route."""
    expected = info.get("args")
    if not isinstance(expected, list):
        raise PlanError(f"{where}: kernels/manifest.json records no argument list for the route (recompile the plan)")
    bind = L.get("bind")
    if not isinstance(bind, list):
        raise PlanError(f"{where}: the launch has no bind list (recompile the plan)")
    by_name = {e["name"]: e for e in expected}
    seen: dict[str, str] = {}
    for b in bind:
        arg = b.get("arg")
        kinds = sorted(set(b) & set(BIND_KINDS))
        e = by_name.get(arg)
        if e is None and isinstance(arg, str):  # a part x0, x1.. of an operand given as parts
            base = arg.rstrip("0123456789")
            nparts = by_name.get(base, {}).get("parts") if base != arg else 0
            # the manifest records how many ranges the launcher takes (older manifests: true = any)
            ok = bool(nparts) and (nparts is True or int(arg[len(base):]) < int(nparts))
            e = by_name.get(base) if ok else None
        if e is None:
            raise PlanError(f"{where}: argument {arg!r} is not an argument of the route's launcher "
                            f"({', '.join(x['name'] for x in expected)})")
        if len(kinds) != 1 or kinds[0] not in e["kinds"]:
            raise PlanError(f"{where}: argument {arg!r} is bound as {'/'.join(kinds) or 'nothing'}, the launcher takes "
                            f"a {'/'.join(e['kinds'])}")
        if arg in seen:
            raise PlanError(f"{where}: argument {arg!r} is bound twice")
        seen[arg] = e["name"]
        if kinds[0] in ("buffer", "state", "weight"):  # the launch's operand lists say the same
            ref = {k: v for k, v in b.items() if k != "arg"}
            if ref not in ((L.get("args") or {}).get(arg), (L.get("outs") or {}).get(arg)):
                raise PlanError(f"{where}: argument {arg!r} binds {ref}, not the launch's operand {arg}")
    given = set(seen.values())
    for e in expected:
        if not e.get("optional") and e["name"] not in given:
            raise PlanError(f"{where}: argument {e['name']!r} of the route's launcher is not bound")
    consts = {b["arg"]: b["constexpr"] for b in bind if "constexpr" in b}
    sets = info.get("params")
    if isinstance(sets, list) and not any(isinstance(s, dict) and set(s) == set(consts) and all(
            s[k] == v and type(s[k]) is type(v) for k, v in consts.items()) for s in sets):
        arg = next((k for k in sorted(consts) if not any(isinstance(s, dict) and k in s and s[k] == consts[k]
                                                        for s in sets)), sorted(consts)[0] if consts else "-")
        raise PlanError(f"{where}: argument {arg!r}: constexprs {consts} are not a parameter set the kernels were "
                        f"emitted for")
