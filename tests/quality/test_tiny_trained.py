"""Quality of the committed trained tiny model (examples/tiny-trained/): perplexity through HF
transformers, the float32 reference and the runtime (Triton interpreter) agree; the default
quantized recipe's perplexity delta is bounded; the MTP head's greedy acceptance beats chance.

CPU cost is bounded by short slices of the held-out text (bench/quality.md has the full-corpus
numbers): the reference scores ~600 tokens, the interpreter-run plan 24 (its row kernels make
every prefill column cost about a second here).
"""

from __future__ import annotations

import hashlib
import io
import re
from contextlib import redirect_stderr, redirect_stdout

import pytest

from ninfer_runtime.perplexity import perplexity_of_ids

from . import support as S

REF_TOKENS = 600        # held-out slice for HF vs reference and the recipe delta
REF_CONTEXT, REF_STRIDE = 256, 128
RT_TOKENS = 24          # held-out slice for the interpreter-run plan (chunk 16 + a tail of 8)
PPL_AGREE = 0.005       # the issue's bound: 0.5%
# default recipe vs bf16: measured +0.009% on this slice, +0.085% on the whole corpus (bench/quality.md)
DEFAULT_DELTA_MAX = 0.005


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    d = tmp_path_factory.mktemp("trained")
    return {"bf16": S.pack(d / "tiny-bf16.ninfer", "bf16"), "default": S.pack(d / "tiny-default.ninfer", "default"),
            "dir": d}


@pytest.fixture(scope="module")
def ref_slice():
    text = S.slice_text(REF_TOKENS)
    ids = list(S.tokenizer().encode(text, add_special_tokens=False).ids)
    assert abs(len(ids) - REF_TOKENS) <= 4
    return text, ids


def _ppl(scorer, ids, context=REF_CONTEXT, stride=REF_STRIDE):
    return perplexity_of_ids(scorer, ids, context, stride)


def _ref_scorer(model):
    import torch

    def score(tokens):
        with torch.no_grad():
            return model.prefill(list(tokens))

    return score


def test_checkpoint_is_the_issue_shape():
    cfg = S.config()
    files = {p.name for p in S.CKPT.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "generation_config.json", "MODEL_CARD.md", "heldout.txt", "loss_curve.csv"} <= files
    assert sum(p.stat().st_size for p in S.CKPT.iterdir()) <= 8 * 2**20
    assert cfg["mtp_num_hidden_layers"] == 1
    assert cfg["hidden_size"] >= 128 and cfg["num_hidden_layers"] >= 6
    assert cfg["layer_types"].count("full_attention") >= 2
    assert cfg["head_dim"] % 64 == 0 and cfg["num_key_value_heads"] >= 2
    assert cfg["linear_num_value_heads"] == 3 * cfg["linear_num_key_heads"]
    assert 1024 <= cfg["vocab_size"] <= 4096 and S.tokenizer().get_vocab_size() <= cfg["vocab_size"]
    from safetensors import safe_open

    with safe_open(str(S.CKPT / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert {f.get_slice(n).get_dtype() for n in names} == {"BF16"}
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
            "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.down_proj.weight", "mtp.norm.weight"} <= names


def test_heldout_corpus_is_the_one_bench_quality_names():
    """bench/quality.md fixes the quality corpus by sha256: the committed text must be that one."""
    digest = hashlib.sha256(S.HELDOUT.read_bytes()).hexdigest()
    named = re.findall(r"heldout\.txt[^\n]*?sha256 `([0-9a-f]{64})`", S.QUALITY_MD.read_text())
    assert named == [digest]


def test_hf_and_reference_perplexity_agree_and_the_model_is_trained(artifacts, ref_slice):
    _, ids = ref_slice
    hf = _ppl(S.hf_scorer(S.hf_model()), ids)
    ref = _ppl(_ref_scorer(S.reference_model(artifacts["bf16"])), ids)
    assert hf.scored == ref.scored == len(ids) - 1
    assert abs(ref.perplexity / hf.perplexity - 1) < PPL_AGREE, (ref.perplexity, hf.perplexity)
    vocab = S.config()["vocab_size"]
    assert hf.perplexity < vocab / 10, f"perplexity {hf.perplexity:.1f}: not a trained model (vocab {vocab})"


def test_default_recipe_perplexity_delta_is_bounded(artifacts, ref_slice):
    _, ids = ref_slice
    bf16 = _ppl(_ref_scorer(S.reference_model(artifacts["bf16"])), ids).perplexity
    default = _ppl(_ref_scorer(S.reference_model(artifacts["default"])), ids).perplexity
    delta = default / bf16 - 1
    assert delta != 0.0  # the recipes differ: a zero delta would mean the same weights were scored
    assert abs(delta) < DEFAULT_DELTA_MAX, f"default recipe perplexity {default:.4f} vs bf16 {bf16:.4f}"


def test_reference_cli_perplexity(artifacts, tmp_path, ref_slice):
    from ninfer_compile.cli import main

    text = S.slice_text(120)
    f = tmp_path / "slice.txt"
    f.write_text(text, encoding="utf-8")
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(["reference", str(artifacts["bf16"]), "--perplexity", str(f), "--ppl-context", "64", "--quiet"])
    assert rc == 0
    last = out.getvalue().strip().splitlines()[-1]
    m = re.fullmatch(r"perplexity ([0-9.]+) over (\d+) scored tokens", last)
    assert m, last
    ids = list(S.tokenizer().encode(text, add_special_tokens=False).ids)
    assert int(m.group(2)) == len(ids) - 1
    want = _ppl(_ref_scorer(S.reference_model(artifacts["bf16"])), ids, 64, 32).perplexity
    assert float(m.group(1)) == pytest.approx(want, rel=1e-4)


def _compile(artifact, out, prefill_logits):
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan
    from runtime import support as RS

    table = RS.interp_table(out.parent / "interp90.yaml")
    opts = LowerOptions(prefill_chunk=16, concurrency=(1,), max_context=64, prefill_logits=prefill_logits, mtp=False)
    c = compile_artifact(artifact, 90, routes=table, opts=opts, binaries=False)
    write_plan(out, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    return out


def _run_cli(*argv):
    from ninfer_runtime.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_runtime_refuses_a_plan_without_all_position_logits(artifacts, tmp_path):
    plan = _compile(artifacts["bf16"], tmp_path / "last.plan", "last")
    f = tmp_path / "t.txt"
    f.write_text("def f(x):\n    return x\n", encoding="utf-8")
    rc, out, err = _run_cli(str(plan), "--artifact", str(artifacts["bf16"]), "--perplexity", str(f), "--quiet")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--prefill-logits all" in lines[0], err


def test_runtime_perplexity_matches_reference_and_hf(artifacts, tmp_path):
    text = S.slice_text(RT_TOKENS)
    ids = list(S.tokenizer().encode(text, add_special_tokens=False).ids)
    assert 16 < len(ids) <= 32  # two prefill chunks: 16 + a tail; one window of 32
    f = tmp_path / "slice.txt"
    f.write_text(text, encoding="utf-8")
    plan = _compile(artifacts["bf16"], tmp_path / "all.plan", "all")
    rc, out, err = _run_cli(str(plan), "--artifact", str(artifacts["bf16"]), "--perplexity", str(f),
                            "--ppl-context", "32", "--quiet")
    assert rc == 0, err
    m = re.fullmatch(r"perplexity ([0-9.]+) over (\d+) scored tokens", out.strip().splitlines()[-1])
    assert m and int(m.group(2)) == len(ids) - 1, out
    runtime_ppl = float(m.group(1))
    ref = _ppl(_ref_scorer(S.reference_model(artifacts["bf16"])), ids, 32, 16).perplexity
    hf = _ppl(S.hf_scorer(S.hf_model()), ids, 32, 16).perplexity
    assert abs(runtime_ppl / ref - 1) < PPL_AGREE, (runtime_ppl, ref)
    assert abs(runtime_ppl / hf - 1) < PPL_AGREE, (runtime_ppl, hf)


def test_mtp_greedy_acceptance_beats_chance(artifacts):
    from ninfer_compile.reference.acceptance import mtp_acceptance

    ids = S.heldout_ids()[:400]
    res = mtp_acceptance(S.reference_model(artifacts["bf16"]), ids, k_max=5, every=8, start=16)
    assert res.rounds == len(range(16, len(ids) - 1, 8))
    chance = 1.0 / S.config()["vocab_size"]
    rates = [res.acceptance_rate(k) for k in range(1, 6)]
    tpr = [res.tokens_per_round(k) for k in range(1, 6)]
    # measured here: 45.8% at K=1 (48 rounds), 1.46 -> 1.81 tokens per round; the whole-corpus rows
    # (bench/quality.md) reach 51.4%. A uniform random draft is accepted 1/2048 of the time.
    assert rates[0] >= 0.35 and rates[0] > 100 * chance, rates
    assert all(b >= a for a, b in zip(tpr, tpr[1:])) and tpr[-1] > tpr[0], tpr


@pytest.mark.parametrize("extra,msg", [(["--tokens", "1,2"], "--perplexity excludes --tokens/--out"),
                                       ([], "cannot read")])
def test_reference_cli_perplexity_errors_are_one_line(artifacts, tmp_path, capsys, extra, msg):
    from ninfer_compile.cli import main

    missing = tmp_path / "missing.txt"
    rc = main(["reference", str(artifacts["bf16"]), "--perplexity", str(missing), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and msg in err[0], err


def test_compile_flag_prefill_logits_reaches_the_plan(artifacts, tmp_path):
    """`ninfer-compile A --prefill-logits all` gives every prefill column its logits row (the
    option --perplexity needs); the default stays `last` (one row per chunk)."""
    import json as _json

    from ninfer_compile.cli import main

    rows = {}
    for mode in ("all", None):
        out = tmp_path / f"{mode}.plan"
        argv = [str(artifacts["bf16"]), "--sm", "90", "--prefill-chunk", "16", "--max-context", "64",
                "--no-binaries", "-o", str(out)] + (["--prefill-logits", mode] if mode else [])
        assert main(argv) == 0
        plan = _json.loads((out / "plan.json").read_text())
        prefill = next(e for e in plan["extents"].values() if e["phase"] == "prefill")
        rows[mode] = (plan["options"]["prefill_logits"], prefill["tensors"][prefill["outputs"]["logits"]]["shape"])
    assert rows["all"] == ("all", [16, 2048])
    assert rows[None] == ("last", [1, 2048])
