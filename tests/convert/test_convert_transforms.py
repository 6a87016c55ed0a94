"""Source → NInfer logical tensors, checked against HF's own math (not just our reading of it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ninfer_compile.convert.hf import convert_state_dict, draft_token_ids_from_ranking, ninfer_tensors
from ninfer_compile.errors import ConvertError

from .conftest import TINY, make_model


@pytest.fixture(scope="module")
def tiny():
    model = make_model(TINY)
    return model, model.state_dict(), convert_state_dict(model.config.to_dict(), model.state_dict())


def test_order_and_shapes(tiny):
    _, _, objs = tiny
    names = list(objs)
    assert names[0] == "text/token_embedding" and names[-2:] == ["text/final_norm", "text/output_head"]
    assert names[1:14] == [f"text/layers/0/{s}" for s in (
        "input_norm", "gdn/a_log", "gdn/dt_bias", "gdn/convolution", "gdn/a_projection", "gdn/b_projection",
        "gdn/query_key", "gdn/value_z", "gdn/norm", "gdn/output", "post_attention_norm", "mlp/gate_up",
        "mlp/down")]
    assert objs["text/layers/3/attention/query_key"].shape == (4 * 32 + 2 * 32, 96)
    assert objs["text/layers/3/attention/gate_value"].shape == (4 * 32 + 2 * 32, 96)
    assert objs["text/layers/0/gdn/convolution"].shape == (4, 2 * 2 * 16 + 4 * 24)
    assert objs["text/layers/0/gdn/value_z"].shape == (2 * 4 * 24, 96)
    assert objs["text/layers/0/gdn/a_log"].dtype == torch.float32
    assert len(objs) == 3 + 3 * 13 + 9


def test_attention_split_matches_hf(tiny):
    model, _, objs = tiny
    attn = model.model.layers[3].self_attn
    x = torch.randn(5, 96)
    with torch.no_grad():
        q_hf, gate_hf = torch.chunk(attn.q_proj(x).view(5, -1, 64), 2, dim=-1)  # HF's own split
        qk = x @ objs["text/layers/3/attention/query_key"].T
        gv = x @ objs["text/layers/3/attention/gate_value"].T
        torch.testing.assert_close(qk[:, :128], q_hf.reshape(5, -1))
        torch.testing.assert_close(qk[:, 128:], attn.k_proj(x))
        torch.testing.assert_close(gv[:, :128], gate_hf.reshape(5, -1))
        torch.testing.assert_close(gv[:, 128:], attn.v_proj(x))


def test_gdn_transforms_match_hf(tiny):
    model, sd, objs = tiny
    gdn = model.model.layers[0].linear_attn
    x = torch.randn(5, 96)
    with torch.no_grad():
        q, k, v = torch.split(gdn.in_proj_qkv(x), [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
        qk = x @ objs["text/layers/0/gdn/query_key"].T
        vz = x @ objs["text/layers/0/gdn/value_z"].T
        torch.testing.assert_close(qk, torch.cat([q, k], -1))
        torch.testing.assert_close(vz, torch.cat([v, gdn.in_proj_z(x)], -1))
        # conv: HF's depthwise causal conv over [C, T] equals the tap-major [kernel, C] form
        seq = torch.randn(1, gdn.conv_dim, 7)
        ref = F.conv1d(seq, gdn.conv1d.weight, padding=3, groups=gdn.conv_dim)[..., :7]
        w = objs["text/layers/0/gdn/convolution"]  # [4, C]
        padded = F.pad(seq[0], (3, 0))
        mine = sum(w[j][:, None] * padded[:, j:j + 7] for j in range(4))
        torch.testing.assert_close(mine, ref[0])
    assert torch.equal(objs["text/layers/0/gdn/a_log"], sd["model.layers.0.linear_attn.A_log"].float())
    assert torch.equal(objs["text/layers/0/gdn/dt_bias"], sd["model.layers.0.linear_attn.dt_bias"].float())


def test_tied_head_and_missing_tensor():
    model = make_model(dict(TINY, tie_word_embeddings=True))
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    objs = convert_state_dict(model.config.to_dict(), sd)
    assert torch.equal(objs["text/output_head"], sd["model.embed_tokens.weight"])
    del sd["model.layers.2.mlp.up_proj.weight"]
    with pytest.raises(ConvertError, match="model.layers.2.mlp.up_proj.weight"):
        dict(ninfer_tensors(model.config.to_dict(), sd.__getitem__, set(sd)))


def test_multimodal_names_and_mtp(tiny):
    model, sd, objs = tiny
    cfg = model.config.to_dict()
    mm = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in sd.items()}
    # an MTP layer made of the attention layer's tensors (same shapes as a full-attention layer)
    for k, v in sd.items():
        if k.startswith("model.layers.3."):
            mm["mtp.layers.0." + k[len("model.layers.3."):]] = v
    mm["mtp.fc.weight"] = torch.randn(96, 192)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mm[f"mtp.{n}.weight"] = torch.randn(96)
    out = convert_state_dict({"text_config": cfg, "tie_word_embeddings": False}, mm)
    for name, t in objs.items():
        assert torch.equal(out[name], t), name
    qkgv = out["mtp/layer/attention/query_key_gate_value"]
    qk, gv = objs["text/layers/3/attention/query_key"], objs["text/layers/3/attention/gate_value"]
    assert torch.equal(qkgv, torch.cat([qk, gv]))  # [query, key, gate, value]
    assert list(out)[-12:][0] == "mtp/input_projection" and list(out)[-1] == "mtp/final_norm"
    assert "mtp/input_projection" not in convert_state_dict(cfg, mm, include_mtp=False)


def test_draft_ranking_algorithm(tmp_path):
    counts = np.zeros((2, 16), dtype="<i8")
    counts[0, :12] = [5, 9, 9, 1, 0, 7, 3, 3, 8, 2, 6, 4]
    counts[1] = 100  # row 1 is ignored
    path = tmp_path / "r.i64"
    path.write_bytes(counts.tobytes())
    ids = draft_token_ids_from_ranking(path, vocab_rows=16, token_ids=12, draft_rows=5, special_ids=[4, 11, 13])
    # forced {4, 11}; top-3 non-forced by (-count, id): 1, 2, 8; merged and stably sorted by count
    assert ids.tolist() == [1, 2, 8, 11, 4]
    assert ids.dtype == torch.int32
    with pytest.raises(ConvertError, match="I64 rows"):
        path.write_bytes(b"\0" * 24)
        draft_token_ids_from_ranking(path, vocab_rows=16, token_ids=12, draft_rows=5, special_ids=[])
