"""fp32 references of the collectives (spec.py). They run inside a torch.distributed job when one
is initialised (the IR executor of a rank), else as the one-rank case.

all_reduce(x [T, H]) -> [T, H]: the sum of x over the ranks (one rank: x).
all_gather(x [R, N/G]) -> [R, N]: the ranks' column blocks in rank order (one rank: x).
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
