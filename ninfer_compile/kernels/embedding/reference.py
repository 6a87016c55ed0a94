"""fp32 PyTorch reference of the token-embedding lookup.

ids: [T] int32; table: the dequantised float32 [V, H] matrix (for a row-split grouped table the
exact oracle is `decode_row_split(...).dequantize()`, i.e. float32(scale) * code; for a BF16
table its values) -> out [T, H] float32 = table[ids]. With `vocab_begin` (a vocabulary-parallel
rank's rows [vocab_begin, vocab_begin + V)): table[ids - vocab_begin], zero rows for ids outside.
"""

from __future__ import annotations

import torch


def embedding(ids: torch.Tensor, table: torch.Tensor, vocab_begin: int | None = None) -> torch.Tensor:
    full = table.float()
    if vocab_begin is None:
        return full[ids.long()]
    local = ids.long() - int(vocab_begin)
    inside = (local >= 0) & (local < full.shape[0])
    out = full[local.clamp(0, full.shape[0] - 1)]
    return out * inside[:, None].to(out.dtype)
