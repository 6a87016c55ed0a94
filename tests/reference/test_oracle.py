"""Torch reference and HF transformers against the independent float64 JAX oracle.

Measured on the tiny config (hidden 96, GDN 2 K heads -> 6 V heads, 4 layers, 12 tokens):
reference rel L2 vs oracle 4.7e-7, HF rel L2 vs oracle 4.6e-7 (both float32 evaluations of the
same bf16-exact weights); MTP draft logits vs oracle 4.0e-7. Synthetic `tiny-qwen3.5-mtp`
artifact (hidden 160, 8 layers, W8G32 MTP): text 1.6e-6, MTP 6.9e-7. Bounds below are 1e-4.
"""

import numpy as np
import pytest
import torch

from ninfer_compile.reference import DictWeights, ReferenceModel

from .hf_tiny import PROMPT

oracle_jax = pytest.importorskip("ninfer_compile.reference.oracle_jax")


@pytest.fixture(scope="module")
def weights(tiny_tensors):
    return DictWeights(tiny_tensors)


def test_reference_and_hf_vs_oracle(tiny_spec, weights, hf_model):
    report = oracle_jax.compare(tiny_spec, weights, PROMPT, hf_model=hf_model)
    print("oracle comparison:", report)
    assert report["reference_rel_l2"] < 1e-4
    assert report["hf_rel_l2"] < 1e-4
    assert report["reference_argmax_agree"] == 1.0 and report["hf_argmax_agree"] == 1.0
    out = oracle_jax.Oracle(tiny_spec, weights).logits(PROMPT)
    assert out.dtype == np.float64 and out.shape == (len(PROMPT), tiny_spec.dims["vocab_rows"])


def test_mtp_vs_oracle(tiny_spec, weights):
    """Target prefill, then the MTP head over the shifted tokens (column i: hidden i, token i+1,
    position i) — once for the whole window, once split into a prefill part and single steps."""
    ref = ReferenceModel(tiny_spec, weights)
    oracle = oracle_jax.Oracle(tiny_spec, weights)
    with torch.no_grad():
        logits = ref.prefill(PROMPT)
        hidden = ref.last_state.hidden                     # [T, H] final-norm target hidden
        nxt = int(logits[-1].argmax())
        tokens = PROMPT[1:] + [nxt]
        whole = ref.mtp_logits(tokens, hidden)
        st = ref.mtp.new_state()
        split = torch.cat([ref.mtp_logits(tokens[:7], hidden[:7], st)] +
                          [ref.mtp_logits(tokens[i:i + 1], hidden[i:i + 1], st) for i in range(7, len(tokens))])
    expect = oracle.mtp_logits(tokens, hidden)
    err = oracle_jax.rel_l2(whole, expect)
    print("mtp rel L2 vs oracle:", err)
    assert whole.shape == (len(tokens), tiny_spec.dims["vocab_rows"])
    assert err < 1e-4
    assert oracle_jax.rel_l2(split, expect) < 1e-4
    assert np.array_equal(whole.argmax(-1).numpy(), expect.argmax(-1))
    # The oracle's own target hidden states agree with the reference's.
    assert oracle_jax.rel_l2(hidden, oracle.hidden(PROMPT)) < 1e-4


def test_synthetic_mtp_artifact_vs_oracle(tmp_path):
    """`pack --synthetic tiny-qwen3.5-mtp` (random valid codes; W8G32 MTP matrices, Q4/Q5/Q6 text):
    text logits and MTP draft logits of the reference over ArtifactWeights vs the oracle over
    the same dequantized weights."""
    pytest.importorskip("ninfer_compile.convert.cli")
    from ninfer_compile.artifact.reader import Artifact
    from ninfer_compile.cli import main
    from ninfer_compile.contracts import check_artifact, find_contract
    from ninfer_compile.reference import ArtifactWeights

    out = tmp_path / "tiny-mtp.ninfer"
    assert main(["pack", "--synthetic", "tiny-qwen3.5-mtp", "-o", str(out), "--seed", "3"]) == 0
    with Artifact.open(out) as art:
        spec = find_contract(out, art.model_id, None).resolve_for(art)
        check_artifact(art, spec)
        assert spec.parts["mtp"]
        weights = ArtifactWeights(art)
        ref = ReferenceModel(spec, weights)
        oracle = oracle_jax.Oracle(spec, weights)
        prompt = [3, 250, 17, 99, 42, 1, 280, 64, 7, 150]
        with torch.no_grad():
            logits = ref.prefill(prompt)
            hidden = ref.last_state.hidden
            tokens = prompt[1:] + [int(logits[-1].argmax())]
            draft = ref.mtp_logits(tokens, hidden)
        text_err = oracle_jax.rel_l2(logits, oracle.logits(prompt))
        mtp_err = oracle_jax.rel_l2(draft, oracle.mtp_logits(tokens, hidden))
    print(f"synthetic artifact: text rel L2 {text_err:.3g}, mtp rel L2 {mtp_err:.3g}")
    assert text_err < 1e-4 and mtp_err < 1e-4
