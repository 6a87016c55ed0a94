"""The weight binding against the real `qwen3.6-27b` contract, on meta tensors (no data).

Every object the reference reads exists with the contract's shape, and every fused row view the
contract declares agrees with the rows the reference slices.
"""

import pytest
import torch

from ninfer_compile.reference.weights import _ROLE_NAMES, HybridDims, load_mtp_weights, load_text_weights

contracts = pytest.importorskip("ninfer_compile.contracts")


class MetaWeights:
    """A WeightSource handing out meta tensors of each object's contract shape; records reads."""

    def __init__(self, spec):
        self.spec, self.read = spec, set()

    def get(self, name):
        self.read.add(name)
        return torch.empty(self.spec.objects[name].shape, device="meta")


def test_27b_binding_and_views():
    spec = contracts.load_contract("qwen3.6-27b").resolve()
    dims = HybridDims.from_spec(spec)
    assert (dims.rotary_dim, dims.gdn_v_heads // dims.gdn_k_heads, dims.conv_channels) == (64, 3, 10240)
    assert dims.layer_kinds.count("attention") == 16 and dims.has_mtp
    src = MetaWeights(spec)
    text = load_text_weights(src, spec, dims)
    mtp = load_mtp_weights(src, spec, dims)
    assert text.layers[3].attention.gate.shape == (6144, 5120)
    assert text.layers[0].gdn.z.shape == (6144, 5120)
    assert mtp.layer.attention.value.shape == (1024, 5120)
    # every view the contract declares is on an object the reference reads, under a known role
    known_roles = {r for names in _ROLE_NAMES.values() for r in names}
    for parent, role in spec.views:
        assert parent in src.read and role in known_roles
    # the reference reads every text and MTP tensor (nothing is silently ignored)
    expected = {n for n, o in spec.objects.items() if o.kind == "tensor" and o.part in ("text", "mtp")}
    assert expected == src.read
