"""Tensor parallelism in the runtime: a `--tp N` plan (ninfer_compile/plan/tensor_parallel.py) runs as
N processes, one per rank, each loading its own section of the plan.

- `rank_view(plan, r)`: the one-GPU-shaped plan of rank r (`tensor_parallel.ranks[r]`'s extents,
  memory and buffers); a plan without sections is its own view.
- `TensorParallel(rank, world, groups)`: the context the runtime gives the engine: the process group
  the plan's collectives name (`group` bindings, kernels/collective/), created by `init_ranks` over
  torch.distributed (NCCL on the GPU, gloo on the CPU; a timeout on every collective, so a rank
  that died never leaves the others stuck). `from_env()` reads torchrun's RANK / WORLD_SIZE /
  MASTER_ADDR / MASTER_PORT.
- `shard_copy(entry, raw, shard, geometry)`: a rank's copy of an object, made at upload from the
  artifact's bytes: the row ranges of every plane (direct formats: rows, then columns); a
  row-split format's column range on whole scale groups is each plane row's byte range of those
  groups, zero groups padding K to 128 (the layout's `row-split-k128-v1` alignment).
- `launch_ranks(target, world, args)`: starts the N rank processes (rendezvous on 127.0.0.1), waits
  for them, and ends them all when one dies (`RankFailed`, one line naming the rank) or on
  SIGINT / SIGTERM (each child ended, none left behind).
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .errors import NinferRuntimeError, PlanError

RANK_MEMBERS = ("extents", "memory", "buffers")
_PARENT = [int(os.environ.get("NINFER_TP_PARENT", "0") or 0)]
GROUP = "tensor_parallel"
COLLECTIVE_TIMEOUT_S = float(os.environ.get("NINFER_TP_TIMEOUT_S", "60"))


class RankFailed(NinferRuntimeError):
    """A rank process died or failed; the message is one line naming it."""


def degree(plan: dict) -> int:
    return int((plan.get("tensor_parallel") or {}).get("degree", 1))


def rank_view(plan: dict[str, Any], rank: int) -> dict[str, Any]:
    tp = plan.get("tensor_parallel")
    if not tp:
        return plan
    ranks = tp.get("ranks")
    if not isinstance(ranks, list) or not 0 <= rank < len(ranks) or not isinstance(ranks[rank], dict):
        raise PlanError(f"plan.json: tensor_parallel.ranks has no section for rank {rank}")
    out = {k: v for k, v in plan.items() if k != "tensor_parallel"}
    for k in RANK_MEMBERS:
        if k not in ranks[rank]:
            raise PlanError(f"plan.json: tensor_parallel.ranks[{rank}] has no {k}")
        out[k] = ranks[rank][k]
    return out


_CURRENT: list = []  # the context this rank process set up (init_ranks); read by loader.load


@dataclass
class TensorParallel:
    rank: int
    world: int
    groups: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def current() -> TensorParallel | None:
        return _CURRENT[0] if _CURRENT else None

    def group(self, name: str):
        if self.world == 1:
            return None
        g = self.groups.get(name)
        if g is None:
            raise PlanError(f"the plan's collectives name process group {name!r}; this runtime created "
                            f"{sorted(self.groups) or 'none'}")
        return g

    @classmethod
    def from_env(cls) -> TensorParallel | None:
        """torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or None."""
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            return None
        return init_ranks(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://")


def init_ranks(rank: int, world: int, init_method: str, backend: str | None = None,
               timeout_s: float = COLLECTIVE_TIMEOUT_S) -> TensorParallel:
    import torch.distributed as dist

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % max(1, torch.cuda.device_count()))
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    ctx = TensorParallel(rank, world, {GROUP: dist.group.WORLD})
    _CURRENT[:] = [ctx]
    return ctx


def shutdown() -> None:
    import torch.distributed as dist

    _CURRENT.clear()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- lockstep steps

RUN, RESET_SLOT, SAVE_SLOT, RESTORE_SLOT, STOP = 1, 2, 3, 4, 0


class Lockstep:
    """Rank 0's side: before each extent run (or graph replay) and each slot reset, tell the other
    ranks which one and broadcast the extent's inputs (ids, positions, slots, sampling rows, the
    MTP hidden rows...), so every rank runs the same step on the same inputs; the collectives inside
    the extent then pair up. Rank 0 alone owns the tokenizer, the request loop and the host reads."""

    def __init__(self, engine):
        self.engine = engine
        self.index = {name: i for i, name in enumerate(sorted(engine.extents))}
        self.device = engine.device

    def _send(self, words: list[int]) -> None:
        import torch.distributed as dist

        dist.broadcast(torch.tensor(words, dtype=torch.int64, device=self.device), src=0)

    def run(self, runner, n: int | None, graph: bool = False) -> None:
        import torch.distributed as dist

        self._send([RUN, self.index[runner.name], -1 if n is None else int(n), int(graph)])
        for name in sorted(runner.inputs):
            dist.broadcast(runner.inputs[name], src=0)

    def reset_slot(self, slot: int) -> None:
        self._send([RESET_SLOT, int(slot), 0, 0])

    def save_slot(self, slot: int, rows: int) -> None:  # steps.padding_slots borrowed a busy slot
        self._send([SAVE_SLOT, int(slot), int(rows), 0])

    def restore_slot(self, slot: int) -> None:
        self._send([RESTORE_SLOT, int(slot), 0, 0])

    def stop(self) -> None:
        self._send([STOP, 0, 0, 0])


def follow(engine) -> None:
    """A rank > 0: run the steps rank 0 announces until it says stop."""
    import torch.distributed as dist

    from .graphs import replay_or_run

    from .steps import restore_slot_rows, save_slot_rows, state_layout

    names = sorted(engine.extents)
    words = torch.zeros(4, dtype=torch.int64, device=engine.device)
    saved: dict[int, tuple[int, list]] = {}
    while True:
        dist.broadcast(words, src=0)
        cmd, a, b, c = (int(v) for v in words.tolist())
        if cmd == STOP:
            return
        if cmd == RESET_SLOT:
            engine.reset_slot(a)
            continue
        if cmd == SAVE_SLOT:
            saved[a] = (b, save_slot_rows(state_layout(engine), a, b))
            continue
        if cmd == RESTORE_SLOT:
            rows, kept = saved.pop(a)
            restore_slot_rows(state_layout(engine), a, rows, kept)
            continue
        runner = engine.extents[names[a]]
        for name in sorted(runner.inputs):
            dist.broadcast(runner.inputs[name], src=0)
        if c:
            replay_or_run(engine, runner, True)
        else:
            runner.run(None if b < 0 else b)


# ----------------------------------------------------------------------------- weight shards


def weight_refs(plan: dict) -> tuple[list[str], set[tuple]]:
    """(objects referenced whole, {(object, shard key)} a --tp rank copies), over the plan's launches."""
    whole, shards = set(), set()
    for x in plan["extents"].values():
        for L in x["launches"]:
            for ref in list((L.get("args") or {}).values()) + list((L.get("outs") or {}).values()):
                if "weight" in ref:
                    k = shard_key(ref)
                    (whole.add(ref["weight"]) if k is None else shards.add((ref["weight"], k)))
    return sorted(whole), shards


def shard_nbytes(fmt: str, shape: tuple[int, ...], key: tuple, direct: dict, geometry) -> tuple[tuple, int]:
    """(shape, bytes) of a rank's copy, without reading the payload."""
    new = shard_shape(shape, key)
    if fmt in direct:
        n = direct[fmt].itemsize
        for d in new:
            n *= d
        return new, n
    return new, int(geometry(fmt, new[0], new[1]).total)


def upload_shards(engine, direct: dict, grouped) -> dict[tuple, Any]:
    """A --tp rank's copies of objects (`engine._shard_refs`: rows / columns of its shard), made from
    the artifact's mmap at upload through the engine's backend; adds their bytes to weight_bytes."""
    import sys
    from types import SimpleNamespace

    from .errors import PlanMismatch

    out: dict[tuple, Any] = {}
    geometry = None
    for name, key in sorted(engine._shard_refs, key=repr):
        e = engine.artifact.objects.get(name)
        if e is None or e.kind != "tensor":
            raise PlanMismatch(f"plan references object {name!r}, absent from artifact {engine.artifact.path.name}")
        if e.format in grouped and geometry is None:
            geometry = sys.modules[engine.quant_weight_cls().__module__].row_split_geometry
        shape, nbytes = shard_nbytes(e.format, tuple(e.shape), key, direct, geometry)
        dev = engine.backend.upload(lambda e=e, key=key: shard_copy(
            e.name, e.format, tuple(e.shape), torch.frombuffer(engine.artifact.span(e.name), dtype=torch.uint8),
            key, direct, geometry)[1], nbytes)
        out[(name, key)] = engine._bind_object(SimpleNamespace(name=name, format=e.format, shape=shape, bytes=nbytes), dev)
        engine.weight_bytes += nbytes
    return out


def shard_key(ref: dict) -> tuple | None:
    s = ref.get("shard")
    if not s:
        return None
    return (tuple(tuple(r) for r in s.get("rows") or ()) or None, tuple(tuple(c) for c in s.get("cols") or ()) or None)


def shard_shape(shape: tuple[int, ...], key: tuple) -> tuple[int, ...]:
    rows, cols = key
    n = shape[0] if rows is None else sum(c for _, c in rows)
    rest = tuple(shape[1:])
    if cols is not None:
        rest = (sum(c for _, c in cols), *rest[1:])
    return (n, *rest)


def _check_ranges(name: str, what: str, ranges, n: int) -> None:
    for b, c in ranges or ():
        if b < 0 or c < 1 or b + c > n:
            raise PlanError(f"weight {name}: shard {what} [{b},{b + c}) outside its {n} {what}")


def shard_copy(name: str, fmt: str, shape: tuple[int, ...], raw: torch.Tensor, key: tuple, direct: dict,
               geometry: Callable | None = None) -> tuple[tuple[int, ...], torch.Tensor]:
    """(shape, uint8 bytes) of a rank's copy of one object. `raw`: the object's payload (uint8);
    `direct`: format -> torch dtype of the direct formats; `geometry(format, n, k)`: the row-split
    plane geometry (grouped formats)."""
    rows, cols = key
    _check_ranges(name, "rows", rows, shape[0])
    _check_ranges(name, "columns", cols, shape[1] if len(shape) > 1 else 0)
    if fmt in direct:
        t = raw.view(direct[fmt]).view(list(shape))
        if rows is not None:
            t = torch.cat([t[b:b + c] for b, c in rows], 0)
        if cols is not None:
            t = torch.cat([t[:, b:b + c] for b, c in cols], 1)
        return tuple(t.shape), t.contiguous().view(-1).view(torch.uint8)
    if geometry is None or len(shape) != 2:
        raise PlanError(f"weight {name}: cannot shard {fmt} {list(shape)}")
    g = geometry(fmt, int(shape[0]), int(shape[1]))
    planes = [("base", g.base_offset, g.base_row_bytes), ("high", g.high_offset, g.high_row_bytes),
              ("scale", g.scale_offset, g.scale_row_bytes)]
    new_shape = shard_shape(tuple(shape), key)
    ng = geometry(fmt, new_shape[0], new_shape[1])
    out = torch.zeros(ng.total, dtype=torch.uint8)
    if cols is not None:
        if len(cols) != 1 or cols[0][0] % g.group or cols[0][1] % g.group:
            raise PlanError(f"weight {name}: {fmt} column shard {list(cols)} is not one range of whole {g.group}-column "
                            f"scale groups")
        g0, gc = cols[0][0] // g.group, cols[0][1] // g.group
    for (plane, off, row_bytes), new_off in zip(planes, (ng.base_offset, ng.high_offset, ng.scale_offset)):
        if row_bytes == 0:
            continue
        m = raw[off:off + g.n * row_bytes].view(g.n, row_bytes)
        if rows is not None:
            m = torch.cat([m[b:b + c] for b, c in rows], 0)
        new_row = row_bytes * ng.groups_per_row // g.groups_per_row
        if cols is not None:
            per = row_bytes // g.groups_per_row  # bytes of one scale group in this plane's row
            dst = out[new_off:new_off + new_shape[0] * new_row].view(new_shape[0], new_row)
            dst[:, :gc * per] = m[:, g0 * per:(g0 + gc) * per]  # the groups past K' stay zero (padding)
        else:
            out[new_off:new_off + new_shape[0] * new_row] = m.reshape(-1)
    return new_shape, out


# ----------------------------------------------------------------------------- rank processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_text(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def launch_ranks(target: Callable, world: int, args: tuple = (), *, poll_s: float = 0.1,
                 start_method: str = "spawn") -> None:
    """Run `target(rank, world, init_method, *args)` in `world` processes and wait for all of them.
    A rank that exits non-zero (or is killed) ends the others (SIGTERM, then SIGKILL after 5 s) and
    raises RankFailed naming it; SIGINT / SIGTERM of this process end every rank the same way (rank 0
    first, silently) and are then delivered again to this process's own handlers (the CLI's one
    line and exit status)."""
    import multiprocessing as mp

    ctx = mp.get_context(start_method)
    init = f"tcp://127.0.0.1:{free_port()}"
    os.environ["NINFER_TP_PARENT"] = str(os.getpid())  # the ranks die with this process (die_with_parent)
    procs = [ctx.Process(target=target, args=(r, world, init, *args), name=f"ninfer-rank{r}", daemon=False)
             for r in range(world)]
    got_signal: list[int] = []

    def on_signal(sig, _frame):
        got_signal.append(sig)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for p in procs:
            p.start()
        while True:
            if got_signal:
                break
            dead = [(r, p) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                r, p = dead[0]
                raise RankFailed(f"tensor parallel: rank {r} (pid {p.pid}) {_exit_text(p.exitcode)}; ended the other "
                                 f"{world - 1} rank(s)")
            if all(p.exitcode == 0 for p in procs):
                return
            time.sleep(poll_s)
    finally:
        _end_all(procs)
        for s, h in old.items():
            signal.signal(s, h)
        if got_signal:
            os.kill(os.getpid(), got_signal[0])  # now to the caller's handler (the CLI's one line)
            time.sleep(1.0)  # (delivered at once; a caller without a handler never gets here)


def _end_all(procs, grace_s: float = 5.0) -> None:
    alive = [p for p in procs if p.pid is not None and p.exitcode is None]
    if alive and alive[0] is procs[0]:  # rank 0 first: it must not report the others' exits as errors
        alive[0].terminate()
        alive[0].join(1.0)
    for p in alive:
        if p.exitcode is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.exitcode is None:
            p.kill()
            p.join(2.0)


# ----------------------------------------------------------------------------- ninfer-run over N ranks


def plan_degree(plan_dir) -> int:
    import json
    from pathlib import Path

    try:
        return degree(json.loads((Path(plan_dir) / "plan.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, AttributeError):
        return 1  # the loader reports an unreadable plan in its own words


def run_cli_ranks(args) -> int | None:
    """ninfer-run with a --tp N plan: None when this process runs the plan itself (a one-GPU plan, a
    rank process, or a rank under torchrun), else start N rank processes and return the exit status."""
    n = plan_degree(args.plan)
    if n <= 1 or TensorParallel.current() is not None:
        return None
    if TensorParallel.from_env() is not None:  # torchrun: this process is a rank
        return None if TensorParallel.current().rank == 0 else _follow_cli(args)
    launch_ranks(_cli_rank, n, (args.argv,))
    return 0


def die_with_parent(parent: int) -> None:
    """A rank process is SIGKILLed when the process that started it dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), so no rank outlives ninfer-run / ninfer-serve (a server rank would keep its port)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the request was armed
        os._exit(143)


def _run_rank(rank: int, world: int, init: str, body) -> None:
    """The frame of every rank process: die with the parent, SIGTERM from it is silent, the process
    group set up, `body()` run, any error one line naming the rank, the exit status its return."""
    import sys

    die_with_parent(_PARENT[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends the ranks (SIGTERM) on Ctrl-C
    signal.signal(signal.SIGTERM, lambda *a: os._exit(143))
    rc = 2
    try:
        init_ranks(rank, world, init)
        rc = body()
    except Exception as exc:  # noqa: BLE001 - one line per rank, never a traceback
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: rank {rank}: {text}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def _cli_rank(rank: int, world: int, init: str, argv: list[str]) -> None:
    """A rank process of ninfer-run: rank 0 is the CLI (tokenizer, requests, output); the others follow."""
    def body() -> int:
        if rank == 0:
            from .cli import _main  # the CLI without its signal handlers: SIGTERM from the parent is silent

            return _main(argv)
        from .cli import _parser

        return _follow_cli(_parser().parse_args(argv))

    _run_rank(rank, world, init, body)


def _follow_cli(args) -> int:
    from .loader import load

    engine = load(args.plan, args.artifact, device=args.device, progress=False)
    try:
        follow(engine)
    finally:
        engine.close()
    return 0


def serve_ranks(args, argv: list[str]) -> int | None:
    """ninfer-serve with a --tp N plan: start N rank processes (rank 0 serves; the others follow) and
    return the exit status; None when this process serves (a one-GPU plan, or rank 0 itself, whose
    prefix cache is off: the other ranks would have to mirror its state snapshots, not done yet)."""
    import sys

    n = plan_degree(args.plan)
    if n <= 1:
        return None
    if TensorParallel.current() is not None or TensorParallel.from_env() is not None:
        if TensorParallel.current().rank != 0:
            return _follow_cli(args)
        if args.prefix_cache_gib or args.prefix_cache_host_gib:
            print(f"note: prefix cache off with a --tp {n} plan (the ranks do not mirror state snapshots yet)",
                  file=sys.stderr)
        args.prefix_cache_gib = args.prefix_cache_host_gib = 0
        return None
    launch_ranks(_serve_rank, n, (argv,))
    return 0


def _serve_rank(rank: int, world: int, init: str, argv: list[str]) -> None:
    def body() -> int:
        from .serve.cli import main

        return main(argv)

    _run_rank(rank, world, init, body)
