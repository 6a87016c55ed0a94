"""Tensor parallelism in the runtime: a `--tp N` plan (ninfer_compile/plan/tensor_parallel.py) runs as
N processes, one per rank, each loading its own section of the plan.

- `rank_view(plan, r)`: the one-GPU-shaped plan of rank r (`tensor_parallel.ranks[r]`'s extents,
  memory and buffers); a plan without sections is its own view.
- `TensorParallel(rank, world, groups)`: the context the runtime gives the engine: the process group
  the plan's collectives name (`group` bindings, kernels/collective/), created by `init_ranks` over
  torch.distributed (NCCL on the GPU, gloo on the CPU; a timeout on every collective, so a rank
  that died never leaves the others stuck). `from_env()` reads torchrun's RANK / WORLD_SIZE /
  MASTER_ADDR / MASTER_PORT.
- the rank's weight shards: weight_shards.py.
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
PEER_GRACE_S = 3.0  # a failed rank's wait for the launcher's verdict (await_launcher)
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
SNAPSHOT, RESTORE_SNAPSHOT, SPILL_SNAPSHOT, DROP_SNAPSHOT = 5, 6, 7, 8


class Lockstep:
    """Rank 0's side: before each extent run (or graph replay) and each slot reset, tell the other
    ranks which one and broadcast the extent's inputs (ids, positions, slots, sampling rows, the
    MTP hidden rows...), so every rank runs the same step on the same inputs; the collectives inside
    the extent then pair up. Rank 0 alone owns the tokenizer, the request loop, the host reads and
    the prefix cache: a snapshot it takes (steps.snapshot) has every other rank take its own
    shards' snapshot under one id, which rank 0's restore / spill / drop then name."""

    def __init__(self, engine):
        self.engine = engine
        self.index = {name: i for i, name in enumerate(sorted(engine.extents))}
        self.device = engine.device
        self.snapshots = 0  # ids handed out

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

    def snapshot(self, slot: int, length: int) -> int:
        self.snapshots += 1
        self._send([SNAPSHOT, int(slot), int(length), self.snapshots])
        return self.snapshots

    def restore(self, slot: int, mirror: int) -> None:
        self._send([RESTORE_SNAPSHOT, int(slot), int(mirror), 0])

    def spill(self, mirror: int) -> None:
        self._send([SPILL_SNAPSHOT, int(mirror), 0, 0])

    def drop(self, mirror: int) -> None:
        self._send([DROP_SNAPSHOT, int(mirror), 0, 0])

    def stop(self) -> None:
        self._send([STOP, 0, 0, 0])


def follow(engine) -> None:
    """A rank > 0: run the steps rank 0 announces until it says stop."""
    import torch.distributed as dist

    from .graphs import replay_or_run

    from .steps import restore_slot_rows, save_slot_rows, snapshot, state_layout, write_slot

    names = sorted(engine.extents)
    words = torch.zeros(4, dtype=torch.int64, device=engine.device)
    saved: dict[int, tuple[int, list]] = {}
    snaps: dict[int, Any] = {}  # rank 0's snapshot id -> this rank's part of it
    while True:
        dist.broadcast(words, src=0)
        cmd, a, b, c = (int(v) for v in words.tolist())
        if cmd == STOP:
            return
        if cmd in (SNAPSHOT, RESTORE_SNAPSHOT, SPILL_SNAPSHOT, DROP_SNAPSHOT):
            if cmd == SNAPSHOT:
                snaps[c] = snapshot(engine, a, b, None)
            elif cmd == RESTORE_SNAPSHOT:
                write_slot(engine, a, snaps[b])  # (the reset came before, as RESET_SLOT)
            elif cmd == SPILL_SNAPSHOT:
                snaps[a] = snaps[a].to("cpu")
            else:
                del snaps[a]
            continue
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
            if dead:  # a rank killed by a signal first: the others' errors follow from its death
                r, p = min(dead, key=lambda d: (d[1].exitcode >= 0, d[0]))
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


def await_launcher() -> None:
    """A rank process (started by launch_ranks) whose run failed waits a moment before it says so:
    when the failure is a peer's death (a collective broke), the launcher ends this rank meanwhile,
    silently, and its one line names the rank that died, not this one. (Under torchrun: no wait.)"""
    ctx = TensorParallel.current()
    if ctx is not None and ctx.world > 1 and _PARENT[0]:
        time.sleep(PEER_GRACE_S)


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
        await_launcher()
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
    """ninfer-serve with a --tp N plan: start N rank processes (rank 0 serves, with the prefix cache:
    the other ranks mirror its snapshots, `Lockstep`; the others follow) and return the exit status;
    None when this process serves (a one-GPU plan, or rank 0 itself)."""
    n = plan_degree(args.plan)
    if n <= 1:
        return None
    if TensorParallel.current() is not None or TensorParallel.from_env() is not None:
        return _follow_cli(args) if TensorParallel.current().rank != 0 else None
    launch_ranks(_serve_rank, n, (argv,))
    return 0


def _serve_rank(rank: int, world: int, init: str, argv: list[str]) -> None:
    def body() -> int:
        from .serve.cli import main

        return main(argv)

    _run_rank(rank, world, init, body)
