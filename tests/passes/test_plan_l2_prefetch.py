"""plan_l2_prefetch (passes/plan_l2_prefetch.py): where the L2 weight prefetches go, that only a table
with an `l2_prefetch` section gets them, and that a plan with them runs to the same tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ninfer_compile.cli import main as cli
from ninfer_compile.convert.synthetic import pack_synthetic

REPO = Path(__file__).resolve().parents[2]
SECTION = """
l2_prefetch:
  - match: {phase: decode}
    routes:
      - {t: [1, 64], route: l2_prefetch_bulk, params: {BYTES: 4194304%s}}
      - {t: [65, max], unsupported: 'decode steps only'}
"""


def prefetch_table(d: Path, fold: bool = False) -> Path:
    """routes/sm90.yaml plus an l2_prefetch section (decode extents; FOLD true: folded where it can)."""
    t = d / f"sm90_l2_prefetch{'_fold' if fold else ''}.yaml"
    t.write_text((REPO / "routes" / "sm90.yaml").read_text() + SECTION % (", FOLD: true" if fold else ""))
    return t


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("l2pf")
    art = d / "tiny.ninfer"
    pack_synthetic("tiny-qwen3.5", art, progress=False)
    out = {}
    for name, extra in (("plain", []), ("prefetch", ["--routes", str(prefetch_table(d))]),
                        ("fold", ["--routes", str(prefetch_table(d, fold=True))])):
        plan = d / f"{name}.plan"
        assert cli(["compile", str(art), "--sm", "90", "--no-binaries", "-q", "--concurrency", "1,2",
                    "-o", str(plan), *extra]) == 0
        out[name] = json.loads((plan / "plan.json").read_text())
        out[name + "_dir"] = plan
    out["artifact"] = art
    with load_plan(out["plain_dir"], art) as eng:
        out["plain_tokens"] = eng.generate([[1, 2, 3, 4, 5]], max_new_tokens=6, greedy=True)
    return out


def _ops(extent):
    return [(l["kind"], l["op"]) for l in extent["launches"]]


def test_each_linear_after_small_launches_gets_its_weight_prefetched_at_the_run_head(plans):
    plain, pf = plans["plain"], plans["prefetch"]
    for name, ext in pf["extents"].items():
        launches = ext["launches"]
        pre = [l for l in launches if l["kind"] == "l2_prefetch"]
        if ext["phase"] != "decode":
            assert not pre, name  # the table has rows for decode steps only
            assert _ops(ext) == _ops(plain["extents"][name])
            continue
        assert pre, name
        # without the prefetches the launch list is the plain plan's
        assert [o for o in _ops(ext) if o[0] != "l2_prefetch"] == _ops(plain["extents"][name])
        kinds = [l["kind"] for l in launches]
        for i, l in enumerate(launches):
            if l["kind"] == "linear":
                prev = [k for k in kinds[:i] if k != "l2_prefetch"]
                gap = prev and prev[-1] != "linear"
                mine = [p for p in pre if p["op"] == l["op"] + ".l2_prefetch"]
                assert len(mine) == (1 if gap or not prev else 0), (name, l["op"])
                if mine:
                    j = launches.index(mine[0])
                    # right after the previous linear (or first), before the small launches
                    assert all(k != "linear" for k in kinds[j + 1:i]), (name, l["op"])
                    assert j == 0 or kinds[j - 1] == "linear" or kinds[j - 1] == "l2_prefetch"
                    assert mine[0]["args"]["weight"] == l["args"]["weight"]
        assert all(p["params"] == {"BYTES": 4194304, "PIECE": 1 << 20, "FOLD": False} for p in pre)


def test_fold_hands_the_prefetch_to_the_op_that_heads_the_run(plans):
    sep, fold = plans["prefetch"], plans["fold"]
    for name, ext in fold["extents"].items():
        if ext["phase"] != "decode":
            continue
        by_op = {l["op"]: l for l in ext["launches"]}
        sep_pre = [l for l in sep["extents"][name]["launches"] if l["kind"] == "l2_prefetch"]
        folded = 0
        for p in sep_pre:
            launches = sep["extents"][name]["launches"]
            head = launches[launches.index(p) + 1]  # the run's first op
            if head["kind"] in ("rmsnorm", "gdn_gating_proj"):  # the families that take a prefetch
                assert p["op"] not in by_op  # no launch: the norm issues it
                got = by_op[head["op"]]
                assert got["args"]["prefetch"] == p["args"]["weight"]
                assert {"arg": "prefetch_bytes", "scalar": 4194304} in got["bind"]
                folded += 1
            else:  # a run headed by another family (embedding, qk_norm_rope) keeps its own launch
                assert by_op[p["op"]]["kind"] == "l2_prefetch"
        assert folded and len(ext["launches"]) == len(sep["extents"][name]["launches"]) - folded
    with load_plan(plans["fold_dir"], plans["artifact"]) as eng:
        assert eng.generate([[1, 2, 3, 4, 5]], max_new_tokens=6, greedy=True) == plans["plain_tokens"]


def load_plan(plan, artifact):
    from ninfer_runtime import load

    return load(plan, artifact, progress=False)


def test_a_table_without_the_section_gets_no_pass(plans):
    assert "plan_l2_prefetch" not in plans["plain"]["passes"]["enabled"]
    assert "plan_l2_prefetch" in plans["prefetch"]["passes"]["enabled"]
    assert all(l["kind"] != "l2_prefetch" for e in plans["plain"]["extents"].values() for l in e["launches"])


def test_the_plan_with_prefetches_runs_to_the_same_tokens_on_the_cpu(plans):
    with load_plan(plans["prefetch_dir"], plans["artifact"]) as eng:
        assert eng.generate([[1, 2, 3, 4, 5]], max_new_tokens=6, greedy=True) == plans["plain_tokens"]
