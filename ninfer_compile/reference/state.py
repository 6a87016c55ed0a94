"""Explicit recurrent state of the reference model.

The state is data, owned by the caller: `ReferenceModel.prefill/decode` read and update it, so
prefix reuse, snapshots (`clone`) and speculative rollback are plain Python operations here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class KVCache:
    """Keys/values of one attention layer for positions `[0, length)`.

    k, v: [ctx, kv_heads, head_dim] float32 — keys are stored after q/k norm and RoPE, exactly
    what later queries attend to. roundtrip: None (rows kept as computed) or `(k, v) -> (k', v')`,
    what a quantized cache gives back for the appended rows (kernels/kv_cache/reference.py
    `kv_roundtrip_fn`): the rows are stored through it.
    """

    k: torch.Tensor
    v: torch.Tensor
    roundtrip: Callable | None = None

    @classmethod
    def empty(cls, kv_heads: int, head_dim: int, device=None, roundtrip: Callable | None = None) -> "KVCache":
        z = torch.zeros(0, kv_heads, head_dim, dtype=torch.float32, device=device)
        return cls(z, z.clone(), roundtrip)

    @property
    def length(self) -> int:
        return int(self.k.shape[0])

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        # k, v: [T, kv_heads, head_dim]
        if self.roundtrip is not None:
            k, v = self.roundtrip(k, v)
        self.k = torch.cat([self.k, k], dim=0)
        self.v = torch.cat([self.v, v], dim=0)

    def truncate(self, length: int) -> None:
        self.k, self.v = self.k[:length], self.v[:length]

    def clone(self) -> "KVCache":
        return KVCache(self.k.clone(), self.v.clone(), self.roundtrip)


@dataclass
class GDNState:
    """State of one Gated DeltaNet layer.

    conv:      [kernel-1, C]  the last kernel-1 *input* columns of the [q|k|v] channels (zeros at
               sequence start, which is exactly the causal zero padding).
    recurrent: [v_heads, k_dim, v_dim] float32, the delta-rule memory S (read as q^T S).
    """

    conv: torch.Tensor
    recurrent: torch.Tensor

    @classmethod
    def empty(cls, kernel: int, channels: int, v_heads: int, k_dim: int, v_dim: int,
              device=None) -> "GDNState":
        return cls(torch.zeros(kernel - 1, channels, dtype=torch.float32, device=device),
                   torch.zeros(v_heads, k_dim, v_dim, dtype=torch.float32, device=device))

    def clone(self) -> "GDNState":
        return GDNState(self.conv.clone(), self.recurrent.clone())


@dataclass
class ModelState:
    """Everything the text model carries from one step to the next.

    position:      number of tokens processed (= next token's RoPE position).
    kv:            {layer: KVCache} for every attention layer.
    gdn:           {layer: GDNState} for every GDN layer.
    hidden:        [T, H] final-norm output of the last call (what the output head and, in
                   NInfer's schedule, the MTP head consume).
    hidden_prenorm:[T, H] residual stream of the last call before the final norm.
    """

    position: int = 0
    kv: dict[int, KVCache] = field(default_factory=dict)
    gdn: dict[int, GDNState] = field(default_factory=dict)
    hidden: torch.Tensor | None = None
    hidden_prenorm: torch.Tensor | None = None

    def clone(self) -> "ModelState":
        return ModelState(
            position=self.position,
            kv={l: c.clone() for l, c in self.kv.items()},
            gdn={l: s.clone() for l, s in self.gdn.items()},
            hidden=None if self.hidden is None else self.hidden.clone(),
            hidden_prenorm=None if self.hidden_prenorm is None else self.hidden_prenorm.clone(),
        )


@dataclass
class MTPState:
    """State of the one-layer MTP draft model: its own KV cache and position.

    position: number of MTP columns processed; column i pairs target hidden i with token i+1 and
    uses RoPE position i (the target column's position).
    """

    kv: KVCache
    position: int = 0

    def clone(self) -> "MTPState":
        return MTPState(self.kv.clone(), self.position)
