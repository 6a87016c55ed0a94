"""Token selection: Triton argmax / Gumbel sampling and the torch top-k/top-p sampler."""

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.sampling import launch, reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("T,V", [(1, 50), (3, 4097), (5, 9000)])
def test_argmax(T, V):
    x = torch.randn(T, V, generator=torch.Generator().manual_seed(V)).bfloat16()
    x[0, V - 1] = 100.0  # maximum in the last (partial) block
    if T > 1:
        x[1, 7] = x[1, 4096] = 50.0  # a tie across blocks -> the lower index
    out = torch.empty(T, dtype=torch.int32, device=DEV)
    ws = torch.empty(launch.select_workspace_numel(T, V), device=DEV)
    launch.argmax(x.to(DEV), out, ws)
    assert torch.equal(out.cpu().long(), reference.argmax(x))


def test_gumbel_is_seeded_and_follows_the_distribution():
    T, V = 150, 6
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0]).repeat(T, 1).to(DEV)
    ws = torch.empty(launch.select_workspace_numel(T, V), device=DEV)
    a = torch.empty(T, dtype=torch.int32, device=DEV)
    b = torch.empty_like(a)
    launch.sample_gumbel(logits, a, ws, 0.8, seed=1234)
    launch.sample_gumbel(logits, b, ws, 0.8, seed=1234)
    assert torch.equal(a, b)
    freq = torch.bincount(a.cpu().long(), minlength=V).float() / T
    want = reference.filtered_probs(logits[:1].cpu(), 0.8)[0]
    assert (freq - want).abs().max() < 0.15  # ~3.5 sigma at T=150
    c = torch.empty(20, dtype=torch.int32, device=DEV)
    launch.sample_gumbel(logits[:20], c, ws, 0.8, seed=99)
    assert not torch.equal(a[:20], c)


def test_topk_topp_sampler():
    T, V = 64, 40
    logits = torch.randn(T, V, generator=torch.Generator().manual_seed(0)).to(DEV)
    a = torch.empty(T, dtype=torch.int32, device=DEV)
    b = torch.empty_like(a)
    launch.sample(logits, a, 1.0, top_k=5, top_p=0.9, seed=7)
    launch.sample(logits, b, 1.0, top_k=5, top_p=0.9, seed=7)
    assert torch.equal(a, b)
    probs = reference.filtered_probs(logits.cpu(), 1.0, 5, 0.9)
    assert (probs.gather(1, a.cpu().long()[:, None]) > 0).all()
    assert ((probs > 0).sum(-1) <= 5).all()
    launch.sample(logits, a, 0.0)
    assert torch.equal(a.cpu().long(), reference.argmax(logits.cpu()))


def test_workspace_required():
    with pytest.raises(RouteError, match="workspace"):
        launch.argmax(torch.zeros(2, 10, device=DEV), torch.empty(2, dtype=torch.int32, device=DEV),
                      torch.empty(1, device=DEV))


@pytest.mark.gpu
def test_argmax_27b_vocab_gpu():
    T, V = 4, 248320
    x = torch.randn(T, V, device="cuda").bfloat16()
    out = torch.empty(T, dtype=torch.int32, device="cuda")
    ws = torch.empty(launch.select_workspace_numel(T, V), device="cuda")
    launch.argmax(x, out, ws)
    assert torch.equal(out.long().cpu(), reference.argmax(x.cpu()))
