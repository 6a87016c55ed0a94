"""fp32 references of the collectives (spec.py). They run inside a torch.distributed job when one
is initialised (the IR executor of a rank), else as the one-rank case.

all_reduce(x [T, H]) -> [T, H]: the sum of x over the ranks (one rank: x).
all_gather(x [R, N/G]) -> [R, N]: the ranks' column blocks in rank order (one rank: x).
all_argmax(x [R, N/G], vocab_begin) -> ids [R] int32: the argmax of the whole rows, ties to the lowest
id (torch.argmax of the gathered row), from each rank's (max, first argmax + vocab_begin) per row.
"""

from __future__ import annotations

import torch


def _world(ranks: int) -> int:
    import torch.distributed as dist

    n = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if n != ranks:
        raise RuntimeError(f"collective over {ranks} ranks, this job has {n}")
    return n


def all_reduce(x: torch.Tensor, ranks: int = 1) -> torch.Tensor:
    out = x.float().clone()
    if _world(ranks) > 1:
        import torch.distributed as dist

        dist.all_reduce(out)
    return out


def all_gather(x: torch.Tensor, ranks: int = 1) -> torch.Tensor:
    if _world(ranks) == 1:
        return x.float().clone()
    import torch.distributed as dist

    parts = [torch.empty_like(x, dtype=torch.float32) for _ in range(ranks)]
    dist.all_gather(parts, x.float().contiguous())
    return torch.cat(parts, dim=1)


def all_argmax(x: torch.Tensor, ranks: int = 1, vocab_begin: int = 0) -> torch.Tensor:
    best, at = x.float().max(dim=1)
    pairs = torch.stack([best, (at + vocab_begin).float()], dim=1)
    parts = [pairs]
    if _world(ranks) > 1:
        import torch.distributed as dist

        parts = [torch.empty_like(pairs) for _ in range(ranks)]
        dist.all_gather(parts, pairs)
    values = torch.stack([p[:, 0] for p in parts])  # [G, R]
    top = values.max(dim=0).values
    ids = torch.stack([p[:, 1] for p in parts])
    # among the ranks holding the maximum, the lowest id (explicit: no reliance on max's tie order)
    return torch.where(values == top, ids, torch.inf).min(dim=0).values.to(torch.int32)
