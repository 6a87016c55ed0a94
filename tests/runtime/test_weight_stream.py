"""The weight stream (weight_stream.py): the staging schedule, batches and device layout on odd
sizes (pure); the stream over a fake driver (fake_cuda_driver.py: copies run late, on their own
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
from ninfer_runtime.weight_stream import (Piece, StagingRing, WeightStream, WeightStreamError, batches, device_layout,
                                          pinned_upload_enabled, staging_schedule)

from .fake_cuda_driver import FakeDriver
from .support import RUNTIME

B, N, A = 64, 3, 8  # a ring of 3 buffers of 64 bytes, pieces 8-byte aligned


def _check_schedule(sizes, schedule, buffer_bytes=B, buffers=N, align=A):
    """Every object's bytes staged once, in order; pieces inside their buffer and aligned; the ring
    moves to the next buffer (at offset 0) or on in the current one, never back over staged bytes."""
    covered = {i: 0 for i in range(len(sizes))}
    prev = None
    for i, p in schedule:
        assert p.nbytes > 0 and p.src_offset == covered[i]
        covered[i] += p.nbytes
        assert 0 <= p.buffer < buffers and p.buffer_offset % align == 0
        assert p.buffer_offset + p.nbytes <= buffer_bytes
        if prev is None:
            assert (p.buffer, p.buffer_offset) == (0, 0)
        elif p.buffer == prev.buffer and p.buffer_offset > 0:
            assert p.buffer_offset >= prev.buffer_offset + prev.nbytes
        else:
            assert p.buffer == (prev.buffer + 1) % buffers and p.buffer_offset == 0
            assert prev.buffer_offset + prev.nbytes > buffer_bytes - align  # it moved on only when full
        prev = p
    assert [covered[i] for i in range(len(sizes))] == list(sizes)
    assert [i for i, _ in schedule] == sorted(i for i, _ in schedule)


def test_schedule_places_odd_sizes():
    sizes = [0, B, 3 * B + 5, *([1] * 20), B - 1, 7, 0, 13, 2 * B]
    schedule = staging_schedule(sizes, B, N, A)
    _check_schedule(sizes, schedule)
    by_object = {i: [p for j, p in schedule if j == i] for i in range(len(sizes))}
    assert by_object[0] == [] and by_object[25] == []  # 0-byte objects: nothing staged
    assert by_object[1] == [Piece(0, B, 0, 0)]  # exactly one buffer, from a fresh ring
    assert by_object[2] == [Piece(0, B, 1, 0), Piece(B, B, 2, 0), Piece(2 * B, B, 0, 0), Piece(3 * B, 5, 1, 0)]
    tiny = [p for i, p in schedule if 3 <= i < 23]  # they share buffers, each at the next aligned offset
    assert [p.buffer for p in tiny] == [1] * 7 + [2] * 8 + [0] * 5
    assert [p.buffer_offset for p in tiny] == [8 * k for k in range(1, 8)] + [8 * k for k in range(8)] + [
        8 * k for k in range(5)]

def test_schedule_splits_an_object_over_the_rest_of_a_buffer_and_the_next():
    ring = StagingRing(B, N, A)
    assert ring.place(10) == [Piece(0, 10, 0, 0)]
    assert ring.place(100) == [Piece(0, 48, 0, 16), Piece(48, 52, 1, 0)]
    assert ring.place(0) == []
    assert ring.place(4 * B) == [Piece(0, 8, 1, 56), Piece(8, B, 2, 0), Piece(8 + B, B, 0, 0),
                                 Piece(8 + 2 * B, B, 1, 0), Piece(8 + 3 * B, B - 8, 2, 0)]


def test_schedule_with_one_buffer_and_many_random_sizes():
    g = torch.Generator().manual_seed(0)
    sizes = torch.randint(0, 3 * B, (200,), generator=g).tolist()
    for buffers in (1, 2, 4):
        _check_schedule(sizes, staging_schedule(sizes, B, buffers, A), buffers=buffers)


@pytest.mark.parametrize("bad", [dict(buffer_bytes=60), dict(buffer_bytes=0), dict(buffers=0)])
def test_schedule_refuses_a_bad_ring(bad):
    with pytest.raises(ValueError, match="staging"):
        StagingRing(**{"buffer_bytes": B, "buffers": N, "align": A, **bad})


def test_schedule_refuses_a_negative_size():
    with pytest.raises(ValueError, match="-1 bytes"):
        StagingRing(B, N, A).place(-1)


def test_switch(monkeypatch):
    monkeypatch.delenv("NINFER_PINNED_UPLOAD", raising=False)
    assert pinned_upload_enabled() is True
    monkeypatch.setenv("NINFER_PINNED_UPLOAD", "0")
    assert pinned_upload_enabled() is False
    monkeypatch.setenv("NINFER_PINNED_UPLOAD", "yes")
    with pytest.raises(PlanError, match="NINFER_PINNED_UPLOAD must be 0 or 1, got 'yes'"):
        pinned_upload_enabled()



def test_batches_cut_where_a_buffer_is_entered_afresh():
    schedule = staging_schedule([10, 100, 0, 4 * B], B, N, A)
    got = batches(schedule)
    assert [[(i, p.buffer) for i, p in b] for b in got] == [[(0, 0), (1, 0)], [(1, 1), (3, 1)], [(3, 2)], [(3, 0)],
                                                             [(3, 1)], [(3, 2)]]
    assert [x for b in got for x in b] == schedule and batches([]) == []


def test_device_layout_aligns_every_object():
    offsets, total = device_layout([0, 1, 512, 513, 7, 0], align=512)
    assert offsets == [0, 0, 512, 1024, 2048, 2560] and total == 2560
    assert device_layout([]) == ([], 512)


def _file_with_objects(path: Path, sizes, seed: int = 0):
    """A file of random bytes; objects at odd offsets in it: [(name, offset, bytes)], the bytes."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (sum(sizes) + 7 * len(sizes) + 3,), dtype=torch.uint8, generator=g).numpy().tobytes()
    path.write_bytes(data)
    objects, at = [], 3
    for k, n in enumerate(sizes):
        objects.append((f"w{k}", at, n))
        at += n + 7
    return objects, data


SIZES = [0, 1, 511, 512, 513, 4096, 4097, 3 * 4096 + 17, 5, 9000, 1, 0, 20000]


@pytest.mark.parametrize("readers,buffers,buffer_bytes", [(1, 2, 512), (2, 3, 4096), (4, 5, 1024), (4, 8, 1 << 20)])
def test_stream_puts_every_byte_in_place(tmp_path, readers, buffers, buffer_bytes):
    objects, data = _file_with_objects(tmp_path / "a.bin", SIZES, seed=readers)
    drv = FakeDriver(seed=buffers)
    s = WeightStream(drv, tmp_path / "a.bin", objects, readers=readers, buffers=buffers, buffer_bytes=buffer_bytes)
    seen = []
    s.start().wait(progress=seen.append)
    assert s.done_bytes == sum(SIZES) and s.seconds > 0 and all(a <= b for a, b in zip(seen, seen[1:]))
    views = s.adopt(torch)
    assert list(views) == [n for n, _, _ in objects]
    for (name, off, n), dev_off in zip(objects, s.offsets):
        assert dev_off % 512 == 0 and views[name].numel() == n
        assert views[name].numpy().tobytes() == data[off:off + n], name
    assert len(drv.live) == 1 and not drv.streams and not drv.events  # the staging ring is gone; the views hold the rest


def test_stream_of_a_truncated_file_is_one_line_and_frees_everything(tmp_path):
    objects, data = _file_with_objects(tmp_path / "a.bin", SIZES)
    (tmp_path / "a.bin").write_bytes(data[:objects[9][1] + 100])  # w9 is cut short
    drv = FakeDriver()
    s = WeightStream(drv, tmp_path / "a.bin", objects, readers=2, buffers=3, buffer_bytes=4096).start()
    with pytest.raises(WeightStreamError, match=r"^weight upload from .*a\.bin: object w9: .*ends before its last byte$"):
        s.wait()
    assert not drv.live and not drv.streams


def test_stream_reports_a_failing_copy_and_close_stops_it(tmp_path):
    objects, _ = _file_with_objects(tmp_path / "a.bin", SIZES)
    drv = FakeDriver(fail_copy_at=3)
    s = WeightStream(drv, tmp_path / "a.bin", objects, readers=3, buffers=4, buffer_bytes=512).start()
    with pytest.raises(WeightStreamError, match="cuMemcpyHtoDAsync_v2: CUDA_ERROR_ILLEGAL_ADDRESS"):
        s.wait()
    assert not drv.live
    drv = FakeDriver()
    s = WeightStream(drv, tmp_path / "a.bin", objects, readers=2, buffers=3, buffer_bytes=512).start()
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
        return WeightStream(self.driver, artifact.path, objects, readers=3, buffers=4, buffer_bytes=4096).start()


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
@pytest.mark.parametrize("readers,buffers,buffer_bytes", [(1, 2, 4096), (4, 5, 4096), (4, 8, 32 << 20)])
def test_gpu_stream_matches_the_file(tmp_path, readers, buffers, buffer_bytes):
    sizes = SIZES + ([buffers * buffer_bytes + buffer_bytes // 2 + 3] if buffer_bytes > 4096 else [])
    objects, data = _file_with_objects(tmp_path / "a.bin", sizes)
    drv = cuda_driver.CudaDriver.open(torch.cuda.current_device())
    s = WeightStream(drv, tmp_path / "a.bin", objects, readers=readers, buffers=buffers, buffer_bytes=buffer_bytes)
    s.start().wait()
    views = s.adopt(torch)
    for name, off, n in objects:
        v = views[name]
        assert v.is_cuda and v.dtype == torch.uint8 and v.data_ptr() % 512 == 0
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
