"""fp32 PyTorch reference of the token-embedding lookup.

ids: [T] int32; table: the dequantised float32 [V, H] matrix (for a row-split grouped table the
exact oracle is `decode_row_split(...).dequantize()`, i.e. float32(scale) * code; for a BF16
table its values) -> out [T, H] float32 = table[ids].
"""

from __future__ import annotations

import torch


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return table.float()[ids.long()]
