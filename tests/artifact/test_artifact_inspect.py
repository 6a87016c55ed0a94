"""`ninfer-compile inspect` through `ninfer_compile.cli.main`."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from artifact_testlib import raw_artifact, sample_items, valid_root
from ninfer_compile import cli
from ninfer_compile.artifact import Artifact, ArtifactWriter, TensorSpec, write_artifact


@pytest.fixture(autouse=True)
def inspect_only(monkeypatch):
    # Only this package's subcommand: the others may not exist yet in this checkout.
    monkeypatch.setattr(cli, "SUBCOMMANDS", {"inspect": cli.SUBCOMMANDS["inspect"]})


@pytest.fixture
def artifact_path(tmp_path):
    path = tmp_path / "model.ninfer"
    write_artifact(path, "tiny-test", sample_items())
    return path


def test_listing(artifact_path, capsys):
    assert cli.main(["inspect", str(artifact_path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "model_id:       tiny-test" in out and "payload offset: 4096" in out
    for name, _ in sample_items():
        assert name in out
    line = next(l for l in out.splitlines() if l.endswith(" quant/Q5G64_F16S"))
    assert line.split()[2:6] == ["528", "tensor", "Q5G64_F16S", "[2,200]"]  # bytes, kind, format, shape
    with Artifact.open(artifact_path) as art:
        total = sum(o.bytes for o in art.objects)
        q5 = art.tensor("quant/Q5G64_F16S").bytes
    totals = out.split("totals by format:")[1]
    assert f"Q5G64_F16S              1 objects {q5:>16} bytes" in totals
    assert f"FP32                    2 objects" in totals
    assert f"total                   9 objects {total:>16} bytes" in totals


def _dump(path, name, out) -> int:
    return cli.main(["inspect", str(path), "--dump", name, "--out", str(out)])


def test_dump_tensors_and_resource(artifact_path, tmp_path, capsys):
    with Artifact.open(artifact_path) as art:
        for name, _ in sample_items():
            out = tmp_path / (name.replace("/", "_") + ".npy")
            assert _dump(artifact_path, name, out) == 0
            obj = art.object(name)
            if obj.kind == "resource":
                assert out.read_bytes() == art.resource_bytes(name)
                continue
            arr = np.load(out)
            expected = art.load(name)
            assert arr.shape == tuple(obj.shape)
            if obj.format == "I32":
                assert arr.dtype == np.int32 and np.array_equal(arr, expected.numpy())
            else:
                assert arr.dtype == np.float32
                assert np.array_equal(arr, expected.to(torch.float32).numpy())
    assert capsys.readouterr().err == ""


def _single_error_line(capsys, needle: str) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err, err
    return err


def test_errors_exit_2_with_one_line(artifact_path, tmp_path, capsys):
    assert cli.main(["inspect", str(tmp_path / "nope.ninfer")]) == 2
    _single_error_line(capsys, "cannot open")
    root = valid_root()
    root["objects"][0]["bytes"] = 100
    bad = raw_artifact(tmp_path / "bad.ninfer", root)
    assert cli.main(["inspect", str(bad)]) == 2
    _single_error_line(capsys, "object 0 'w/q5': field 'bytes' is 100, expected 528")
    assert _dump(artifact_path, "nope", tmp_path / "x.npy") == 2
    _single_error_line(capsys, "no object named 'nope'")
    assert cli.main(["inspect", str(artifact_path), "--dump", "direct/bf16"]) == 2
    _single_error_line(capsys, "--dump NAME and --out FILE must be given together")
    assert _dump(artifact_path, "direct/bf16", tmp_path / "missing-dir" / "x.npy") == 2
    _single_error_line(capsys, "cannot write dump")


def test_inventory_listing_is_fast_and_torch_free(tmp_path):
    # 1124 objects like the 27B inventory; sparse so the payload costs no disk.
    specs = [TensorSpec(f"text/layers/{i // 16}/part/{i % 16}", (256, 5120), "Q4G64_F16S")
             for i in range(1124)]
    path = tmp_path / "inventory.ninfer"
    ArtifactWriter(path, "qwen3.6-27b", specs).write_sparse()
    code = (
        "import sys, time\n"
        "from ninfer_compile import cli\n"
        "cli.SUBCOMMANDS = {'inspect': cli.SUBCOMMANDS['inspect']}\n"
        "t = time.perf_counter()\n"
        f"rc = cli.main(['inspect', {str(path)!r}])\n"
        "sys.stderr.write(f'{rc} {time.perf_counter() - t:.3f} {\"torch\" in sys.modules}\\n')\n"
    )
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    wall = time.perf_counter() - start
    rc, seconds, torch_loaded = proc.stderr.split()
    assert rc == "0" and torch_loaded == "False"
    assert float(seconds) < 1.0 and wall < 10
    assert proc.stdout.count("Q4G64_F16S") == 1125  # 1124 rows + the totals line
    assert "total                1124 objects" in proc.stdout
