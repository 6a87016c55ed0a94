"""Sampling on the device, end to end (tiny plan under the interpreter): the plan's extents carry
the sampling launch with per-row parameter inputs, a decode step reads nothing from the device
but its new ids, and seeded sampling is reproducible and independent of the batch."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from . import support as S

SYNCS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    import ninfer_runtime as nr

    d = tmp_path_factory.mktemp("devsample")
    S.make_hf_checkpoint(d / "hf")
    art = S.pack(d / "hf", d / "tiny-bf16.ninfer", "bf16")
    plan = S.compile_plan(art, d / "tiny-bf16.sm90.plan", table=S.interp_table(d / "interp90.yaml"),
                          concurrency=(1, 2))
    eng = nr.load(plan, art, progress=False)
    yield plan, eng
    eng.close()


def test_every_extent_samples_on_the_device(engine):
    plan, eng = engine
    pj = json.loads((plan / "plan.json").read_text())
    for name, x in pj["extents"].items():
        (L,) = [L for L in x["launches"] if L["kind"] == "sampling"]
        assert L["route"] == "sample_per_slot", name
        rows = x["tensors"][L["args"]["logits"]["buffer"]]["shape"][0]
        for n, shape, dt in (("temperature", [rows], "f32"), ("top_k", [rows], "i32"), ("top_p", [rows], "f32"),
                             ("seed", [rows, 2], "i32"), ("sample_pos", [rows], "i32")):
            assert x["inputs"][n] == n and L["args"][n] == {"buffer": n}
            assert x["tensors"][n]["shape"] == shape and x["tensors"][n]["dtype"] == dt
        assert x["outputs"]["ids"] == L["outs"]["ids"]["buffer"]
    # the runtime runs it: its workspace is part of each extent's allocation, as the report says
    mem = pj["memory"]["route_workspace_by_extent"]
    for name, r in eng.extents.items():
        assert any(L["kind"] == "sampling" for L, *_ in r._launch_specs), name
        assert mem.get(name, 0) == r._ws_numel * 4


def test_decode_step_reads_only_its_new_ids(engine, monkeypatch):
    """Count the runtime's own device->host reads (Tensor.item / tolist / cpu / int(...) ... and
    torch.cuda.synchronize called from ninfer_runtime code): one per admitted prompt (its first
    token) and one per decode step (the C new ids), nothing else."""
    _, eng = engine
    calls: list[str] = []

    def counting(name, orig):
        def f(*a, **kw):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("ninfer_runtime"):
                calls.append(f"{caller}:{name}")
            return orig(*a, **kw)
        return f

    for n in SYNCS:
        monkeypatch.setattr(torch.Tensor, n, counting(n, getattr(torch.Tensor, n)))
    monkeypatch.setattr(torch.cuda, "synchronize", counting("synchronize", torch.cuda.synchronize))
    prompts = [S.PROMPT[:5], S.PROMPT[2:9], S.PROMPT[:3]]
    events = list(eng.stream(prompts, 3, ignore_eos=True, concurrency=2, temperature=0.9, top_k=20, top_p=0.9,
                             seed=5))
    monkeypatch.undo()
    st = eng.last_stats
    assert len(events) == 9 and st["decode_steps"] > 0
    assert calls.count("ninfer_runtime.steps:tolist") == len(prompts) + st["decode_steps"], calls
    assert len(calls) == len(prompts) + st["decode_steps"], calls


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(engine):
    """Prompt a with seed 77, first of [a, b] (seeds 77, 78), then second of [b, a] (seeds 76, 77):
    another column, another neighbour, the same tokens; and they are not the greedy ones."""
    _, eng = engine
    import ninfer_runtime as nr

    a, b = S.PROMPT[:6], [7, 8, 9, 10, 11, 300, 2]
    kw = dict(temperature=1.5, top_k=40, top_p=0.95)
    r1 = eng.generate([a, b], 4, ignore_eos=True, concurrency=2, sampling=nr.SamplingParams(seed=77, **kw))
    r2 = eng.generate([b, a], 4, ignore_eos=True, concurrency=2, sampling=nr.SamplingParams(seed=76, **kw))
    assert r1[0].tokens == r2[1].tokens
    greedy = eng.generate([a, b], 4, ignore_eos=True, concurrency=2)
    assert [r.tokens for r in greedy] != [r.tokens for r in r1]


def test_plan_without_sampling_is_refused_in_one_line():
    from ninfer_runtime.errors import NinferRuntimeError
    from ninfer_runtime.sampling import require_device_sampling

    class R:
        name, inputs, outputs = "decode_c1_k0", {"ids": None}, {"logits": None}

    with pytest.raises(NinferRuntimeError, match="decode_c1_k0 has no sampling launch .*recompile"):
        require_device_sampling(R())


def test_sampling_params_rows():
    from ninfer_runtime.sampling import SamplingParams, host_rows

    assert SamplingParams().row() == (0.0, 0, 1.0, 0, 0)
    assert SamplingParams(temperature=1.0, greedy=True).row()[0] == 0.0
    t, k, p, lo, hi = SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=2**63 - 1).row()
    assert (t, k, lo, hi) == (0.5, 3, -1, 2**31 - 1) and abs(p - 0.9) < 1e-9
    w = host_rows([(SamplingParams(temperature=0.5, top_k=3, seed=(5 << 32) | 7), 11)], 2)
    assert w.dtype == torch.int32 and w.numel() == 12
    assert w[0:2].tolist() == [3, 0] and w[2:4].tolist() == [11, 0]
    assert w[4:6].view(torch.float32).tolist() == [0.5, 0.0] and w[8:12].tolist() == [7, 5, 0, 0]
    for bad in (dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
