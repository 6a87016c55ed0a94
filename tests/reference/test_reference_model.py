"""Reference model vs HF transformers on tiny random configs, and state continuity.

Configs: hidden 96 and 160 (not multiples of 128); GDN K heads 2 serving 6 or 4 V heads; 4 layers
(3 GDN + 1 attention, NInfer's interval-4 pattern). Weights are bf16-exact float32.
Measured (DictWeights from convert_state_dict, 12-token prompt): rel L2 vs HF 3.1e-7 (hidden 96)
and 4.2e-7 (hidden 160), argmax equal at every position; bound 1e-3.
"""

import pytest
import torch

from ninfer_compile.errors import NinferError
from ninfer_compile.reference import DictWeights, ReferenceModel

from .hf_tiny import PROMPT, hf_logits, make_hf_model, ninfer_dict, rel_l2, spec_for


@pytest.fixture(scope="module")
def ref(tiny_spec, tiny_tensors):
    return ReferenceModel(tiny_spec, DictWeights(tiny_tensors))


def test_dict_weights_match_hf(ref, hf_prompt_logits):
    with torch.no_grad():
        logits = ref.prefill(PROMPT)
    assert logits.shape == (len(PROMPT), ref.dims.vocab_rows) and logits.dtype == torch.float32
    assert rel_l2(logits, hf_prompt_logits) < 1e-3
    assert torch.equal(logits.argmax(-1), hf_prompt_logits.argmax(-1))


def test_second_config_matches_hf():
    """hidden 160, K heads 2 -> V heads 4, head_dim 16 with rotary 4, 8 layers (2 attention)."""
    model = make_hf_model(seed=3, hidden_size=160, intermediate_size=224, num_hidden_layers=8,
                          num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                          linear_key_head_dim=32, linear_value_head_dim=16,
                          linear_num_key_heads=2, linear_num_value_heads=4)
    spec = spec_for(model.config)
    assert spec.layer_kinds.count("attention") == 2
    with torch.no_grad():
        ref = ReferenceModel(spec, DictWeights(ninfer_dict(model)))
        ours = ref.prefill(PROMPT)
    theirs = hf_logits(model, PROMPT)
    assert rel_l2(ours, theirs) < 1e-3
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_prefill_then_decode_equals_prefill(ref):
    with torch.no_grad():
        full = ref.prefill(PROMPT)
        # prefill T-1 tokens, then decode the last one
        st = ref.new_state()
        head = ref.prefill(PROMPT[:-1], st)
        last = ref.decode(PROMPT[-1], st)
        assert st.position == len(PROMPT)
        assert torch.allclose(head, full[:-1], rtol=0, atol=1e-5)
        assert torch.allclose(last, full[-1], rtol=0, atol=1e-5)
        # chunked prefill (5 + 4) then three single-token decodes
        st = ref.new_state()
        parts = [ref.prefill(PROMPT[:5], st), ref.prefill(PROMPT[5:9], st)]
        parts += [ref.decode(t, st)[None] for t in PROMPT[9:]]
        assert torch.allclose(torch.cat(parts), full, rtol=0, atol=1e-5)
        # the state keeps the final hidden states of the last call
        assert st.hidden.shape == (1, ref.dims.hidden) and st.hidden_prenorm.shape == (1, ref.dims.hidden)


def test_state_clone_is_a_snapshot(ref):
    with torch.no_grad():
        st = ref.new_state()
        ref.prefill(PROMPT[:6], st)
        snap = st.clone()
        a = ref.decode(PROMPT[6], st)
        ref.decode(PROMPT[7], st)             # advance the original further
        b = ref.decode(PROMPT[6], snap)       # the snapshot replays from position 6
    assert snap.position == 7 and st.position == 8
    assert torch.equal(a, b)


def test_state_shapes(ref):
    d = ref.dims
    st = ref.new_state()
    with torch.no_grad():
        ref.prefill(PROMPT[:3], st)
    attn = [l for l, k in enumerate(d.layer_kinds) if k == "attention"]
    assert sorted(st.kv) == attn and sorted(st.gdn) == [l for l in range(d.layers) if l not in attn]
    assert st.kv[attn[0]].k.shape == (3, d.kv_heads, d.head_dim)
    g = st.gdn[0]
    assert g.conv.shape == (d.conv_kernel - 1, d.conv_channels)
    assert g.recurrent.shape == (d.gdn_v_heads, d.gdn_k_dim, d.gdn_v_dim) and g.recurrent.dtype == torch.float32


@pytest.mark.parametrize("tokens", [[], [1, -1], [1, 320], [1.5], [True]])
def test_bad_tokens(ref, tokens):
    with pytest.raises(NinferError):
        ref.prefill(tokens)


def test_row_views_follow_contract_views(tiny_spec, tiny_tensors):
    """A contract view that disagrees with the dimension-derived rows is an error, not a silent
    mis-binding; one that agrees binds the same rows."""
    from types import SimpleNamespace

    d = tiny_spec.dims
    q = d["attn_heads"] * d["head_dim"]
    parent = "text/layers/3/attention/query_key"
    good = SimpleNamespace(**{**vars(tiny_spec), "views": {
        (parent, "query"): SimpleNamespace(parent=parent, role="query", row_begin=0, row_count=q, shape=None)}})
    ReferenceModel(good, DictWeights(tiny_tensors))
    bad = SimpleNamespace(**{**vars(tiny_spec), "views": {
        (parent, "key"): SimpleNamespace(parent=parent, role="key", row_begin=0, row_count=q, shape=None)}})
    with pytest.raises(NinferError, match="rows"):
        ReferenceModel(bad, DictWeights(tiny_tensors))
