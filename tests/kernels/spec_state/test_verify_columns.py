"""The per-column routes a verify extent reuses (phase verify in their domains): attention decode
over rows of W consecutive columns of one slot gives what the causal prefill kernel gives for each
row (every column reads cache rows 0..its position; kv_append wrote the row's K/V first), at a
verify T past the old decode limit of 64. (gdn_gating_proj_rows reads no slot or position: its
columns are independent by construction.)"""

import pytest
import torch

from ninfer_compile.kernels.attention import launch, reference
from ninfer_compile.kernels.registry import default_registry

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("C,W,split", [(2, 2, 512), (3, 4, 64), (9, 8, 512)])
def test_attention_decode_on_verify_rows_matches_prefill(C, W, split):
    Hq, Hkv, D, ctx = 4, 2, 32, 96
    gen = torch.Generator().manual_seed(C * W)
    kc = torch.randn(C + 1, ctx, Hkv, D, generator=gen).bfloat16().to(DEV)  # [slots, ctx, Hkv, D]
    vc = torch.randn(C + 1, ctx, Hkv, D, generator=gen).bfloat16().to(DEV)
    T = C * W
    fused = torch.randn(T, Hq, 2 * D, generator=gen).bfloat16().to(DEV)
    q, gate = fused[:, :, :D], fused[:, :, D:]  # [T, Hq, D] strided halves
    p0 = [0, 5, 40, 1, 2, 3, 60, 70, 80][:C]
    slots = torch.tensor([r + 1 for r in range(C) for _ in range(W)], dtype=torch.int32, device=DEV)  # [T]
    pos = torch.tensor([p0[r] + j for r in range(C) for j in range(W)], dtype=torch.int32, device=DEV)  # [T]
    out = torch.empty(T, Hq * D, dtype=torch.bfloat16, device=DEV)
    ws = torch.empty(max(1, launch.decode_workspace_numel(T, Hq, D, ctx, split)), device=DEV)
    launch.attention_decode(q, gate, kc, vc, pos, slots, out, workspace=ws, split_tokens=split)
    want = torch.empty_like(out)
    for r in range(C):
        rows = slice(r * W, (r + 1) * W)
        launch.attention_prefill(q[rows], gate[rows], kc, vc, pos[rows].contiguous(), slots[rows].contiguous(),
                                 want[rows], block_m=16, block_n=16)
    torch.testing.assert_close(out.float().cpu(), want.float().cpu(), atol=2e-2, rtol=2e-2)
    ref = reference.attention(q.cpu(), gate.cpu(), kc.cpu(), vc.cpu(), pos.cpu(), slots.cpu(), D ** -0.5)
    torch.testing.assert_close(out.float().cpu(), ref.float(), atol=2e-2, rtol=2e-2)


def test_verify_domains():
    m = {"phase": "verify", "kv_dtype": "bf16", "format": "BF16", "n": 48, "k": 5120}
    for name in ("attention_decode_splitkv", "gdn_gating_proj_rows", "gdn_recurrent_verify", "conv1d_verify",
                 "state_select_copy"):
        r = default_registry.get_route(name)
        assert r.covers(1, 72, m) is None, name  # C * W = 8 * 9
        assert r.domain.max_t == 128
