"""The MoE model under MTP and every KV format, as the dense one (issue 32 item 5), on the CPU's torch
path: a tiny random Qwen3_5MoeForCausalLM with head_dim 64 (every KV format stores it) and its MTP
layer (one full-attention sparse-MoE layer), packed with the default recipe (Q4 / Q5 expert banks),
compiled with a draft window K = 2 and one KV format per plan. Plain greedy tokens must be the fp32
reference's argmax with that format's KV (quantize -> dequantize of K / V; near-ties within 2% of
the logit spread allowed); MTP and n-gram rounds must give the plain tokens."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from ninfer_compile.kernels.kv_cache import formats as F
from reference.hf_tiny_moe import make_hf_moe_model, per_expert, random_moe_mtp

from . import support as S

PROMPT = [5, 77, 301, 12, 9, 250, 64, 3, 199, 42, 17]  # a prefill chunk of 8 + a tail of 3
N_NEW = 6


@pytest.fixture(scope="module")
def moe64(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe_kv")
    model = make_hf_moe_model(seed=3, head_dim=64)
    sd = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    sd.update({k: v.to(torch.bfloat16) for k, v in random_moe_mtp(model.config).items()})
    ckpt = d / "hf"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({**model.config.to_dict(), "mtp_num_hidden_layers": 1}))
    save_file({k: v.contiguous() for k, v in per_expert(sd).items()}, str(ckpt / "model.safetensors"))
    return d, S.pack(ckpt, d / "moe64.ninfer", "default")


@pytest.mark.parametrize("name", list(F.KV_DTYPES))
def test_moe_mtp_every_kv_format(moe64, name):
    import ninfer_runtime as nr
    from ninfer_compile.compile_cli import compile_artifact
    from ninfer_compile.ir.lower import LowerOptions
    from ninfer_compile.plan.writer import write_plan

    d, art = moe64
    opts = LowerOptions(prefill_chunk=8, concurrency=(1,), max_context=48, kv_dtype=name, draft_tokens=2)
    c = compile_artifact(art, 90, opts=opts, binaries=False)
    # two target attention layers + the MTP layer's own cache, all in the format
    assert c.memory.kv_bytes_per_token == F.bytes_per_token(F.FORMATS[name], 3, 2, 64)
    plan = d / f"moe64-{name}.sm90.plan"
    write_plan(plan, c.manifest, c.memory_txt, extra_files=c.kernel_files)
    with nr.load(plan, art, progress=False) as eng:
        assert eng.kernels == "torch" and eng.has_mtp_drafts
        plain = eng.generate(PROMPT, N_NEW, spec="none", ignore_eos=True).tokens
        runs, proposed = {}, {}
        for mode in ("mtp", "ngram"):
            runs[mode] = eng.generate(PROMPT, N_NEW, spec=mode, ignore_eos=True).tokens
            proposed[mode] = eng.last_stats["spec"]["proposed"]
    assert len(plain) == N_NEW
    bad = S.check_tokens_against(S.reference_logits_fn(art, kv_dtype=name), PROMPT, plain)
    assert not bad, f"{name}: " + "\n".join(bad)
    assert runs == {"mtp": plain, "ngram": plain}, (name, runs, plain)
    assert proposed["mtp"] > 0, f"{name}: the MTP head proposed no draft"
