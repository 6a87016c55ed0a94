"""Exactness of the CPU's torch path (issue 28 item 2) on the trained tiny model (examples/tiny-trained,
packed bf16, with its MTP head), one plan with a draft window K = 2 (C = 1, 2; prefill logits all):
every greedy token, plain, MTP rounds and n-gram rounds, is the fp32 reference's argmax for its
prefix (near-ties within 2% of the logit spread allowed, as every end-to-end test); the speculative
runs give the plain run's tokens; C = 2 gives each sequence the C = 1 tokens; the perplexity of a
slice of the held-out file through the runtime is within 0.5% of the reference's over the same
windows. The same model packed with the default (quantized) recipe, prefill chunks of 16, runs every
linear on the packed int4 / int8 products: its tokens and perplexity pass the same checks. The
random tiny configs (K = 1..5, every KV format) are covered by test_runtime_e2e.py,
test_speculative_e2e.py and tests/kernels/kv_cache/test_kv_formats_e2e.py, which run on the torch
path too (the CPU default); bench/exactness_counts.py counts the same rule over every model, KV
format, mode and K (bench/results/exactness_counts_2026-12-06.md)."""

from __future__ import annotations

import pytest

from . import support as S

N_NEW = 16
PPL_TOKENS = 400  # a slice of the held-out file: 3 windows of 256, stride 128


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_trained_bf16):
    import ninfer_runtime as nr
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan
    from quality import support as Q

    d = tmp_path_factory.mktemp("cpu_exact")
    art = tiny_trained_bf16
    opts = LowerOptions(prefill_chunk=32, concurrency=(1, 2), max_context=256, draft_tokens=2, prefill_logits="all")
    c = compile_artifact(art, 90, opts=opts, binaries=False)
    plan = d / "k2.plan"
    write_plan(plan, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    ref = Q.reference_model(art)
    with nr.load(plan, art, progress=False) as eng:
        assert eng.kernels == "torch" and eng.has_mtp_drafts
        yield eng, ref, Q


def _check(ref, prompt, tokens):
    bad = S.check_tokens_against(lambda t: ref.prefill(list(t)).float(), prompt, tokens)
    assert not bad, "\n".join(bad)


def test_greedy_plain_mtp_ngram_are_the_reference_argmax(trained):
    eng, ref, Q = trained
    ids = Q.heldout_ids()
    prompts = [ids[:9], ids[500:530]]
    for prompt in prompts:
        plain = eng.generate(prompt, N_NEW, spec="none", ignore_eos=True).tokens
        _check(ref, prompt, plain)
        for mode in ("mtp", "ngram"):
            r = eng.generate(prompt, N_NEW, spec=mode, ignore_eos=True)
            assert r.tokens == plain, (mode, r.tokens, plain)
        assert eng.last_stats["spec"]["mode"] == "ngram"
    both = eng.generate(prompts, N_NEW, spec="mtp", ignore_eos=True, concurrency=2)
    for prompt, r in zip(prompts, both):
        assert r.tokens == eng.generate(prompt, N_NEW, spec="none", ignore_eos=True).tokens


def test_perplexity_slice_is_the_reference(trained):
    from ninfer_compile.reference.perplexity import reference_perplexity
    from ninfer_runtime.perplexity import engine_perplexity

    eng, ref, Q = trained
    text = Q.slice_text(PPL_TOKENS)
    ids = eng.frontend.encode(text, add_special_tokens=False)
    got = engine_perplexity(eng, text, context=256)
    want = reference_perplexity(ref, ids, context=256)
    assert got.scored == want.scored and got.windows == want.windows >= 2
    assert abs(got.perplexity / want.perplexity - 1) < 0.005, (got.perplexity, want.perplexity)


def test_interpreted_mtp_round_agrees_with_the_torch_path(trained):
    """The end-to-end speculative run of the plan's Triton kernels under the interpreter (slow: a
    few tokens): its MTP rounds' tokens and the torch path's are each the reference's argmax."""
    import ninfer_runtime as nr

    eng, ref, Q = trained
    prompt = Q.heldout_ids()[:5]
    want = eng.generate(prompt, 2, spec="mtp", ignore_eos=True).tokens
    with nr.load(eng.plan_dir, eng.artifact.path, progress=False, kernels="interpret") as interp:
        got = interp.generate(prompt, 2, spec="mtp", ignore_eos=True)  # the prefill's token + one round
        sp = interp.last_stats["spec"]
    assert sp["mode"] == "mtp" and sp["rounds"] >= 1
    for tokens in (got.tokens, want):
        _check(ref, prompt, tokens)


@pytest.mark.parametrize("path", ["fused", "native"])
def test_packed_products_keep_the_default_recipe_exact(tmp_path, path):
    """The default (quantized) recipe with prefill chunks of 16: every quantized linear, prefill
    included, runs on the few-column products (the plan's copy told to take them from the first
    weight on, the tiny model's weights being below MIN_PARAMS): the fused C++ kernel
    (linear/torch_fused.py: int16 x per group) or torch's packed int4 / int8 products (bf16
    scales and products, linear/torch_packed.py); greedy tokens are the reference argmax and the
    perplexity slice is within 0.5%."""
    import importlib

    import ninfer_runtime as nr
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.kernels.linear.torch_packed import MAX_COLUMNS
    from ninfer_compile.plan.writer import write_plan
    from ninfer_compile.reference.perplexity import reference_perplexity
    from ninfer_runtime.perplexity import engine_perplexity
    from quality import support as Q

    art = Q.pack(tmp_path / "tiny-trained-default.ninfer", "default")
    opts = LowerOptions(prefill_chunk=MAX_COLUMNS, concurrency=(1,), max_context=256, prefill_logits="all")
    c = compile_artifact(art, 90, opts=opts, binaries=False)
    write_plan(tmp_path / "p.plan", c.manifest, c.memory_txt, extra_files=c.kernel_files)
    ref = Q.reference_model(art)
    with nr.load(tmp_path / "p.plan", art, progress=False) as eng:
        importlib.import_module(f"{eng.kernel_package}.linear.torch_packed").MIN_PARAMS = 0
        fused = importlib.import_module(f"{eng.kernel_package}.linear.torch_fused")
        calls = []
        if path == "native":
            fused.kernel = lambda: None
        elif fused.kernel() is None:
            pytest.skip("the fused CPU kernel does not build or run here")
        else:
            matmul = fused.fused_matmul
            fused.fused_matmul = lambda x, w, *a: calls.append(w) or matmul(x, w, *a)
        prompt = Q.heldout_ids()[500:530]
        _check(ref, prompt, eng.generate(prompt, N_NEW, ignore_eos=True).tokens)
        text = Q.slice_text(PPL_TOKENS)
        got = engine_perplexity(eng, text, context=256)
        want = reference_perplexity(ref, eng.frontend.encode(text, add_special_tokens=False), context=256)
        packed = [tag for _, tag in importlib.import_module(f"{eng.kernel_package}.torch_util")._DERIVED]
    if path == "native":
        assert packed.count("packed") >= 10, packed
    else:
        assert len(calls) >= 10 and "packed" not in packed, (len(calls), packed)
    assert abs(got.perplexity / want.perplexity - 1) < 0.005, (got.perplexity, want.perplexity)
