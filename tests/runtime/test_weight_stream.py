"""The weight stream (weight_stream.py): its layout (runs, chunks, alignment) on odd objects (pure);
the NINFER_PINNED_UPLOAD switch; the stream over a fake driver (fake_cuda_driver.py: copies run late, on their own
threads) byte for byte, with 1-4 readers and small rings that wrap; its errors (one line, nothing
left allocated); prestart / take / discard; the engine loading from it; no torch imported by a
prestart; and on a GPU the real driver against the file, and a prestarted CLI run against a plain one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ninfer_runtime import cuda_driver, weight_stream
from ninfer_runtime.artifact_view import ArtifactView
from ninfer_runtime.device import TorchDevice
from ninfer_runtime.errors import PlanError
from ninfer_runtime.loader import Engine
from ninfer_runtime.weight_shards import weight_refs
from ninfer_runtime.weight_stream import WeightStream, WeightStreamError, pinned_upload_enabled, stream_layout

from .fake_cuda_driver import FakeDriver
from .support import RUNTIME

def _check_layout(objects, offsets, total, chunks, chunk_bytes):
    """Chunks in order, at most chunk_bytes, disjoint on the file and the device, each mapping file
    bytes to device bytes by one shift per run; every object's bytes covered, at its device offset,
    with its file alignment kept; nothing beyond the allocation."""
    prev = None
    for c in chunks:
        assert 0 < c.nbytes <= chunk_bytes and c.device_offset + c.nbytes <= total
        if prev is not None:
            assert c.file_offset >= prev.file_offset + prev.nbytes
            assert c.device_offset >= prev.device_offset + prev.nbytes
        assert (c.device_offset - c.file_offset) % 4096 == 0
        prev = c
    for name, off, nb in objects:
        if nb == 0:
            continue
        shift = offsets[name] - off
        assert shift % 4096 == 0
        covered = sum(min(c.file_offset + c.nbytes, off + nb) - max(c.file_offset, off) for c in chunks
                      if c.file_offset < off + nb and off < c.file_offset + c.nbytes
                      and c.device_offset - c.file_offset == shift)
        assert covered == nb, name


def test_layout_runs_chunks_and_alignment():
    objects = [("a", 4096, 100), ("b", 4096 + 256, 5000), ("gap_small", 4096 + 256 + 5000 + 1000, 10),
               ("far", 10 << 20, 3000), ("empty", 7, 0), ("alias", 4096, 100), ("before", 0, 256)]
    offsets, total, chunks = stream_layout(objects, chunk_bytes=4096, gap=1 << 20)
    _check_layout(objects, offsets, total, chunks, 4096)
    assert offsets["empty"] == 0 and offsets["alias"] == offsets["a"]
    assert offsets["b"] - offsets["a"] == 256  # one run: the file's own spacing
    # "far" starts a run of its own (10 MiB > the gap): the allocation skips the hole
    assert total < 64 << 10 and offsets["far"] % 4096 == (10 << 20) % 4096
    assert stream_layout([], 4096) == ({}, 4096, [])
    with pytest.raises(ValueError, match="chunks of 0 bytes"):
        stream_layout(objects, chunk_bytes=0)


def test_layout_of_many_random_objects():
    g = torch.Generator().manual_seed(0)
    objects, at = [], 0
    for k in range(300):
        at += int(torch.randint(0, 3, (), generator=g)) * int(torch.randint(0, 1 << 14, (), generator=g)) // 256 * 256
        nb = int(torch.randint(0, 20000, (), generator=g).item())
        objects.append((f"o{k}", at, nb))
        at += -(-nb // 256) * 256
    for chunk in (512, 4096, 1 << 20):
        for gap in (0, 8192):
            offsets, total, chunks = stream_layout(objects[::-1], chunk_bytes=chunk, gap=gap)
            _check_layout(objects, offsets, total, chunks, chunk)


def test_switch(monkeypatch):
    monkeypatch.delenv("NINFER_PINNED_UPLOAD", raising=False)
    assert pinned_upload_enabled() is True
    monkeypatch.setenv("NINFER_PINNED_UPLOAD", "0")
    assert pinned_upload_enabled() is False
    monkeypatch.setenv("NINFER_PINNED_UPLOAD", "yes")
    with pytest.raises(PlanError, match="NINFER_PINNED_UPLOAD must be 0 or 1, got 'yes'"):
        pinned_upload_enabled()


def _file_with_objects(path: Path, sizes, seed: int = 0):
    """A file of random bytes; objects at odd offsets in it: [(name, offset, bytes)], the bytes."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (2 * sum(sizes) + 8192 * len(sizes),), dtype=torch.uint8, generator=g).numpy().tobytes()
    objects, at = [], 256  # 256-aligned as in an artifact, with holes between some
    for k, n in enumerate(sizes):
        objects.append((f"w{k}", at, n))
        at += -(-n // 256) * 256 + (4096 if k % 3 == 0 else 0)
    data = data[:at] + bytes(max(0, at - len(data)))
    path.write_bytes(data)
    return objects, data


SIZES = [0, 1, 511, 512, 513, 4096, 4097, 3 * 4096 + 17, 5, 9000, 1, 0, 20000]


@pytest.mark.parametrize("readers,buffers,chunk_bytes", [(1, 2, 512), (2, 3, 4096), (4, 5, 1024), (8, 16, 1 << 20)])
def test_stream_puts_every_byte_in_place(tmp_path, readers, buffers, chunk_bytes):
    objects, data = _file_with_objects(tmp_path / "a.bin", SIZES, seed=readers)
    drv = FakeDriver(seed=buffers)
    s = WeightStream(drv, tmp_path / "a.bin", objects, readers=readers, buffers=buffers, chunk_bytes=chunk_bytes)
    seen = []
    switch = sys.getswitchinterval()
    s.start().wait(progress=seen.append)
    assert s.done_bytes == s.stream_bytes >= sum(SIZES) and s.seconds > 0 and all(a <= b for a, b in zip(seen, seen[1:]))
    assert sys.getswitchinterval() == switch  # restored
    views = s.adopt(torch)
    assert list(views) == [n for n, _, _ in objects]
    for name, off, n in objects:
        assert (n == 0 or (s.offsets[name] - off) % 4096 == 0) and views[name].numel() == n
        assert views[name].numpy().tobytes() == data[off:off + n], name
    assert len(drv.live) == 1 and not drv.streams and not drv.events  # the staging ring is gone; the views hold the rest


def test_stream_of_a_truncated_file_is_one_line_and_frees_everything(tmp_path):
    objects, data = _file_with_objects(tmp_path / "a.bin", SIZES)
    (tmp_path / "a.bin").write_bytes(data[:objects[9][1] + 100])  # w9 is cut short
    drv = FakeDriver()
    s = WeightStream(drv, tmp_path / "a.bin", objects, readers=2, buffers=3, chunk_bytes=4096).start()
    with pytest.raises(WeightStreamError, match=r"^weight upload from .*a\.bin: object w9: the file ends before its last byte$"):
        s.wait()
    assert not drv.live and not drv.streams


def test_stream_reports_a_failing_copy_and_close_stops_it(tmp_path):
    objects, _ = _file_with_objects(tmp_path / "a.bin", SIZES)
    drv = FakeDriver(fail_copy_at=3)
    s = WeightStream(drv, tmp_path / "a.bin", objects, readers=3, buffers=4, chunk_bytes=512).start()
    with pytest.raises(WeightStreamError, match="cuMemcpyHtoDAsync_v2: CUDA_ERROR_ILLEGAL_ADDRESS"):
        s.wait()
    assert not drv.live
    drv = FakeDriver()
    s = WeightStream(drv, tmp_path / "a.bin", objects, readers=2, buffers=3, chunk_bytes=512).start()
    s.close()
    assert not drv.live and not drv.streams and not any(t.is_alive() for t in s._threads)


def test_stream_refuses_too_few_buffers(tmp_path):
    with pytest.raises(ValueError, match="3 staging buffers for 3 readers"):
        WeightStream(FakeDriver(), tmp_path / "a.bin", [], readers=3, buffers=3)


def test_cuda_ordinal():
    assert [weight_stream.cuda_ordinal(d) for d in (None, "cuda", "cuda:2", "cpu", "cuda:x", "meta")] == [
        0, 0, 2, None, None, None]


def _names_and_bytes(art, plan_dir):
    from ninfer_runtime.plan_source import read_plan

    names, _ = weight_refs(read_plan(Path(plan_dir))[0])
    with ArtifactView.open(art) as view:
        return names, {n: bytes(view.span(n)) for n in names}


def test_prestart_then_take(tiny_plan, monkeypatch):
    art, plan_dir = tiny_plan
    names, want = _names_and_bytes(art, plan_dir)
    drivers = []
    monkeypatch.setattr(cuda_driver, "present", lambda: True)
    monkeypatch.setattr(cuda_driver.CudaDriver, "open", lambda ordinal: drivers.append(FakeDriver()) or drivers[-1])
    assert weight_stream.prestart(plan_dir, art, "cuda:1") is True
    assert weight_stream.take(art, names, 0) is None  # another device: not this one's
    s = weight_stream.take(art, names, 1)
    s.wait()
    views = s.adopt(torch)
    assert {n: views[n].numpy().tobytes() for n in names} == want
    assert weight_stream.take(art, names, 1) is None  # taken once
    # another object list: the prestarted stream is closed, the loader starts its own
    assert weight_stream.prestart(plan_dir, art) is True
    assert weight_stream.take(art, names[:-1], 0) is None and not drivers[-1].live
    # a load failing before its upload: discard frees the prestarted stream
    assert weight_stream.prestart(plan_dir, art) is True
    weight_stream.discard(art)
    assert not drivers[-1].live and weight_stream.take(art, names, 0) is None


def test_prestart_starts_nothing_without_a_gpu_or_when_switched_off(tiny_plan, monkeypatch):
    art, plan_dir = tiny_plan
    names, _ = _names_and_bytes(art, plan_dir)

    def unavailable(ordinal):
        raise cuda_driver.DriverUnavailable("no CUDA driver")

    monkeypatch.setattr(cuda_driver, "present", lambda: False)  # no libcuda: not even the plan is read
    monkeypatch.setattr(cuda_driver.CudaDriver, "open", lambda ordinal: FakeDriver())
    assert weight_stream.prestart(plan_dir, art) is True and weight_stream.take(art, names, 0) is None
    monkeypatch.setattr(cuda_driver, "present", lambda: True)
    monkeypatch.setattr(cuda_driver.CudaDriver, "open", unavailable)
    assert weight_stream.prestart(plan_dir, art) is True and weight_stream.take(art, names, 0) is None
    monkeypatch.setattr(cuda_driver.CudaDriver, "open", lambda ordinal: FakeDriver(sm=80))  # another sm
    assert weight_stream.prestart(plan_dir, art) is True and weight_stream.take(art, names, 0) is None
    assert weight_stream.prestart(plan_dir, art, "cpu") is False
    monkeypatch.setenv("NINFER_PINNED_UPLOAD", "0")
    assert weight_stream.prestart(plan_dir, art) is False
    monkeypatch.setenv("NINFER_PINNED_UPLOAD", "maybe")  # the loader refuses it, in one line
    assert weight_stream.prestart(plan_dir, art) is False


class StreamingCpu(TorchDevice):
    """The CPU path with its weights carried by a weight stream over the fake driver."""

    def __init__(self):
        super().__init__("cpu", interpreting=lambda: False)
        self.driver = FakeDriver()

    def stream_weights(self, artifact, names):
        objects = [(n, artifact.payload_offset + artifact.objects[n].offset, artifact.objects[n].bytes) for n in names]
        return WeightStream(self.driver, artifact.path, objects, readers=3, buffers=4, chunk_bytes=4096).start()


def test_engine_loads_from_the_stream_and_generates_the_same_tokens(tiny_plan):
    art, plan_dir = tiny_plan
    with Engine(plan_dir, art, device="cpu", progress=False) as eng:
        want = eng.generate([5, 77, 301], 6, ignore_eos=True).tokens
    dev = StreamingCpu()
    with Engine(plan_dir, art, device=dev, progress=False) as eng:
        assert eng.generate([5, 77, 301], 6, ignore_eos=True).tokens == want
        assert eng.load_phases["upload (bg)"] > 0 and dev.driver.live


def test_prestart_imports_no_torch(tiny_plan):
    """`import ninfer_runtime` and a prestart (its thread run to the stream's start) import no torch."""
    art, plan_dir = tiny_plan
    code = f"""import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from fake_cuda_driver import FakeDriver
import ninfer_runtime
from ninfer_runtime import cuda_driver, weight_stream
cuda_driver.present = lambda: True
cuda_driver.CudaDriver.open = staticmethod(lambda ordinal: FakeDriver())
assert ninfer_runtime.prestart({str(plan_dir)!r}, {str(art)!r})
job = next(iter(weight_stream._PRESTARTED.values()))
job.ready.wait()
assert job.stream is not None, "no stream started"
job.stream.wait()
print("torch" in sys.modules)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(RUNTIME)})
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("readers,buffers,chunk_bytes", [(1, 2, 4096), (4, 5, 4096), (8, 16, 8 << 20)])
def test_gpu_stream_matches_the_file(tmp_path, readers, buffers, chunk_bytes):
    sizes = SIZES + ([buffers * chunk_bytes + chunk_bytes // 2 + 3] if chunk_bytes > 4096 else [])
    objects, data = _file_with_objects(tmp_path / "a.bin", sizes)
    drv = cuda_driver.CudaDriver.open(torch.cuda.current_device())
    s = WeightStream(drv, tmp_path / "a.bin", objects, readers=readers, buffers=buffers, chunk_bytes=chunk_bytes)
    s.start().wait()
    views = s.adopt(torch)
    for name, off, n in objects:
        v = views[name]
        assert v.is_cuda and v.dtype == torch.uint8 and (n == 0 or (v.data_ptr() - off) % 4096 == 0)
        assert v.cpu().numpy().tobytes() == data[off:off + n], name


@pytest.mark.gpu
def test_gpu_prestarted_cli_run_matches_a_pageable_one(tiny_plan):
    art, plan_dir = tiny_plan
    runs = {}
    for mode in ("1", "0"):  # the weight stream, prestarted by the CLI / the pageable copy
        p = subprocess.run([sys.executable, "-m", "ninfer_runtime.cli", str(plan_dir), "--artifact", str(art),
                            "--tokens", "5,77,301", "--max-new-tokens", "6", "--ignore-eos"], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(RUNTIME),
                                                        "NINFER_PINNED_UPLOAD": mode})
        assert p.returncode == 0, p.stderr[-2000:]
        assert ("upload (bg)" in p.stderr) == (mode == "1"), p.stderr[-2000:]
        runs[mode] = p.stdout.strip().splitlines()[-1]
    assert runs["1"] == runs["0"] and runs["1"].startswith("tokens: ")
