"""Runtime unit tests: artifact view, plan checks on hand-made plan dirs, sampling, frontend."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from ninfer_runtime import PlanError, PlanMismatch, SamplingParams, load
from ninfer_runtime.artifact_view import GROUPED, ArtifactView, ArtifactViewError
from ninfer_runtime.frontend import Frontend, FrontendError, StreamDecoder, stop_ids_from
from ninfer_runtime.loader import check_device, read_plan

from .support import seal_plan_dir


# ----------------------------------------------------------------------------- artifact view


@pytest.fixture()
def small_artifact(tmp_path):
    from ninfer_compile.artifact.writer import ResourceSpec, TensorSpec, write_artifact  # noqa: F401
    from ninfer_compile.artifact.writer import ArtifactWriter

    w = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    res = b'{"eos_token_id": [3, 4]}'
    path = tmp_path / "small.ninfer"
    specs = [ResourceSpec("frontend/generation_config.json", len(res)), TensorSpec("w", (3, 4), "BF16"),
             TensorSpec("v", (5,), "FP32")]
    with ArtifactWriter(path, "tiny-test", specs) as wr:
        wr.write("frontend/generation_config.json", res)
        wr.write("w", w.contiguous().view(torch.uint8).numpy().tobytes())
        wr.write("v", torch.arange(5, dtype=torch.float32).numpy().tobytes())
    return path, w, res


def test_artifact_view_matches_compiler_reader(small_artifact):
    from ninfer_compile.artifact import Artifact

    path, w, res = small_artifact
    with ArtifactView.open(path) as av, Artifact.open(path) as ref:
        assert av.model_id == ref.model_id == "tiny-test"
        assert av.directory_sha256() == ref.directory_sha256()
        assert av.payload_offset == ref.payload_offset
        assert list(av.objects) == [o.name for o in ref.objects]
        for name in av.objects:
            assert bytes(av.span(name)) == bytes(ref.span(name))
        assert av.resource_bytes("frontend/generation_config.json") == res
        t = torch.frombuffer(av.span("w"), dtype=torch.uint8).view(torch.bfloat16).view(3, 4)
        assert torch.equal(t, w)
        with pytest.raises(ArtifactViewError, match="not a resource"):
            av.resource_bytes("w")


def test_artifact_view_rejects_bad_files(tmp_path, small_artifact):
    bad = tmp_path / "bad.ninfer"
    bad.write_bytes(b"NOTNINFER" + b"\0" * 100)
    with pytest.raises(ArtifactViewError, match="bad magic"):
        ArtifactView.open(bad)
    path, _, _ = small_artifact
    data = path.read_bytes()
    (tmp_path / "trunc.ninfer").write_bytes(data[:40])
    with pytest.raises(ArtifactViewError):
        ArtifactView.open(tmp_path / "trunc.ninfer")
    with pytest.raises(ArtifactViewError, match="cannot open"):
        ArtifactView.open(tmp_path / "missing.ninfer")


def test_runtime_row_split_formats_match_compiler():
    # The runtime names the row-split formats only; their plane geometry is the plan's kernels'
    # (linear.weights over the emitted artifact/formats.py), so there is no second copy to drift.
    from ninfer_compile.artifact.formats import GROUPED_FORMATS

    assert GROUPED == GROUPED_FORMATS


# ----------------------------------------------------------------------------- plan checks


def _plan_dir(tmp_path: Path, art: Path, **over) -> Path:
    d = tmp_path / "p.plan"
    (d / "kernels").mkdir(parents=True)
    with ArtifactView.open(art) as av:
        sha = av.directory_sha256()
    plan = {"format": "ninfer-plan-v1", "model_id": "tiny-test", "artifact": {"file": art.name, "directory_sha256": sha},
            "sm": 90, "options": {"max_context": 16, "prefill_chunk": 4, "concurrency": [1], "slots": 1},
            "buffers": {"arena": {"bytes": 256}, "state": {}}, "extents": {}}
    plan.update(over)
    (d / "plan.json").write_text(json.dumps(plan))
    init = "# emitted\n"
    (d / "kernels" / "__init__.py").write_text(init)
    km = {"format": "ninfer-kernels-v1", "triton": "x", "routes": {},
          "files": {"kernels/__init__.py": hashlib.sha256(init.encode()).hexdigest()}}
    (d / "kernels" / "manifest.json").write_text(json.dumps(km))
    seal_plan_dir(d)
    return d


def test_plan_errors(tmp_path, small_artifact):
    art, _, _ = small_artifact
    with pytest.raises(PlanError, match="no plan.json"):
        load(tmp_path, art, device="cpu", progress=False)
    d = _plan_dir(tmp_path, art)
    with pytest.raises(PlanError, match="text prefill"):  # no extents at all
        load(d, art, device="cpu", progress=False)
    # another artifact -> directory hash mismatch, one line
    plan = json.loads((d / "plan.json").read_text())
    plan["artifact"]["directory_sha256"] = "0" * 64
    plan = seal_plan_dir(d, plan)
    with pytest.raises(PlanMismatch, match="not the artifact this plan was compiled for") as ei:
        load(d, art, device="cpu", progress=False)
    assert "\n" not in str(ei.value)
    # wrong plan format
    plan["format"] = "ninfer-plan-v0"
    seal_plan_dir(d, plan)
    with pytest.raises(PlanMismatch, match="plan format"):
        read_plan(d)


def test_plan_kernel_files_checked(tmp_path, small_artifact):
    art, _, _ = small_artifact
    d = _plan_dir(tmp_path, art)
    (d / "kernels" / "__init__.py").write_text("# edited\n")
    with pytest.raises(PlanMismatch, match="kernels/__init__.py: sha256 does not match plan.json integrity"):
        load(d, art, device="cpu", progress=False)
    seal_plan_dir(d)  # the integrity record re-computed: the kernel manifest's own sha256 still refuses it
    with pytest.raises(PlanMismatch, match="does not match its sha256"):
        load(d, art, device="cpu", progress=False)
    (d / "kernels" / "manifest.json").unlink()
    with pytest.raises(PlanMismatch, match="kernels/manifest.json: missing"):
        load(d, art, device="cpu", progress=False)
    seal_plan_dir(d)
    with pytest.raises(PlanError, match="no emitted kernels"):
        load(d, art, device="cpu", progress=False)


def test_sm_mismatch_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 6))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake RTX 3090")
    with pytest.raises(PlanMismatch, match="sm_90.*sm_86"):
        check_device({"sm": 90}, torch.device("cuda", 0))
    assert "sm_86" in check_device({"sm": 86}, torch.device("cuda", 0))
    assert "runs on the CPU" in check_device({"sm": 90}, torch.device("cpu"))


# ----------------------------------------------------------------------------- sampling


# Token selection runs on the device (the plan's sampling launch): kernel tests in
# tests/kernels/sampling, the runtime path in tests/runtime/test_device_sampling.py.


def test_sampling_filters_and_params():
    """The distribution the device draws from (kernels/sampling/reference.filtered_probs) keeps
    what the host sampler kept; SamplingParams validates and packs its device row."""
    from ninfer_compile.kernels.sampling.reference import filtered_probs

    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9, -5.0]])
    assert set(torch.nonzero(filtered_probs(logits, 1.0, top_k=2)[0]).flatten().tolist()) == {1, 3}
    probs = filtered_probs(logits, 1.0, top_p=0.5)[0]  # 1 holds < 0.5: keep 1 and 3
    assert set(torch.nonzero(probs).flatten().tolist()) == {1, 3} and abs(float(probs.sum()) - 1) < 1e-6
    assert set(torch.nonzero(filtered_probs(logits, 1.0, top_p=1e-6)[0]).flatten().tolist()) == {1}
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    assert SamplingParams(temperature=0.7, greedy=True).is_greedy
    assert SamplingParams(temperature=0.7, greedy=True).row()[0] == 0.0  # greedy on the device


# ----------------------------------------------------------------------------- frontend


class _FakeArt:
    def __init__(self, res: dict[str, bytes]):
        self.res = res

    def has_resource(self, name):
        return name in self.res

    def resource_bytes(self, name):
        return self.res[name]


def _tokenizer_json() -> bytes:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["hello world, the runtime streams tokens é ü"] * 4, trainer=tr)
    return tok.to_str().encode()


def test_frontend_from_resources():
    tmpl = ("{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}"
            "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
    f = Frontend.from_artifact(_FakeArt({
        "frontend/tokenizer.json": _tokenizer_json(),
        "frontend/chat_template.jinja": tmpl.encode(),
        "frontend/generation_config.json": b'{"eos_token_id": 1}',
    }))
    assert f.stop_ids == (1,)
    ids = f.encode("hello world é")
    assert f.decode(ids) == "hello world é"
    chat = f.encode_chat("hello")
    assert chat[0] == 0 and f.decode(chat).startswith("<|im_start|>user\nhello<|im_end|>")
    # streaming decode reproduces the text, holding back partial UTF-8
    sd = StreamDecoder(f)
    text = "".join(sd.push(i) for i in ids) + sd.flush()
    assert text == "hello world é"


def test_frontend_without_tokenizer():
    f = Frontend.from_artifact(_FakeArt({}))
    assert not f.has_tokenizer and f.stop_ids == ()
    with pytest.raises(FrontendError, match="no tokenizer"):
        f.encode("hi")
    with pytest.raises(FrontendError, match="no chat template"):
        f.render_chat([{"role": "user", "content": "x"}])
    assert stop_ids_from({"eos_token_id": [5, 6]}) == (5, 6)
    with pytest.raises(FrontendError):
        stop_ids_from({"eos_token_id": "x"})


def test_concat_parts_coalesce_adjacent_views():
    from ninfer_runtime.executor import coalesce_adjacent

    base = torch.arange(3 * 16, dtype=torch.float32).reshape(3, 16)
    other = torch.arange(3 * 4, dtype=torch.float32).reshape(3, 4) + 1000
    q, k, gap = base[:, 0:4], base[:, 4:10], base[:, 12:14]        # q|k adjacent; gap is not
    parts = [q, k, gap, other]
    merged = coalesce_adjacent(parts, 1)
    assert len(merged) == 3 and merged[0].shape == (3, 10)
    assert torch.equal(torch.cat(merged, 1), torch.cat(parts, 1))
    # views of different buffers, or of rows (axis 0 with a column slice), are left alone
    assert len(coalesce_adjacent([q, other], 1)) == 2
    assert len(coalesce_adjacent([base[0:1, 0:4], base[1:2, 0:4]], 0)) == 1
    assert len(coalesce_adjacent([base[0:1, 0:4], base[2:3, 0:4]], 0)) == 2
