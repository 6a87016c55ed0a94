"""`ninfer-compile --draft-tokens K` (docs/SPECULATIVE.md): the speculative extents, the verify graph's
ops, the MTP graphs' draft head (`take` for the shortlist), CUDA graphs, the memory lines, determinism
and the one-line errors; the 27B header plan with the shipped tables and routes."""

from __future__ import annotations

import json
import os

import pytest

from ninfer_compile.cli import main

from .support import tiny_artifact, write_table

GDN_LAYERS = 6  # tiny-qwen3.5-mtp: 8 layers, every 4th attention


def _without_draft_head(src, dst):
    """A header-only copy of `src` without the optional draft_head part (text/draft_head*)."""
    from ninfer_compile.artifact import Artifact, ArtifactWriter, ResourceSpec, TensorSpec

    with Artifact.open(src) as art:
        specs = [ResourceSpec(o.name, o.bytes) if o.kind == "resource" else TensorSpec(o.name, o.shape, o.format)
                 for o in art.objects if not o.name.startswith("text/draft_head")]
        model_id = art.model_id
    ArtifactWriter(dst, model_id, specs).write_sparse()
    return dst


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec_art")
    mtp = tiny_artifact(d / "tiny.ninfer", sparse=True)
    return {"mtp": mtp, "no_head": _without_draft_head(mtp, d / "nohead.ninfer"),
            "no_mtp": tiny_artifact(d / "plain.ninfer", "tiny-qwen3.5", sparse=True)}


@pytest.fixture
def table(tmp_path, test_registry):
    return write_table(tmp_path, 90)


def _compile(art, table, out, *extra):
    return main([str(art), "--sm", "90", "--routes", str(table), "-o", str(out), "--max-context", "64",
                 "--prefill-chunk", "16", "--quiet", *extra])


def _plan(out):
    return json.loads((out / "plan.json").read_text())


def _kinds(ext):
    return [L["kind"] for L in ext["launches"]]


@pytest.mark.parametrize("k", [1, 3])
def test_extents_phases_and_verify_graph(arts, table, tmp_path, capsys, k):
    out = tmp_path / "p.plan"
    assert _compile(arts["mtp"], table, out, "--concurrency", "1,2", "--draft-tokens", str(k)) == 0, \
        capsys.readouterr().err
    plan = _plan(out)
    ext = plan["extents"]
    w = k + 1
    text = {"prefill_t16": ("prefill", 16), "decode_c1_k0": ("decode", 1), "decode_c2_k0": ("decode", 2),
            f"verify_c1_k{k}": ("verify", w), f"verify_c2_k{k}": ("verify", 2 * w)}
    want = {**text, **{f"mtp_{n}": v for n, v in text.items()}}
    assert set(ext) == set(want)
    for name, (phase, t) in want.items():
        e = ext[name]
        assert (e["phase"], e["t"]) == (phase, t), name
        assert e["graph"] == ("mtp" if name.startswith("mtp_") else "text")
        assert e["draft_tokens"] == (k if phase == "verify" else 0)
        # decode and verify extents of both graphs are captured (and use PDL on sm90); prefill is eager
        assert e["cuda_graph"]["capture"] == (phase != "prefill"), name
        assert e["dependent_launch"]["enabled"] == (phase != "prefill"), name
    assert plan["options"]["draft_tokens"] == k and plan["options"]["draft_head"] == "shortlist"

    v = ext[f"verify_c2_k{k}"]
    kinds = _kinds(v)
    assert "sampling" not in kinds and kinds.count("spec_accept") == 1
    assert kinds.count("state_select") == 2 * GDN_LAYERS
    # state_select runs after spec_accept (it reads `accepted`)
    first_select = kinds.index("state_select")
    assert kinds.index("spec_accept") < first_select and "gated_delta_rule" not in kinds[first_select:]
    for L in v["launches"]:
        if L["kind"] in ("conv1d", "gated_delta_rule"):
            assert L["attrs"]["window"] == w
            cols = L["outs"]["conv_state_columns" if L["kind"] == "conv1d" else "state_columns"]["buffer"]
            assert v["tensors"][cols]["shape"][:2] == [2, k]
        if L["kind"] == "state_select":
            assert L["args"]["accepted"] == {"buffer": "accepted"} and L["args"]["slots"] == {"buffer": "slots"}
            assert L["outs"]["state"] == L["args"]["state"]
    acc = next(L for L in v["launches"] if L["kind"] == "spec_accept")
    assert set(acc["args"]) == {"logits", "ids", "n_drafts", "temperature", "top_k", "top_p", "seed", "sample_pos"}
    assert set(v["outputs"]) == {"logits", "tokens", "accepted", "hidden"}
    assert v["tensors"]["logits"]["shape"][0] == 2 * w and v["tensors"]["accepted"]["shape"] == [2]
    assert v["tensors"]["n_drafts"]["shape"] == [2] and v["tensors"]["seed"]["shape"] == [2 * w, 2]
    assert "n_drafts" in v["inputs"]
    # plain decode steps stay as at K = 0
    d = ext["decode_c2_k0"]
    assert "sampling" in _kinds(d) and "state_select" not in _kinds(d) and "n_drafts" not in d["inputs"]
    assert set(d["outputs"]) == {"logits", "ids", "hidden"}

    # MTP graphs: the shortlist head (text/draft_head) and a take of its token ids, every phase
    for name in (f"mtp_verify_c2_k{k}", "mtp_decode_c1_k0", "mtp_prefill_t16"):
        m = ext[name]
        assert set(m["outputs"]) == {"logits", "ids", "hidden"}, name
        head = next(L for L in m["launches"] if L["op"] == "lm_head")
        assert head["args"]["weight"]["weight"] == "text/draft_head"
        take = next(L for L in m["launches"] if L["kind"] == "take")
        assert take["route"] is None and take["builtin"] == "take"
        assert take["args"]["table"]["weight"] == "text/draft_head_token_ids"
        assert m["outputs"]["ids"] == take["outs"]["out"]["buffer"]
        assert "spec_accept" not in _kinds(m) and "n_drafts" not in m["inputs"]
    assert ext[f"mtp_verify_c2_k{k}"]["tensors"]["logits"]["shape"] == [2 * w, 128]  # draft_rows


def test_full_draft_head_and_artifacts_without_it(arts, table, tmp_path, capsys):
    out = tmp_path / "full.plan"
    assert _compile(arts["mtp"], table, out, "--draft-tokens", "2", "--draft-head", "full") == 0
    plan = _plan(out)
    m = plan["extents"]["mtp_decode_c1_k0"]
    assert "take" not in _kinds(m) and plan["options"]["draft_head"] == "full"
    assert next(L for L in m["launches"] if L["op"] == "lm_head")["args"]["weight"]["weight"] == "text/output_head"
    # no draft head in the artifact: the default is the full head; asking for the shortlist is one line
    out2 = tmp_path / "nohead.plan"
    assert _compile(arts["no_head"], table, out2, "--draft-tokens", "2") == 0, capsys.readouterr().err
    assert _plan(out2)["options"]["draft_head"] == "full"
    assert "take" not in _kinds(_plan(out2)["extents"]["mtp_verify_c1_k2"])
    capsys.readouterr()
    _bad(capsys, [str(arts["no_head"]), "--sm", "90", "--routes", str(table), "--draft-tokens", "2",
                  "--draft-head", "shortlist", "-o", str(tmp_path / "x.plan")],
         "--draft-head shortlist: the artifact (tiny-qwen3.5-mtp) has no text/draft_head", tmp_path)


def test_no_mtp_artifact_builds_text_extents_only(arts, table, tmp_path, capsys):
    out = tmp_path / "ngram.plan"
    assert _compile(arts["no_mtp"], table, out, "--concurrency", "1", "--draft-tokens", "3") == 0, \
        capsys.readouterr().err
    plan = _plan(out)
    assert set(plan["extents"]) == {"prefill_t16", "decode_c1_k0", "verify_c1_k3"}
    assert plan["options"]["draft_head"] is None
    assert set(plan["extents"]["verify_c1_k3"]["outputs"]) == {"logits", "tokens", "accepted"}
    assert "mtp_kv_bytes" not in plan["memory"] and plan["memory"]["verify_columns_bytes"] > 0


def test_memory_lines(arts, table, tmp_path):
    out, k0 = tmp_path / "k3.plan", tmp_path / "k0.plan"
    assert _compile(arts["mtp"], table, out, "--concurrency", "1,2", "--draft-tokens", "3") == 0
    assert _compile(arts["mtp"], table, k0, "--concurrency", "1,2") == 0
    plan = _plan(out)
    mem = plan["memory"]
    st = plan["buffers"]["state"]
    mtp_kv = sum(b["bytes"] for n, b in st.items() if n.startswith("mtp_kv/"))
    assert mtp_kv == 2 * 2 * 64 * 1 * 32 * 2 and mem["mtp_kv_bytes"] == mtp_kv  # k + v, 2 slots, 64 positions
    # per verify extent: GDN layers x C x K columns x (recurrent [Hv, Dk, Dv] f32 + conv [3, 272] bf16)
    per_col = 6 * 32 * 24 * 4 + 3 * 272 * 2
    assert mem["verify_columns_by_extent"] == {"verify_c1_k3": GDN_LAYERS * 3 * per_col,
                                               "verify_c2_k3": GDN_LAYERS * 6 * per_col}
    assert mem["verify_columns_bytes"] == GDN_LAYERS * 6 * per_col
    txt = (out / "memory.txt").read_text()
    assert f"MTP KV    M {mtp_kv:>16,d} B" in txt
    assert f"verify    V {GDN_LAYERS * 6 * per_col:>16,d} B" in txt
    assert f"  verify_c1_k3             {GDN_LAYERS * 3 * per_col:>14,d} B" in txt
    # K = 0: neither line, no MTP extents
    txt0 = (k0 / "memory.txt").read_text()
    assert "MTP KV" not in txt0 and "verify" not in txt0
    assert "mtp_kv_bytes" not in _plan(k0)["memory"]


def test_speculative_plan_is_deterministic(arts, table, tmp_path):
    a, b = tmp_path / "a.plan", tmp_path / "b.plan"
    assert _compile(arts["mtp"], table, a, "--concurrency", "1,2", "--draft-tokens", "3") == 0
    assert _compile(arts["mtp"], table, b, "--concurrency", "2,1", "--draft-tokens", "3") == 0
    for name in ("plan.json", "memory.txt"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def _bad(capsys, argv, needle, tmp_path):
    before = sorted(os.listdir(tmp_path))
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err, err
    assert sorted(os.listdir(tmp_path)) == before


def test_bad_draft_flags(arts, table, tmp_path, capsys):
    o = ["--sm", "90", "--routes", str(table), "-o", str(tmp_path / "p.plan")]
    for k in ("9", "-1"):
        _bad(capsys, [str(arts["mtp"]), *o, "--draft-tokens", k], f"--draft-tokens must be in 0..8, got {k}",
             tmp_path)
    with pytest.raises(SystemExit) as exc:  # a usage error: argparse's one line
        main([str(arts["mtp"]), *o, "--draft-head", "tiny"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "--draft-head: invalid choice: 'tiny'" in err and "\n" not in err
    # verify T = C x (K+1) may not exceed the prefill chunk
    _bad(capsys, [str(arts["mtp"]), *o, "--concurrency", "2", "--draft-tokens", "4", "--prefill-chunk", "8"],
         "verify extent C=2 x (K=4+1) = T 10 exceeds the prefill chunk 8", tmp_path)


def _routes(ext, kind):
    return {L["route"] for L in ext["launches"] if L["kind"] == kind}


def test_shipped_table_picks_the_verify_routes(arts, tmp_path, capsys):
    """With the route library and routes/sm90.yaml: the verify extents take the verify routes (rows
    measured by tune_new on the H200, 2026-12-02), the fusions keep their extra outputs / attributes."""
    out = tmp_path / "sm90.plan"
    assert main([str(arts["mtp"]), "--sm", "90", "-o", str(out), "--max-context", "64", "--prefill-chunk", "16",
                 "--concurrency", "2", "--draft-tokens", "3", "--quiet"]) == 0, capsys.readouterr().err
    ext = _plan(out)["extents"]
    v = ext["verify_c2_k3"]
    assert _routes(v, "gated_delta_rule") == {"gdn_recurrent_verify"}
    assert _routes(v, "conv1d") == {"conv1d_verify"}
    assert _routes(v, "state_select") == {"state_select_copy"}
    assert _routes(v, "spec_accept") == {"spec_accept_rows"}
    assert _routes(v, "attention") == {"attention_verify_packed"}  # measured 2026-12-02: wins every verify row
    assert _routes(v, "gdn_gating_proj") == {"gdn_gating_proj_rows"}
    # conv_input_parts and gdn_gating_proj fire at verify as at decode; the conv keeps window + columns
    assert v["fusions"]["conv_input_parts"] == GDN_LAYERS and v["fusions"]["gdn_gating_proj"] == GDN_LAYERS
    conv = next(L for L in v["launches"] if L["kind"] == "conv1d")
    assert conv["attrs"]["window"] == 4 and "x0" in conv["args"] and "conv_state_columns" in conv["outs"]
    assert {b["arg"] for b in conv["bind"]} >= {"x0", "x1", "x2", "conv_state_columns"}
    rule = next(L for L in v["launches"] if L["kind"] == "gated_delta_rule")
    assert "state_columns" in {b["arg"] for b in rule["bind"]}
    # the untimed rows are cited (sm90.yaml lines) like every other row
    assert all(L["source"].startswith("sm90.yaml:") for L in v["launches"] if L["route"])
    assert _routes(ext["mtp_verify_c2_k3"], "attention") == {"attention_verify_packed"}
    # decode keeps the three ops too, with the decode routes
    assert _routes(ext["decode_c2_k0"], "gated_delta_rule") == {"gdn_recurrent_decode"}


def test_27b_header_plan_with_draft_window(tmp_path, tmp_path_factory, capsys):
    q27 = tiny_artifact(tmp_path_factory.mktemp("q27") / "qwen3.6-27b.ninfer", "qwen3.6-27b", sparse=True)
    out = tmp_path / "q27.plan"
    assert main([str(q27), "--sm", "90", "-o", str(out), "--concurrency", "1,8", "--draft-tokens", "3",
                 "--quiet"]) == 0, capsys.readouterr().err
    plan = _plan(out)
    ext = plan["extents"]
    assert {"verify_c1_k3", "verify_c8_k3", "mtp_verify_c8_k3", "mtp_decode_c8_k0", "decode_c8_k0"} <= set(ext)
    v = ext["verify_c8_k3"]
    assert v["t"] == 32 and v["cuda_graph"]["capture"] and v["dependent_launch"]["enabled"]
    kinds = _kinds(v)
    assert kinds.count("gated_delta_rule") == 48 and kinds.count("state_select") == 96
    # per GDN layer per column: 48 value heads x 128 x 128 x 4 B recurrent + 3 x 10240 x 2 B conv
    per_col = 48 * 128 * 128 * 4 + 3 * 10240 * 2
    assert plan["memory"]["verify_columns_by_extent"]["verify_c8_k3"] == 48 * 8 * 3 * per_col
    assert plan["memory"]["mtp_kv_bytes"] > 0
    assert plan["options"]["draft_head"] == "shortlist"  # the synthetic artifact has every optional part
    take = next(L for L in ext["mtp_decode_c8_k0"]["launches"] if L["kind"] == "take")
    assert take["args"]["table"]["weight"] == "text/draft_head_token_ids"
    txt = (out / "memory.txt").read_text()
    assert "MTP KV    M" in txt and f"verify    V {48 * 8 * 3 * per_col:>16,d} B" in txt


def test_runtime_take_maps_the_shortlist_row_to_its_token_id(tmp_path_factory):
    """The runtime's `take` builtin (runtime/ninfer_runtime/executor.py): one MTP draft step of a
    compiled shortlist plan on the CPU returns draft_head_token_ids[argmax of the draft-head logits]."""
    import torch

    import ninfer_runtime as nr
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan
    from runtime.support import interp_table

    d = tmp_path_factory.mktemp("take")
    art = tiny_artifact(d / "tiny.ninfer")  # real (random) payloads: the runtime uploads them
    opts = LowerOptions(prefill_chunk=4, concurrency=(1,), max_context=8, draft_tokens=1)
    c = compile_artifact(art, 90, routes=interp_table(d / "interp90.yaml"), opts=opts)
    write_plan(d / "p.plan", c.manifest, c.memory_txt, extra_files=c.kernel_files)
    eng = nr.load(d / "p.plan", art, progress=False)
    try:
        r = eng.extents["mtp_decode_c1_k0"]
        assert "take" in [L["kind"] for L in r.entry["launches"]]
        r.inputs["ids"].fill_(5)
        r.inputs["positions"].zero_()
        r.inputs["slots"].zero_()
        r.inputs["hidden"].copy_(torch.randn(r.inputs["hidden"].shape, generator=torch.Generator().manual_seed(0)))
        for n in ("temperature", "top_k", "seed", "sample_pos"):
            r.inputs[n].zero_()
        r.inputs["top_p"].fill_(1.0)
        r.run()
        row = int(r.outputs["logits"][0].float().argmax())
        from ninfer_compile.artifact import Artifact

        with Artifact.open(art) as a:
            table = a.load("text/draft_head_token_ids")
        assert int(table[row]) != row  # (the synthetic table has no fixed point: a missing take would show)
        assert int(r.outputs["ids"][0]) == int(table[row])
    finally:
        eng.close()
