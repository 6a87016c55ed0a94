"""The object-by-object pinned upload (pinned_upload.py): the loader waiting for the queued copies
(also when the load fails), and on a GPU the uploaded bytes against the pageable copy's, byte for
byte. (The staging schedule and the switch: test_weight_stream.py.)"""

from __future__ import annotations

import pytest
import torch

from ninfer_runtime.device import TorchDevice
from ninfer_runtime.errors import PlanMismatch
from ninfer_runtime.loader import Engine

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
