"""Greedy end to end for every KV format under the Triton interpreter: a tiny random HF model with
head_dim 64 (every format stores it) -> pack bf16 -> compile --sm 90 --kv-dtype NAME ->
ninfer_runtime. Every generated token must be the argmax (or a near-tie within 2% of the logit
spread) of ninfer_compile.reference run with the same KV format: its KV cache keeps what the
format gives back (quantize -> dequantize of the bf16 K / V rows). The runtime needs no change:
the plan carries the format's buffers and kernels."""

from __future__ import annotations

import pytest

from ninfer_compile.kernels.kv_cache import formats as F

S = pytest.importorskip("runtime.support")  # tests/runtime/support.py (tests/ is on sys.path)

N_NEW = 6
PROMPT = [5, 77, 301, 12, 9, 250, 64, 3, 199, 42]  # a prefill chunk of 8 + a tail of 2


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory):
    import reference.hf_tiny as tiny

    d = tmp_path_factory.mktemp("kv_e2e")
    model = tiny.make_hf_model(0, **S.TINY_OVERRIDES, head_dim=64)
    model.save_pretrained(d / "hf", safe_serialization=True)
    art = S.pack(d / "hf", d / "tiny64-bf16.ninfer", "bf16")
    return d, art, S.interp_table(d / "interp90.yaml")


@pytest.mark.parametrize("name", list(F.KV_DTYPES))
def test_greedy_every_format(tiny64, name):
    import ninfer_runtime as nr
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan

    d, art, table = tiny64
    opts = LowerOptions(prefill_chunk=8, concurrency=(1,), max_context=32, kv_dtype=name)
    c = compile_artifact(art, 90, routes=table, opts=opts, binaries=False)
    assert c.memory.kv_bytes_per_token == F.bytes_per_token(F.FORMATS[name], 1, 2, 64)  # 1 attention layer
    plan = d / f"tiny64-{name}.sm90.plan"
    write_plan(plan, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    eng = nr.load(plan, art, progress=False)
    try:
        r = eng.generate(PROMPT, N_NEW, ignore_eos=True)
    finally:
        eng.close()
    assert len(r.tokens) == N_NEW
    bad = S.check_tokens_against(S.reference_logits_fn(art, kv_dtype=name), PROMPT, r.tokens)
    assert not bad, f"{name}: " + "\n".join(bad)
