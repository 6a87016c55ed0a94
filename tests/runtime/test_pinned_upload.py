"""The object-by-object pinned upload (pinned_upload.py): the staging schedule on odd sizes (pure),
the loader waiting for the queued copies (also when the load
fails), and on a GPU the uploaded bytes against the pageable copy's, byte for byte."""

from __future__ import annotations

import pytest
import torch

from ninfer_runtime.device import TorchDevice
from ninfer_runtime.errors import PlanMismatch
from ninfer_runtime.loader import Engine
from ninfer_runtime.pinned_upload import Piece, StagingRing, staging_schedule

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


class CountingCpu(TorchDevice):
    """The CPU path, counting uploads and finish_uploads calls; `fail_at`: the upload that raises."""

    def __init__(self, fail_at: int | None = None):
        super().__init__("cpu", interpreting=lambda: False)
        self.uploads, self.finished, self.fail_at = 0, 0, fail_at

    def upload(self, read, nbytes):
        self.uploads += 1
        if self.uploads == self.fail_at:
            raise PlanMismatch("upload: the device refused the copy")
        return super().upload(read, nbytes)

    def finish_uploads(self):
        assert self.uploads > 0
        self.finished += 1


def test_engine_finishes_the_uploads_once_and_reports_the_wait(tiny_plan):
    art, plan_dir = tiny_plan
    dev = CountingCpu()
    with Engine(plan_dir, art, device=dev, progress=False) as eng:
        assert dev.finished == 1 and dev.uploads == len(eng._objects) > 1
        assert eng.load_phases["upload_wait"] >= 0 and "upload" in eng.load_times


def test_engine_finishes_the_uploads_when_one_fails(tiny_plan):
    art, plan_dir = tiny_plan
    dev = CountingCpu(fail_at=2)
    with pytest.raises(PlanMismatch, match="refused the copy"):
        Engine(plan_dir, art, device=dev, progress=False)
    assert dev.finished == 1


def test_cpu_upload_keeps_the_host_tensor():
    dev = TorchDevice("cpu", interpreting=lambda: False)
    host = torch.arange(10, dtype=torch.uint8)
    assert dev.upload(lambda: host, 10) is host
    dev.finish_uploads()


def _odd_objects(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sizes = [0, 1, 511, 512, 513, 4096, 4097, 3 * 4096 + 17, *torch.randint(0, 9000, (40,), generator=g).tolist()]
    return [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in sizes]


@pytest.mark.gpu
@pytest.mark.parametrize("buffer_bytes,buffers", [(4096, 1), (4096, 3), (64 << 20, 3)])
def test_gpu_pinned_upload_matches_the_pageable_copy(buffer_bytes, buffers):
    from ninfer_runtime.pinned_upload import PinnedUploader

    dev = torch.device("cuda", torch.cuda.current_device())
    objects = _odd_objects(buffers)
    if buffer_bytes > 4096:  # larger than the whole ring: wraps around it
        objects.append(torch.randint(0, 256, (buffers * buffer_bytes + buffer_bytes // 2 + 3,), dtype=torch.uint8))
    up = PinnedUploader(dev, buffer_bytes, buffers)
    got = [up.upload(o, o.numel()) for o in objects]
    up.finish()
    for o, d in zip(objects, got):
        want = o.to(dev, non_blocking=False)
        assert d.device == dev and d.dtype == torch.uint8 and d.shape == (o.numel(),)
        assert torch.equal(d, want)


@pytest.mark.gpu
def test_gpu_torch_device_upload_paths_agree(monkeypatch, capsys):
    from ninfer_runtime import pinned_upload

    objects = _odd_objects(7)
    results = {}
    for mode in ("1", "0", "refused"):
        monkeypatch.setenv("NINFER_PINNED_UPLOAD", "0" if mode == "0" else "1")
        if mode == "refused":
            def refuse(*a, **k):
                raise pinned_upload.PinningFailed("out of locked memory")
            monkeypatch.setattr(pinned_upload, "PinnedUploader", refuse)
        dev = TorchDevice("cuda", interpreting=lambda: False)
        got = [dev.upload(lambda o=o: o, o.numel()) for o in objects]
        dev.finish_uploads()
        results[mode] = [d.cpu() for d in got]
    for mode, got in results.items():
        assert all(torch.equal(g, o) for g, o in zip(got, objects)), mode
    err = capsys.readouterr().err
    assert err.count("note: cannot pin the upload's staging buffers (out of locked memory)") == 1
