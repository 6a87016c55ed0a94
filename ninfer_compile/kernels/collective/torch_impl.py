"""CPU path of the collectives (the launchers' arguments; gloo or any torch.distributed backend):
the same calls as the launchers, which need no Triton."""

from __future__ import annotations

from .launch import all_argmax_nccl, all_gather_nccl, all_reduce_nccl

__all__ = ["all_reduce", "all_gather", "all_argmax"]


def all_reduce(x, out, group=None, workspace=None, **params) -> None:
    """out[T, H] = the sum of x over the ranks of `group` (None: one rank, a copy)."""
    all_reduce_nccl(x, out, group)


def all_gather(x, out, group=None, workspace=None, **params) -> None:
    """out[R, N] = the ranks' x [R, N/G] column blocks in rank order."""
    all_gather_nccl(x, out, group, workspace)


def all_argmax(x, ids, group=None, workspace=None, vocab_begin=0, **params) -> None:
    """ids[R] = the argmax of the whole rows whose columns the ranks' x [R, N/G] hold (lowest id on ties)."""
    all_argmax_nccl(x, ids, group, workspace, vocab_begin)
