"""bench/quality_runtime.py's protocol (MTP acceptance through the runtime's rounds beside the
reference at the same rounds) on spec-runtime's fake engine (tests/runtime/spec_fake.py: the plan's
extents computed by the float32 reference of the trained tiny model): the rounds' accepted counts
must then equal the reference's `mtp_acceptance` at the mapped positions, round for round; a wrong
position mapping or a round protocol that drafts from the wrong MTP column breaks the equality.
The compiled-plan run (interpreter / GPU) is `python bench/quality.py --runtime-acceptance`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from . import support as S

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import quality_runtime as QR  # noqa: E402


@pytest.fixture(scope="module")
def model():
    from safetensors.torch import load_file
    from transformers import Qwen3_5TextConfig

    from ninfer_compile.convert.hf import convert_state_dict
    from ninfer_compile.reference import ReferenceModel
    from ninfer_compile.reference.weights import DictWeights
    from reference.hf_tiny import spec_for

    cfg = Qwen3_5TextConfig.from_pretrained(str(S.CKPT))
    tensors = convert_state_dict(cfg.to_dict(), load_file(str(S.CKPT / "model.safetensors")))
    return ReferenceModel(spec_for(cfg, mtp=True), DictWeights(tensors))


def test_runtime_rounds_accept_what_the_reference_accepts(model):
    from runtime.spec_fake import FakeEngine

    ids = S.heldout_ids()
    prompts = [ids[0:12], ids[15000:15012]]  # two corpus slices, decoded together (C = 2)
    k = 3
    eng = FakeEngine(model, k=k, concurrency=(1, 2), chunk=8, max_context=48)
    per_slot = QR.run_rounds(eng, prompts, new_tokens=12)
    assert not eng.violations, eng.violations
    assert all(len(s["tokens"]) >= 12 for s in per_slot)
    rt, ref, agree = QR.compare(model, per_slot, k)
    assert len(rt) == sum(len(s["rounds"]) for s in per_slot) >= 6
    assert rt == ref and agree == len(rt)
    assert 0 < sum(rt) < k * len(rt)  # the trained head drafts some right, not all
    table = QR._table(rt, k)
    assert table[0]["tokens_per_round"] == pytest.approx(1 + sum(min(L, 1) for L in rt) / len(rt))
