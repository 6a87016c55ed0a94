"""`ninfer-compile pack --synthetic`: exact inventories with random valid payloads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ninfer_compile.artifact import Artifact, encode_row_split
from ninfer_compile.contracts import check_artifact, load_contract
from ninfer_compile.convert import synthetic

from .conftest import cli


def test_tiny_full_synthetic_valid_and_deterministic(tmp_path):
    a, b, c = tmp_path / "a.ninfer", tmp_path / "b.ninfer", tmp_path / "c.ninfer"
    for path, seed in ((a, 7), (b, 7), (c, 8)):
        assert cli(["pack", "--synthetic", "tiny-qwen3.6-full", "-o", str(path), "--seed", str(seed),
                    "--no-progress"]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    spec = load_contract("tiny-qwen3.6-full").resolve()
    with Artifact.open(a) as art:
        check_artifact(art, spec)
        assert len(art.objects) == len(spec.objects)
        for name, exp in spec.objects.items():
            if exp.kind == "resource":
                data = art.resource_bytes(name)
                if name.endswith(".json"):
                    json.loads(data)
                continue
            if exp.format in ("BF16", "FP32"):
                t = art.load(name)
                assert bool(torch.isfinite(t.float()).all()), name
                if name.endswith(("a_log", "dt_bias")):
                    assert t.dtype == torch.float32 and bool((t.abs() < 5).all())
                continue
            if exp.format == "I32":
                ids = art.load(name)
                assert len(set(ids.tolist())) == ids.numel()
                assert 0 <= int(ids.min()) and int(ids.max()) < spec.params["token_ids"]
                continue
            # grouped: the encoder re-validates codes/scales and must reproduce the bytes exactly
            q = art.load_quantized(name)
            assert bytes(art.span(name)) == encode_row_split(exp.format, q.codes, q.scales), name
            assert bool((q.scales.float() > 0).all())


@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"])
def test_grouped_payload_odd_shapes(fmt):
    from ninfer_compile.artifact import decode_row_split, encoded_size

    for shape in [(3, 130), (1, 1), (2, 257), (5, 63), (4, 96)]:
        data = b"".join(synthetic.grouped_chunks(fmt, shape, np.random.default_rng(0)))
        assert len(data) == encoded_size(fmt, shape)
        q = decode_row_split(fmt, shape, data)
        assert encode_row_split(fmt, q.codes, q.scales) == data


def test_sparse_27b_header(tmp_path):
    out = tmp_path / "q27.ninfer"
    assert cli(["pack", "--synthetic", "qwen3.6-27b", "-o", str(out), "--sparse"]) == 0
    with Artifact.open(out) as art:
        assert len(art.objects) == 1118 + 6
        assert sum(1 for o in art.objects if o.kind == "tensor") == 1118
        check_artifact(art, load_contract("qwen3.6-27b").resolve())
        assert art.file_size > 17 * 10**9
    assert out.stat().st_blocks * 512 < 64 << 20  # a hole, not 17 GB of zeros


def test_synthetic_errors(tmp_path, capsys):
    assert cli(["pack", "--synthetic", "no-such-model", "-o", str(tmp_path / "x.ninfer")]) == 2
    assert "no-such-model" in capsys.readouterr().err


def test_synthetic_with_contract_file_writes_it_beside(tmp_path):
    from ninfer_compile.contracts import GRAPHS_DIR, find_contract

    text = (GRAPHS_DIR / "tiny-qwen3.5.yaml").read_text()
    contract = tmp_path / "mine.yaml"
    contract.write_text(text.replace("model_id: tiny-qwen3.5", "model_id: my-tiny", 1))
    out = tmp_path / "m.ninfer"
    assert cli(["pack", "--synthetic", "my-tiny", "--contract", str(contract), "-o", str(out), "--seed", "3",
                "--no-progress"]) == 0
    assert (tmp_path / "m.ninfer.contract.yaml").read_text() == contract.read_text()
    with Artifact.open(out) as art:
        assert art.model_id == "my-tiny"
        c = find_contract(out, art.model_id)
        check_artifact(art, c.resolve_for(art))
        assert any(o.kind == "resource" for o in art.objects)  # optional frontend synthesized too
