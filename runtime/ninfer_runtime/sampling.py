"""Per-sequence sampling parameters, and their upload into an extent's per-row sampling inputs.

Token selection runs on the device, inside the extent: the plan's `sampling` launch reads one
row of parameters per logits row from the extent's inputs `temperature` f32 [R] (0: greedy),
`top_k` i32 [R], `top_p` f32 [R], `seed` i32 [R, 2] (64 bits, low word first) and `sample_pos`
i32 [R] (the position the sampled token takes: the noise counter), and writes the `ids` output.
A sequence's tokens depend on its seed, its prompt and its positions, never on what else is in
the batch (the noise is Philox(seed, (token, position))).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import NinferRuntimeError

SAMPLING_INPUTS = ("temperature", "top_k", "top_p", "seed", "sample_pos")


@dataclass(frozen=True)
class SamplingParams:
    """`temperature` 0 (or `greedy=True`) = argmax. `top_k` 0 = off; `top_p` 1.0 = off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    greedy: bool | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        if self.greedy is not None:
            return bool(self.greedy)
        return self.temperature == 0.0

    def row(self) -> tuple[float, int, float, int, int]:
        """(temperature, top_k, top_p, seed low, seed high) as the device rows hold them (int32 words)."""
        if self.is_greedy:
            return (0.0, 0, 1.0, 0, 0)
        s = int(self.seed) & (2**64 - 1)
        lo, hi = s & 0xFFFFFFFF, s >> 32
        return (float(self.temperature), int(min(self.top_k, 2**31 - 1)), float(self.top_p),
                lo - (1 << 32) if lo >= 1 << 31 else lo, hi - (1 << 32) if hi >= 1 << 31 else hi)


def has_device_sampling(runner) -> bool:
    return all(n in runner.inputs for n in SAMPLING_INPUTS) and "ids" in runner.outputs


def require_device_sampling(runner) -> None:
    if not has_device_sampling(runner):
        raise NinferRuntimeError(f"extent {runner.name} has no sampling launch (the plan was compiled with sampling "
                                 f"off): recompile the plan to generate with it")


def host_rows(rows: list[tuple[SamplingParams | None, int]], R: int) -> torch.Tensor:
    """Packed int32 host words of R rows (missing rows: greedy, position 0), laid out as
    `upload_rows` reads them: top_k [R], sample_pos [R], temperature bits [R], top_p bits [R], seed [R, 2]."""
    greedy = SamplingParams()
    full = list(rows) + [(greedy, 0)] * (R - len(rows))
    vals = [((p or greedy).row(), pos) for p, pos in full]
    ints = torch.tensor([[v[1] for v, _ in vals], [pos for _, pos in vals]], dtype=torch.int32)
    flts = torch.tensor([[v[0] for v, _ in vals], [v[2] for v, _ in vals]], dtype=torch.float32).view(torch.int32)
    seeds = torch.tensor([[v[3], v[4]] for v, _ in vals], dtype=torch.int32).reshape(-1)
    return torch.cat([ints.reshape(-1), flts.reshape(-1), seeds])


def upload_rows(runner, words: torch.Tensor, *, non_blocking: bool = False) -> None:
    """Copy `host_rows` words into the runner's sampling inputs (R = their leading dim)."""
    ins = runner.inputs
    R = ins["temperature"].shape[0]
    ins["top_k"].copy_(words[0:R], non_blocking=non_blocking)
    ins["sample_pos"].copy_(words[R:2 * R], non_blocking=non_blocking)
    ins["temperature"].copy_(words[2 * R:3 * R].view(torch.float32), non_blocking=non_blocking)
    ins["top_p"].copy_(words[3 * R:4 * R].view(torch.float32), non_blocking=non_blocking)
    ins["seed"].copy_(words[4 * R:6 * R].view(R, 2), non_blocking=non_blocking)


def greedy_rows(runner) -> None:
    """Every row of the runner's sampling launch greedy (a plan's sampling op run for its logits only)."""
    if "temperature" in runner.inputs:
        runner.inputs["temperature"].zero_()
