"""Fuzz plan.json (issue 10 §6): deterministic, seeded mutations of one tiny compiled plan (type
swaps, out-of-range integers, deleted keys, renamed routes, edited weight views), each tried twice:

- as written by a careless edit: the integrity record refuses it (the body hash), one line;
- with the integrity record re-computed after the edit (a hostile or careless edit that also fixes
  the hash), which exercises the loader's and executor's own validation: the plan is refused in one
  line (the runtime's error class), or it loads and a short generation either is refused in one line
  or completes with in-vocabulary tokens. A plan whose hash was fixed after an edit is a different
  program: where the runtime cannot tell it from a valid one (an attribute, another same-shaped
  weight), other tokens are possible; they are counted, and for the kinds the runtime validates
  (type swaps, out-of-range integers, renamed routes) tokens must be identical or the plan refused.
Never a traceback (any other exception fails the test). Bounded: MUTATIONS mutations, at most
GENERATES short generations (interpreter runs are slow). NINFER_FUZZ_SEED / NINFER_FUZZ_GENERATES
explore other mutations by hand; CI runs the fixed seed."""

from __future__ import annotations

import copy
import json
import os
import random
import shutil

import pytest

import ninfer_runtime as nr
from ninfer_runtime.errors import NinferRuntimeError

from . import support as S

MUTATIONS = 40
GENERATES = int(os.environ.get("NINFER_FUZZ_GENERATES", "3"))
SEED = int(os.environ.get("NINFER_FUZZ_SEED", "20261201"))  # another seed explores other mutations
PROMPT = [5, 77]
KINDS = ("type_swap", "out_of_range", "delete_key", "rename_route", "edit_weight_view")
VALIDATED = ("type_swap", "out_of_range", "rename_route")  # refused or identical tokens, even re-hashed


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, list) and obj and not all(isinstance(x, (int, float)) for x in obj):
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))
    else:
        yield path, obj


def _runtime_read_paths(plan):
    """Leaf paths of the members the runtime reads (where a mutation can matter)."""
    out = []
    for path, value in _leaves(plan):
        if path[0] in ("options", "buffers", "sm", "model_id"):
            out.append((path, value))
        elif path[0] == "extents" and len(path) > 3 and path[2] in ("launches", "tensors", "inputs", "outputs"):
            if path[2] == "launches" and len(path) > 4 and path[4] in ("source", "match"):
                continue
            out.append((path, value))
        elif path[0] == "extents" and len(path) == 3 and path[2] in ("t", "phase", "concurrency", "arena_bytes"):
            out.append((path, value))
    return out


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def _swap_type(v, rng):
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return rng.choice([str(v), float(v) + 0.5, [v], None])
    if isinstance(v, float):
        return rng.choice([str(v), [v], None])
    if isinstance(v, str):
        return rng.choice([len(v), [v], {"x": v}, None])
    if isinstance(v, list):
        return rng.choice([{"0": v}, "list", 3])
    return rng.choice([0, "x"])


def mutate(plan, kind, rng):
    """(description, mutated plan) for one deterministic mutation of `kind`."""
    m = copy.deepcopy(plan)
    reads = _runtime_read_paths(m)
    launches = [(e, i) for e, x in m["extents"].items() for i, _ in enumerate(x["launches"])]
    if kind == "type_swap":
        path, v = rng.choice(reads)
        new = _swap_type(v, rng)
        _get(m, path[:-1])[path[-1]] = new
        return f"type_swap {'/'.join(map(str, path))}: {v!r} -> {new!r}", m
    if kind == "out_of_range":
        ints = [(p, v) for p, v in reads if isinstance(v, int) and not isinstance(v, bool)]
        shape_dims = [(p + (i,), d) for p, v in reads if isinstance(v, list) and p[-1] == "shape"
                      for i, d in enumerate(v)]
        path, v = rng.choice(ints + shape_dims)
        new = rng.choice([-1, -(2**40), 2**63, 2**70, 10**15])
        _get(m, path[:-1])[path[-1]] = new
        return f"out_of_range {'/'.join(map(str, path))}: {v} -> {new}", m
    if kind == "delete_key":
        path, _ = rng.choice(reads)
        cut = rng.randrange(2, len(path) + 1) if len(path) > 2 else len(path)
        parent = _get(m, path[:cut - 1])
        key = path[cut - 1]
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
        return f"delete_key {'/'.join(map(str, path[:cut]))}", m
    if kind == "rename_route":
        routed = [(e, i) for e, i in launches if m["extents"][e]["launches"][i].get("route")]
        e, i = rng.choice(routed)
        L = m["extents"][e]["launches"][i]
        others = sorted(set(m["used_routes"]) - {L["route"]}) + ["no_such_route"]
        new = rng.choice(others)
        old, L["route"] = L["route"], new
        return f"rename_route {e}/launches[{i}] ({L['op']}): {old} -> {new}", m
    if kind == "edit_weight_view":
        refs = [(e, i, g, k) for e, i in launches for g in ("args", "outs")
                for k, r in (m["extents"][e]["launches"][i].get(g) or {}).items() if "weight" in r]
        e, i, g, k = rng.choice(refs)
        ref = m["extents"][e]["launches"][i][g][k]
        objects = sorted({r["weight"] for x in m["extents"].values() for L in x["launches"]
                          for r in list(L["args"].values()) + list(L["outs"].values()) if "weight" in r})
        choice = rng.choice(["other_object", "rows", "format"])
        if choice == "other_object":
            new = rng.choice([o for o in objects if o != ref["weight"]] + ["text/no/such/object"])
            old, ref["weight"] = ref["weight"], new
        elif choice == "rows":
            old, ref["rows"] = ref.get("rows"), rng.choice([[0, 1], [5, 10**9], [-3, 2]])
            new = ref["rows"]
        else:
            old, ref["format"] = ref.get("format"), rng.choice(["Q4G64_F16S", "FP32", "NOPE"])
            new = ref["format"]
        return f"edit_weight_view {e}/launches[{i}].{g}.{k} {choice}: {old!r} -> {new!r}", m
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def baseline(tiny_plan):
    art, plan = tiny_plan
    with nr.load(plan, art, progress=False) as eng:
        tokens = eng.generate(PROMPT, 2, ignore_eos=True).tokens
        vocab = eng.vocab_rows
    return art, plan, tokens, vocab


def _one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert msg and "\n" not in msg, f"not one line: {msg!r}"
    return msg


def test_plan_json_mutations(baseline, tmp_path):
    art, plan, want, vocab = baseline
    base = json.loads((plan / "plan.json").read_text())
    rng = random.Random(SEED)
    work = tmp_path / "fuzz.plan"
    shutil.copytree(plan, work)
    outcomes = {"noop": 0, "hash": 0, "refused_load": 0, "refused_run": 0, "same": 0, "other_tokens": 0,
                "load_only": 0}
    failures, other = [], []
    generates = 0
    for n in range(MUTATIONS):
        kind = KINDS[n % len(KINDS)]
        desc, mutated = mutate(base, kind, rng)
        if mutated == base:
            outcomes["noop"] += 1
            continue
        # 1. a plain edit: the integrity record refuses it
        (work / "plan.json").write_text(json.dumps(mutated))
        try:
            nr.load(work, art, progress=False).close()
            failures.append(f"{desc}: loaded although the body hash no longer matches")
        except nr.PlanMismatch as exc:
            if "body sha256" not in _one_line(exc):
                failures.append(f"{desc}: refused for another reason: {exc}")
            outcomes["hash"] += 1
        except Exception as exc:  # noqa: BLE001 - the point of the test
            failures.append(f"{desc}: {type(exc).__name__} escaped: {exc}")
        # 2. the same edit with the hash re-computed: the loader's own validation
        S.seal_plan_dir(work, mutated)
        try:
            eng = nr.load(work, art, progress=False)
        except NinferRuntimeError as exc:
            _one_line(exc)
            outcomes["refused_load"] += 1
            continue
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{desc} (re-hashed): load raised {type(exc).__name__}: {exc}")
            continue
        try:
            if generates >= GENERATES:
                outcomes["load_only"] += 1
                continue
            generates += 1
            try:
                got = eng.generate(PROMPT, 2, ignore_eos=True).tokens
            except NinferRuntimeError as exc:
                _one_line(exc)
                outcomes["refused_run"] += 1
                continue
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{desc} (re-hashed): generate raised {type(exc).__name__}: {exc}")
                continue
            if not all(0 <= t < vocab for t in got):
                failures.append(f"{desc} (re-hashed): tokens outside the vocabulary: {got}")
            elif got == want:
                outcomes["same"] += 1
            elif kind in VALIDATED:
                failures.append(f"{desc} (re-hashed): other tokens {got} (want {want}) from a validated kind")
            else:
                outcomes["other_tokens"] += 1
                other.append(desc)
        finally:
            eng.close()
    print("fuzz outcomes:", outcomes, "other tokens from:", other)
    assert not failures, "\n".join(failures)
    assert outcomes["hash"] >= MUTATIONS // 2  # most mutations change the plan and are caught by the hash
    assert outcomes["refused_load"] + outcomes["refused_run"] >= MUTATIONS // 4  # the loader's own checks work
