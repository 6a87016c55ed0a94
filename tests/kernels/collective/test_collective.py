"""The collective families: one rank is a copy; over 2 and 4 gloo ranks (processes on 127.0.0.1)
the launchers and the CPU path equal the references (sum / rank-ordered column blocks), and
all_argmax is torch.argmax of the whole row, ties across ranks and within one going to the lowest id."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.collective import launch, reference, torch_impl
from ninfer_compile.kernels.family import family_spec, launch_bindings


def test_one_rank_is_a_copy():
    x = torch.randn(3, 5).bfloat16()
    out = torch.empty_like(x)
    launch.all_reduce_nccl(x, out, None)
    assert torch.equal(out, x) and torch.equal(reference.all_reduce(x, 1), x.float())
    out = torch.empty_like(x)
    torch_impl.all_gather(x, out, None)
    assert torch.equal(out, x) and torch.equal(reference.all_gather(x, 1), x.float())


def _argmax_rows(world: int, n: int) -> torch.Tensor:
    """[5, world * n] bf16 rows (the same on every rank): 0 the maximum on every rank (a tie across
    all of them), 1 the last rank's alone, 2 a tie between ranks 1.. at their column 0, 3 a tie
    inside the last rank (columns 1 and 3), 4 random."""
    x = torch.randn(5, world * n, generator=torch.Generator().manual_seed(7)).clamp(-3, 3)
    x[0, [r * n + (r % n) for r in range(world)]] = 9.0
    x[1, (world - 1) * n + n - 1] = 9.0
    x[2, [r * n for r in range(1, world)]] = 9.0
    x[3, [(world - 1) * n + 1, (world - 1) * n + 3]] = 9.0
    return x.bfloat16()


def _argmax_ok(world: int, rank: int, group) -> bool:
    n = 6
    full = _argmax_rows(world, n)
    x = full[:, rank * n:(rank + 1) * n]
    want = torch.argmax(full.float(), dim=1).to(torch.int32)
    ids = torch.full((5,), -1, dtype=torch.int32)
    ws = torch.empty(launch.argmax_workspace_numel(5, world) + 3)
    torch_impl.all_argmax(x, ids, group, workspace=ws, vocab_begin=rank * n)
    ref = reference.all_argmax(x, world, vocab_begin=rank * n)
    ties = [want[i].item() for i in (0, 1, 3)] == [0, (world - 1) * n + n - 1, (world - 1) * n + 1]
    ties = ties and (world == 1 or want[2].item() == n)
    return ties and torch.equal(ids, want) and torch.equal(ref, want)


def test_all_argmax_on_one_rank_is_the_argmax():
    assert _argmax_ok(1, 0, None)
    with pytest.raises(RouteError, match="workspace"):
        launch.all_argmax_nccl(torch.zeros(2, 3).bfloat16(), torch.empty(2, dtype=torch.int32), None, torch.empty(3))


def test_group_is_bound_as_a_group_not_a_scalar():
    b = launch_bindings(family_spec("all_reduce"), {"x": {"buffer": "a"}, "out": {"buffer": "b"}},
                        {"ranks": 2}, {}, None)
    assert b == [{"arg": "x", "buffer": "a"}, {"arg": "out", "buffer": "b"}, {"arg": "group", "group": "tensor_parallel"}]


def _mp_context():
    """forkserver: a clean server process (not the test process, whose threads may hold locks a fork
    would copy) that imports torch and the compiler once; each rank is a fork of it."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "ninfer_compile.ir.execute"])
    return ctx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, q) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    try:
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(3, 4, generator=g).bfloat16()
        out = torch.empty_like(x)
        launch.all_reduce_nccl(x, out, dist.group.WORLD)
        want = reference.all_reduce(x, world)
        ok_reduce = torch.allclose(out.float(), want, atol=2e-2, rtol=1e-2)
        gathered = torch.empty(3, 4 * world, dtype=torch.bfloat16)
        ws = torch.empty((3 * 4 * world + 1) // 2)
        torch_impl.all_gather(x, gathered, dist.group.WORLD, workspace=ws)
        parts = [torch.randn(3, 4, generator=torch.Generator().manual_seed(r)).bfloat16() for r in range(world)]
        ok_gather = torch.equal(gathered, torch.cat(parts, 1)) and torch.equal(reference.all_gather(x, world),
                                                                              torch.cat(parts, 1).float())
        q.put((rank, ok_reduce, ok_gather and _argmax_ok(world, rank, dist.group.WORLD)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_ranks_match_the_reference(world):
    ctx = _mp_context()
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = []
        for _ in range(240):  # a rank that dies fails the test at once, not after the timeout
            while not q.empty() and len(got) < world:
                got.append(q.get())
            if len(got) == world or any(p.exitcode not in (None, 0) for p in procs):
                break
            procs[0].join(timeout=0.25)
        got.sort()
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert got == [(r, True, True) for r in range(world)]
