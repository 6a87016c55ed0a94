"""bench/bench_spec.py on the CPU: the forced-acceptance drafter against a simulated greedy target,
the round / modelled / target arithmetic and its report, and the whole script in --dry mode (the
tiny synthetic MTP model under the interpreter; no timing is asserted)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_spec as bs  # noqa: E402


def _simulate(drafter, ref: list[int], k: int, rounds: int) -> list[int]:
    """Greedy verification against a target whose continuation is `ref`: per round the accepted
    count (longest draft prefix equal to ref), emitting accepted + 1 tokens as the runtime does."""
    out, acc = [ref[0]], []  # the prefill's first token
    drafter.extend([ref[0]])
    for _ in range(rounds):
        n = len(out)
        d = drafter.propose(k)
        assert len(d) == k
        a = 0
        while a < k and n + a < len(ref) and d[a] == ref[n + a]:
            a += 1
        acc.append(a)
        emit = ref[n:n + a + 1]
        out += emit
        drafter.extend(emit)
    return acc


@pytest.mark.parametrize("k", [1, 3, 5])
def test_forced_drafter_forces_every_round(k):
    ref = [(7 * i + 3) % 50 for i in range(200)]
    for a in range(k + 1):
        acc = _simulate(bs.ForcedDrafter([1, 2, 3], ref, a, vocab=50), ref, k, rounds=8)
        assert acc == [a] * 8, (a, acc)


def test_forced_drafter_after_divergence_proposes_only_wrong_tokens():
    ref = list(range(10, 40))
    d = bs.ForcedDrafter([1, 2], ref, accept=3, vocab=100)
    d.extend([10, 11, 99])  # the sequence left ref at its third token
    assert all(t != r for t, r in zip(d.propose(3), ref[3:6]))
    d2 = bs.ForcedDrafter([1, 2], ref, accept=2, vocab=100)
    d2.extend([10])
    assert d2.propose(4) == [11, 12, 14, 15]  # two right, then ref + 1
    assert bs.ForcedDrafter([1], [5], accept=3, vocab=6).propose(0) == []


def test_forced_factory_keys_by_prompt():
    f = bs.forced_factory({(1, 2): [4, 5, 6], (3,): [8, 9, 10]}, accept=1, vocab=20)
    a, b = f([1, 2]), f([3])
    a.extend([4]), b.extend([8])
    assert a.propose(2) == [5, 7] and b.propose(2) == [9, 11]


def _rows():
    t = {"plain": 10.0, "verify": 10.5, "mtp_verify": 0.4, "mtp_decode": 0.2}
    return [bs.round_row(1, 3, t), bs.round_row(1, 1, {"plain": 10.0, "verify": 10.2}),
            bs.round_row(2, 3, {**t, "plain": 11.0, "verify": 12.1})]


def test_round_row_and_targets_arithmetic():
    r = _rows()[0]
    assert r["draft_ms"] == pytest.approx(0.4 + 2 * 0.2) and r["round_ms"] == pytest.approx(11.3)
    assert r["verify_ratio"] == pytest.approx(1.05) and r["round_ratio"] == pytest.approx(1.13)
    assert r["plain_tok_s"] == pytest.approx(100.0)
    no_mtp = _rows()[1]
    assert no_mtp["draft_ms"] is None and no_mtp["round_ratio"] is None and no_mtp["round_ms"] == 10.2
    m = bs.modelled(r, 3.5)
    assert m["tok_s"] == pytest.approx(3.5 / 11.3 * 1e3) and m["speedup_vs_plain"] == pytest.approx(3.5 / 1.13)
    assert bs.modelled(no_mtp, 3.5) is None  # K = 1 cannot emit 3.5 tokens per round
    t = bs.targets(_rows())
    assert t["mtp3_round_ratio"] == pytest.approx(1.13) and t["mtp3_round_met"] is False
    assert t["single_stream_k"] == 3 and t["single_stream_tok_s"] == pytest.approx(3.5 / 11.3 * 1e3)
    assert t["single_stream_met"] is False
    fast = bs.targets([bs.round_row(1, 3, {"plain": 5.0, "verify": 5.2, "mtp_verify": 0.2, "mtp_decode": 0.05})])
    assert fast["mtp3_round_met"] and fast["single_stream_tok_s"] == pytest.approx(3.5 / 5.5 * 1e3)
    assert fast["single_stream_met"]  # 636 tok/s


def test_modelled_rows_cover_field_and_every_forced_count():
    rows = bs.modelled_rows(_rows())
    k3 = [m for m in rows if m["C"] == 1 and m["K"] == 3]
    assert [m["tokens_per_round"] for m in k3] == [1.0, 2.0, 3.0, 3.5, 4.0]
    assert [m["source"] for m in k3][3] == "field reports"
    c2 = next(m for m in rows if m["C"] == 2 and m["tokens_per_round"] == 4.0)
    assert c2["tok_s"] == pytest.approx(2 * 4.0 / (12.1 + 0.8) * 1e3)


def test_forced_summary_counts():
    s = bs.forced_summary({"rounds": 10, "proposed": 30, "accepted": 20, "tokens": 30, "plain_steps": 2}, 0.5, 2, 3)
    assert s["acceptance"] == pytest.approx(2 / 3) and s["tokens_per_round"] == 3.0 and s["label"] == "forced"


def test_report_renders_every_section():
    rows = _rows()
    res = {"provenance": {"gpu": "G", "date": "d", "driver": "1", "torch": "t", "triton": "3"}, "label": "x",
           "context": 4096, "reps": 50, "warmup": 10, "timer": "CUDA events",
           "plans": {3: {"path": "p", "options": {}}},
           "rounds": rows, "modelled": bs.modelled_rows(rows), "targets": bs.targets(rows),
           "forced": [{**bs.forced_summary({"rounds": 4, "proposed": 12, "accepted": 12, "tokens": 16}, 0.1, 3, 3),
                       "C": 1, "tok_s": 160.0, "plain_tok_s": 50.0}]}
    md = bs.render_md(res)
    assert "| 1 | 3 | 10.000 | 10.500 | 0.800 | 11.300 | 1.050x | 1.130x |" in md
    assert "MTP3 round at C=1: 1.130x a plain step (round); target <= 1.10x: NOT met" in md
    assert "| forced | 1 | 3 | 3 | 4 | 0 | 100.0% | 4.00 | 160.0 | 50.0 | 3.20x |" in md
    assert "(no MTP draft cost)" in md  # the K = 1 plan without MTP extents


@pytest.mark.slow
def test_dry_run_end_to_end(tmp_path):
    """The whole script on the CPU interpreter (minutes: ~30 interpreted extent runs): the K = 2 plan
    at C = 1, its round rows with the MTP draft cost, forced rows a = 0..2 through the runtime.
    --forced-tokens 3 (the dry default is 4; suite time): the prefill's token + 2 more still gives
    a = 0 two rounds (a multi-round run), a = 1 one whole round and a = 2 one round cut short."""
    assert bs.main(["--dry", "--out", str(tmp_path), "--forced-tokens", "3"]) == 0
    res = json.loads((tmp_path / "spec_dry.json").read_text())
    assert not res["errors"], res["errors"]
    assert [(r["C"], r["K"]) for r in res["rounds"]] == [(1, 2)]
    r = res["rounds"][0]
    assert r["draft_ms"] == pytest.approx(r["mtp_verify_ms"] + r["mtp_decode_ms"])  # the tiny model has MTP
    assert r["round_ratio"] == pytest.approx(r["round_ms"] / r["plain_ms"])
    forced = {f["forced_accept"]: f for f in res["forced"]}
    assert sorted(forced) == [0, 1, 2]
    for a, f in forced.items():
        assert f["label"] == "forced" and f["same_tokens_as_plain"] and f["rounds"] >= 1
        # every round of a run proposes K = 2 drafts and accepts a of them (the last one may be cut short)
        assert f["proposed"] == 2 * f["rounds"] and f["accepted"] == a * f["rounds"], f
    assert {m["tokens_per_round"] for m in res["modelled"]} == {1.0, 2.0, 3.0}
    assert (tmp_path / "spec_dry.md").read_text().startswith("# Speculative decoding, dry")


def test_merge_joins_runs_and_recomputes(tmp_path):
    prov = {"gpu": "G", "date": "d1", "driver": "1", "torch": "t", "triton": "3"}
    base = {"provenance": prov, "label": "a", "context": 4096, "reps": 50, "warmup": 10, "timer": "CUDA events",
            "forced": [], "errors": []}
    a = {**base, "plans": {"1": {}}, "rounds": [_rows()[1]]}
    b = {**base, "provenance": {**prov, "date": "d2"}, "plans": {"3": {}}, "rounds": [_rows()[0], _rows()[2]]}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert bs.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path),
                    "--label", "m"]) == 0
    m = json.loads((tmp_path / "spec_m.json").read_text())
    assert [(r["K"], r["C"]) for r in m["rounds"]] == [(1, 1), (3, 1), (3, 2)]
    assert m["targets"]["mtp3_round_ratio"] == pytest.approx(1.13) and sorted(m["plans"]) == ["1", "3"]
    assert [x["date"] for x in m["merged_from"]] == ["d1", "d2"]
