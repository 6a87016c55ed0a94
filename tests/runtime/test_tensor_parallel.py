"""The runtime's tensor-parallel pieces: a rank's weight copy made at upload equals the compiler's
shard of the decoded object (row ranges of every plane; a row-split column range on scale groups,
zero-padded to the 128-column layout), the rank view of a --tp plan, and the rank processes: one
that dies ends the others with one line naming it."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from ninfer_compile.artifact.codecs import decode_row_split, encode_row_split
from ninfer_compile.artifact.formats import row_split_geometry
from ninfer_compile.artifact.quantize import quantize_maxabs
from ninfer_runtime.errors import PlanError
from ninfer_runtime.tensor_parallel import RankFailed, launch_ranks, rank_view
from ninfer_runtime.weight_shards import shard_copy, shard_nbytes

DIRECT = {"BF16": torch.bfloat16, "FP32": torch.float32, "I32": torch.int32}


@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"])
@pytest.mark.parametrize("key", [(((8, 5), (20, 3)), None), (None, ((64, 64),)), (None, ((128, 128),)),
                                 (((1, 9),), ((64, 128),))])
def test_row_split_shard_is_the_decoded_slice(fmt, key):
    g = torch.Generator().manual_seed(3)
    n, k = 24, 320
    codes, scales = quantize_maxabs(fmt, torch.randn(n, k, generator=g))
    raw = torch.frombuffer(bytearray(encode_row_split(fmt, codes, scales)), dtype=torch.uint8)
    shape, nbytes = shard_nbytes(fmt, (n, k), key, DIRECT, row_split_geometry)
    got_shape, data = shard_copy("w", fmt, (n, k), raw, key, DIRECT, row_split_geometry)
    assert got_shape == shape and data.numel() == nbytes
    q = decode_row_split(fmt, shape, data.numpy().tobytes())
    rows, cols = key
    want = codes.float() * 0 + codes.float()
    ws = scales
    if rows is not None:
        want = torch.cat([want[b:b + c] for b, c in rows])
        ws = torch.cat([ws[b:b + c] for b, c in rows])
    G = row_split_geometry(fmt, n, k).group
    if cols is not None:
        (b, c), = cols
        want, ws = want[:, b:b + c], ws[:, b // G:(b + c) // G]
    assert torch.equal(q.codes.float(), want) and torch.equal(q.scales, ws)


def test_direct_shard_rows_and_columns():
    w = torch.arange(6 * 10, dtype=torch.float32).view(6, 10).bfloat16()
    raw = w.contiguous().view(-1).view(torch.uint8)
    shape, data = shard_copy("c", "BF16", (6, 10), raw, (None, ((0, 2), (5, 3))), DIRECT)
    assert shape == (6, 5) and torch.equal(data.view(torch.bfloat16).view(6, 5), torch.cat([w[:, 0:2], w[:, 5:8]], 1))


def test_misaligned_column_shard_and_ranges_are_refused():
    fmt = "Q4G64_F16S"
    codes, scales = quantize_maxabs(fmt, torch.randn(4, 256))
    raw = torch.frombuffer(bytearray(encode_row_split(fmt, codes, scales)), dtype=torch.uint8)
    with pytest.raises(PlanError, match="whole 64-column scale groups"):
        shard_copy("w", fmt, (4, 256), raw, (None, ((32, 64),)), DIRECT, row_split_geometry)
    with pytest.raises(PlanError, match="outside"):
        shard_copy("w", fmt, (4, 256), raw, (((2, 3),), None), DIRECT, row_split_geometry)


def test_rank_view():
    plan = {"format": "x", "options": {}, "tensor_parallel": {"degree": 2, "ranks": [
        {"rank": r, "extents": {"e": r}, "memory": {}, "buffers": {}} for r in range(2)]}}
    assert rank_view(plan, 1)["extents"] == {"e": 1} and "tensor_parallel" not in rank_view(plan, 1)
    with pytest.raises(PlanError, match="no section for rank 2"):
        rank_view(plan, 2)


def _rank_target(rank: int, world: int, init: str, mode: str) -> None:
    if mode == "die" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "ok":
        return
    time.sleep(60)  # the others would wait (a collective) until ended


def test_a_dead_rank_ends_the_others_with_one_line():
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as ei:
        launch_ranks(_rank_target, 3, ("die",), start_method="forkserver")
    msg = str(ei.value)
    assert "\n" not in msg and "rank 1" in msg and "SIGKILL" in msg and "ended the other 2" in msg
    assert time.monotonic() - t0 < 30  # not the sleeping ranks' 60 s
    launch_ranks(_rank_target, 2, ("ok",), start_method="forkserver")
