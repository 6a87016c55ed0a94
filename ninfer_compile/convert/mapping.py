"""Hugging Face Qwen3.5/3.6 tensors → NInfer logical tensors: config geometry and name mapping.

The transforms are those of the NInfer artifact reference (qwen3.6-27b-artifact.md §3, §10-12),
checked against transformers' `modeling_qwen3_5.py`:

- attention `q_proj.weight` is `[heads, 2*head_dim, hidden]` per head `[query | output_gate]`
  (HF: `q_proj(x).view(..., heads, 2*head_dim)` then `chunk(2)` → query first); the converter
  splits the halves: `query_key = [query | key]`, `gate_value = [gate | value]`;
- GDN `in_proj_qkv.weight` rows are `[query Hk*Dk | key Hk*Dk | value Hv*Dv]` (HF splits the conv
  output with `[key_dim, key_dim, value_dim]`): `query_key = rows[0, 2*Hk*Dk)`,
  `value_z = [value | in_proj_z]`;
- GDN `conv1d.weight` `[C, 1, kernel]` → tap-major `[kernel, C]`;
- GDN `A_log`, `dt_bias` → FP32 (HF computes `-exp(A_log.float()) * softplus(a + dt_bias)`);
- MLP `gate_up = [gate_proj | up_proj]`; MTP attention input `[query | key | gate | value]`;
- a tied output head (`tie_word_embeddings` and no `lm_head.weight`) copies the embedding.

Tensors come out in their logical stored shape and the *source* dtype (except a_log/dt_bias, which
are FP32), before format encoding. Every object is described by an `ObjectRecipe` (its source names
and a pure transform), so shapes can be computed on the meta device without reading any data.

Both naming schemes are handled: text-only `Qwen3_5ForCausalLM` (`model.layers.*`,
`model.embed_tokens`, `model.norm`, `lm_head`) and multimodal `Qwen3_5ForConditionalGeneration`
(`model.language_model.*`, `model.visual.*`, config under `text_config`); MTP sources are `mtp.*`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from ..errors import ConvertError

Transform = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class ObjectRecipe:
    """How one NInfer object is built: `fn(*[get(s) for s in sources])`."""

    name: str
    sources: tuple[str, ...]
    fn: Transform
    part: str  # text | mtp | draft_head | vision

    def build(self, get: Callable[[str], torch.Tensor]) -> torch.Tensor:
        tensors = [get(s) for s in self.sources]
        try:
            out = self.fn(*tensors)
        except (RuntimeError, ValueError, IndexError) as exc:
            shapes = ", ".join(f"{s} {list(t.shape)}" for s, t in zip(self.sources, tensors))
            raise ConvertError(f"{self.name}: cannot build from {shapes}: {_one_line(exc)}") from None
        return out.contiguous()

    def meta_shape(self, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, torch.dtype] | None = None
                   ) -> tuple[int, ...]:
        """The object's logical shape computed from source shapes only (meta tensors, no data)."""
        dtypes = dtypes or {}
        metas = [torch.empty(tuple(shapes[s]), dtype=dtypes.get(s, torch.bfloat16), device="meta")
                 for s in self.sources]
        try:
            return tuple(self.fn(*metas).shape)
        except (RuntimeError, ValueError, IndexError) as exc:
            desc = ", ".join(f"{s} {list(shapes[s])}" for s in self.sources)
            raise ConvertError(f"{self.name}: source shapes do not fit: {desc}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ----------------------------------------------------------------------------------------------
# config access

def _cfg(cfg: Mapping, key: str, default=None, *, where: str = "config.json"):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is None:
        raise ConvertError(f"{where}: missing field '{key}'")
    return default


@dataclass(frozen=True)
class TextGeometry:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    k_heads: int
    k_dim: int
    v_heads: int
    v_dim: int
    intermediate: int
    vocab: int
    layer_kinds: tuple[str, ...]  # "attention" | "gdn"
    mtp_layers: int
    tie_word_embeddings: bool
    # sparse MoE (`qwen3_5_moe`, mapping_moe.py); 0 for the dense models
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0


def text_geometry(text_config: Mapping, *, where: str = "config.json") -> TextGeometry:
    """The dimensions the transforms need. Fields HF gives defaults to are optional (same defaults);
    the size-defining ones are required."""
    c = text_config
    hidden = int(_cfg(c, "hidden_size", where=where))
    layers = int(_cfg(c, "num_hidden_layers", where=where))
    heads = int(_cfg(c, "num_attention_heads", where=where))
    kv_heads = int(_cfg(c, "num_key_value_heads", where=where))
    head_dim = int(_cfg(c, "head_dim", 256, where=where))
    types = c.get("layer_types")
    if types is None:
        interval = int(c.get("full_attention_interval") or 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if len(types) != layers:
        raise ConvertError(f"{where}: layer_types has {len(types)} entries, num_hidden_layers is {layers}")
    kinds = []
    for i, t in enumerate(types):
        if t == "full_attention":
            kinds.append("attention")
        elif t == "linear_attention":
            kinds.append("gdn")
        else:
            raise ConvertError(f"{where}: layer_types[{i}] = {t!r} is not full_attention/linear_attention")
    experts = int(c.get("num_experts") or 0)
    if c.get("attention_bias"):
        raise ConvertError(f"{where}: attention_bias=true is not supported (NInfer attention has no bias)")
    return TextGeometry(
        hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        k_heads=int(_cfg(c, "linear_num_key_heads", 16, where=where)),
        k_dim=int(_cfg(c, "linear_key_head_dim", 128, where=where)),
        v_heads=int(_cfg(c, "linear_num_value_heads", 32, where=where)),
        v_dim=int(_cfg(c, "linear_value_head_dim", 128, where=where)),
        intermediate=(int(c.get("intermediate_size") or 0) if experts
                      else int(_cfg(c, "intermediate_size", where=where))),
        vocab=int(_cfg(c, "vocab_size", where=where)),
        layer_kinds=tuple(kinds),
        mtp_layers=int(c.get("mtp_num_hidden_layers") or 0),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        **({"experts": experts,
            "experts_per_token": int(_cfg(c, "num_experts_per_tok", where=where)),
            "expert_intermediate": int(_cfg(c, "moe_intermediate_size", where=where)),
            "shared_intermediate": int(_cfg(c, "shared_expert_intermediate_size", where=where))}
           if experts else {}),
    )


# ----------------------------------------------------------------------------------------------
# transforms (pure functions of source tensors; work on meta tensors too)

def _identity(x):
    return x


def _to_f32(x):
    return x.to(torch.float32)


def _split_q(q: torch.Tensor, heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q_proj [heads*2*head_dim, K] with per-head [query | gate] → (query, gate), each [heads*head_dim, K]."""
    k = q.shape[-1]
    qg = q.reshape(heads, 2 * head_dim, k)
    return qg[:, :head_dim, :].reshape(heads * head_dim, k), qg[:, head_dim:, :].reshape(heads * head_dim, k)


def _cat(*xs):
    return torch.cat(xs, dim=0)


def _conv_tap_major(w: torch.Tensor) -> torch.Tensor:
    if w.dim() != 3 or w.shape[1] != 1:
        raise ValueError(f"expected [C, 1, kernel], got {list(w.shape)}")
    return w[:, 0, :].transpose(0, 1)


def _rows(begin: int, end: int):
    def fn(x):
        if x.shape[0] < end:
            raise ValueError(f"needs at least {end} rows, has {x.shape[0]}")
        return x[begin:end]
    return fn


def _flatten2(x):
    return x.reshape(x.shape[0], -1)


# ----------------------------------------------------------------------------------------------
# naming

def text_part(config: Mapping) -> dict:
    """The text config of a full multimodal config (`text_config`, with the top-level
    `tie_word_embeddings` merged in when the text part does not set it), or `config` itself."""
    tc = config.get("text_config")
    if not isinstance(tc, Mapping):
        return dict(config)
    out = dict(tc)
    if "tie_word_embeddings" in config and "tie_word_embeddings" not in tc:
        out["tie_word_embeddings"] = config["tie_word_embeddings"]
    return out


def text_prefix(names: Iterable[str]) -> str:
    """`model.language_model.` for multimodal checkpoints, `model.` for text-only ones."""
    for n in names:
        if n.startswith("model.language_model."):
            return "model.language_model."
    return "model."


def _attention_recipes(out: str, src: str, g: TextGeometry, part: str, *, mtp: bool = False) -> list[ObjectRecipe]:
    h, d = g.heads, g.head_dim
    q, k, v = src + "self_attn.q_proj.weight", src + "self_attn.k_proj.weight", src + "self_attn.v_proj.weight"
    r = []
    if mtp:
        def qkgv(qw, kw, vw):
            query, gate = _split_q(qw, h, d)
            return torch.cat([query, kw, gate, vw], dim=0)
        r.append(ObjectRecipe(out + "attention/query_key_gate_value", (q, k, v), qkgv, part))
    else:
        r.append(ObjectRecipe(out + "attention/query_key", (q, k),
                              lambda qw, kw: torch.cat([_split_q(qw, h, d)[0], kw], dim=0), part))
        r.append(ObjectRecipe(out + "attention/gate_value", (q, v),
                              lambda qw, vw: torch.cat([_split_q(qw, h, d)[1], vw], dim=0), part))
    r.append(ObjectRecipe(out + "attention/query_norm", (src + "self_attn.q_norm.weight",), _identity, part))
    r.append(ObjectRecipe(out + "attention/key_norm", (src + "self_attn.k_norm.weight",), _identity, part))
    r.append(ObjectRecipe(out + "attention/output", (src + "self_attn.o_proj.weight",), _identity, part))
    return r


def _mlp_recipes(out: str, src: str, part: str) -> list[ObjectRecipe]:
    return [
        ObjectRecipe(out + "mlp/gate_up", (src + "mlp.gate_proj.weight", src + "mlp.up_proj.weight"), _cat, part),
        ObjectRecipe(out + "mlp/down", (src + "mlp.down_proj.weight",), _identity, part),
    ]


def _gdn_recipes(out: str, src: str, g: TextGeometry) -> list[ObjectRecipe]:
    a = src + "linear_attn."
    kw = g.k_heads * g.k_dim
    vw = g.v_heads * g.v_dim
    return [
        ObjectRecipe(out + "gdn/a_log", (a + "A_log",), _to_f32, "text"),
        ObjectRecipe(out + "gdn/dt_bias", (a + "dt_bias",), _to_f32, "text"),
        ObjectRecipe(out + "gdn/convolution", (a + "conv1d.weight",), _conv_tap_major, "text"),
        ObjectRecipe(out + "gdn/a_projection", (a + "in_proj_a.weight",), _identity, "text"),
        ObjectRecipe(out + "gdn/b_projection", (a + "in_proj_b.weight",), _identity, "text"),
        ObjectRecipe(out + "gdn/query_key", (a + "in_proj_qkv.weight",), _rows(0, 2 * kw), "text"),
        ObjectRecipe(out + "gdn/value_z", (a + "in_proj_qkv.weight", a + "in_proj_z.weight"),
                     lambda qkv, z: torch.cat([_rows(2 * kw, 2 * kw + vw)(qkv), z], dim=0), "text"),
        ObjectRecipe(out + "gdn/norm", (a + "norm.weight",), _identity, "text"),
        ObjectRecipe(out + "gdn/output", (a + "out_proj.weight",), _identity, "text"),
    ]


def text_recipes(text_config: Mapping, names: set[str] | Iterable[str], *, include_mtp: bool = True,
                 draft_token_ids: torch.Tensor | None = None, where: str = "config.json") -> list[ObjectRecipe]:
    """Recipes for the text part (+ draft head when ids are given, + MTP when `mtp.*` is present),
    in NInfer writer order."""
    names = set(names)
    g = text_geometry(text_config, where=where)
    p = text_prefix(names)
    rec: list[ObjectRecipe] = [ObjectRecipe("text/token_embedding", (p + "embed_tokens.weight",), _identity, "text")]
    if g.experts:
        from .mapping_moe import moe_layer_recipes
        rec += moe_layer_recipes(g, names, p)
    for l, kind in enumerate(g.layer_kinds if not g.experts else ()):
        out, src = f"text/layers/{l}/", f"{p}layers.{l}."
        rec.append(ObjectRecipe(out + "input_norm", (src + "input_layernorm.weight",), _identity, "text"))
        if kind == "attention":
            rec += _attention_recipes(out, src, g, "text")
        else:
            rec += _gdn_recipes(out, src, g)
        rec.append(ObjectRecipe(out + "post_attention_norm", (src + "post_attention_layernorm.weight",),
                                _identity, "text"))
        rec += _mlp_recipes(out, src, "text")
    rec.append(ObjectRecipe("text/final_norm", (p + "norm.weight",), _identity, "text"))
    head = "lm_head.weight"
    if head not in names and g.tie_word_embeddings:
        head = p + "embed_tokens.weight"
    rec.append(ObjectRecipe("text/output_head", (head,), _identity, "text"))
    if draft_token_ids is not None:
        ids = draft_token_ids.to(torch.int32).contiguous()
        rec.append(ObjectRecipe("text/draft_head", (head,), lambda w: w.index_select(0, ids.long().to(w.device)),
                                "draft_head"))
        rec.append(ObjectRecipe("text/draft_head_token_ids", (), lambda: ids, "draft_head"))
    if include_mtp and any(n.startswith("mtp.") for n in names):
        if g.experts:
            from .mapping_moe import moe_mtp_recipes
            rec += moe_mtp_recipes(g, names)
        else:
            rec += mtp_recipes(g, names)
    return rec


def mtp_recipes(g: TextGeometry, names: Iterable[str], *, attention=None, feed_forward=None) -> list[ObjectRecipe]:
    """The MTP part: one full-attention layer. `attention(out, src)` / `feed_forward(out, src)` give the
    layer's attention and feed-forward recipes (default: the dense model's; the MoE converter passes its own)."""
    names = set(names)
    layer_ids = {n.split(".")[2] for n in names if n.startswith("mtp.layers.")}
    if layer_ids != {"0"}:
        raise ConvertError(f"mtp: expected exactly one MTP layer (mtp.layers.0.*), found layers "
                           f"{sorted(layer_ids) or 'none'}")
    if attention is None:
        attention = lambda out, src: _attention_recipes(out, src, g, "mtp", mtp=True)  # noqa: E731
    if feed_forward is None:
        feed_forward = lambda out, src: _mlp_recipes(out, src, "mtp")  # noqa: E731
    m = "mtp.layers.0."
    rec = [
        ObjectRecipe("mtp/input_projection", ("mtp.fc.weight",), _identity, "mtp"),
        ObjectRecipe("mtp/embedding_norm", ("mtp.pre_fc_norm_embedding.weight",), _identity, "mtp"),
        ObjectRecipe("mtp/hidden_norm", ("mtp.pre_fc_norm_hidden.weight",), _identity, "mtp"),
        ObjectRecipe("mtp/layer/input_norm", (m + "input_layernorm.weight",), _identity, "mtp"),
    ]
    rec += attention("mtp/layer/", m)
    rec.append(ObjectRecipe("mtp/layer/post_attention_norm", (m + "post_attention_layernorm.weight",),
                            _identity, "mtp"))
    rec += feed_forward("mtp/layer/", m)
    rec.append(ObjectRecipe("mtp/final_norm", ("mtp.norm.weight",), _identity, "mtp"))
    return rec


def vision_recipes(names: set[str] | Iterable[str]) -> list[ObjectRecipe]:
    """Vision tower + merger (artifact doc §12.2); block count from the `model.visual.blocks.*` names."""
    names = set(names)
    v = "model.visual."
    if not any(n.startswith(v) for n in names):
        return []
    blocks = sorted({int(n.split(".")[3]) for n in names if n.startswith(v + "blocks.")})
    if blocks != list(range(len(blocks))):
        raise ConvertError(f"model.visual.blocks: non-contiguous block indices {blocks}")
    rec = [
        ObjectRecipe("vision/patch_embedding", (v + "patch_embed.proj.weight",), _flatten2, "vision"),
        ObjectRecipe("vision/patch_embedding_bias", (v + "patch_embed.proj.bias",), _identity, "vision"),
        ObjectRecipe("vision/position_embedding", (v + "pos_embed.weight",), _identity, "vision"),
    ]
    pairs = [("attention/qkv", "attn.qkv.weight"), ("attention/qkv_bias", "attn.qkv.bias"),
             ("attention/output", "attn.proj.weight"), ("attention/output_bias", "attn.proj.bias"),
             ("mlp/fc1", "mlp.linear_fc1.weight"), ("mlp/fc1_bias", "mlp.linear_fc1.bias"),
             ("mlp/fc2", "mlp.linear_fc2.weight"), ("mlp/fc2_bias", "mlp.linear_fc2.bias"),
             ("norm1/weight", "norm1.weight"), ("norm1/bias", "norm1.bias"),
             ("norm2/weight", "norm2.weight"), ("norm2/bias", "norm2.bias")]
    for b in blocks:
        for out, src in pairs:
            rec.append(ObjectRecipe(f"vision/layers/{b}/{out}", (f"{v}blocks.{b}.{src}",), _identity, "vision"))
    for out, src in [("fc1", "linear_fc1.weight"), ("fc1_bias", "linear_fc1.bias"),
                     ("fc2", "linear_fc2.weight"), ("fc2_bias", "linear_fc2.bias"),
                     ("norm/weight", "norm.weight"), ("norm/bias", "norm.bias")]:
        rec.append(ObjectRecipe(f"vision/merger/{out}", (f"{v}merger.{src}",), _identity, "vision"))
    return rec


def check_sources(recipes: Iterable[ObjectRecipe], names: set[str], *, where: str = "checkpoint") -> None:
    """ConvertError naming the first missing source tensor (and the object that needs it)."""
    for r in recipes:
        for s in r.sources:
            if s not in names:
                raise ConvertError(f"{where}: missing tensor '{s}' (needed for {r.name})")


# ----------------------------------------------------------------------------------------------
# public API

def ninfer_tensors(text_config: dict, get: Callable[[str], torch.Tensor], names: set[str], *,
                   include_mtp: bool = True, include_vision: bool = False,
                   draft_token_ids: torch.Tensor | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(object name, logical tensor)` in NInfer writer order: text embedding, layers, final
    norm, output head, [draft head + ids when `draft_token_ids` is given], MTP (when `mtp.*` source
    names are present and `include_mtp`), [vision when `include_vision` and `model.visual.*` present].

    Tensors keep the source dtype (a_log/dt_bias become float32; draft ids int32). `names` is the set
    of source tensor names (used to pick the naming scheme, tied head, MTP/vision presence)."""
    names = set(names)
    recipes = text_recipes(text_part(text_config), names, include_mtp=include_mtp,
                           draft_token_ids=draft_token_ids)
    if include_vision:
        recipes += vision_recipes(names)
    check_sources(recipes, names)
    for r in recipes:
        yield r.name, r.build(get)


def convert_state_dict(text_config: dict, state_dict: Mapping[str, torch.Tensor], *, include_mtp: bool = True,
                       include_vision: bool = False) -> dict[str, torch.Tensor]:
    """`{object name: logical tensor}` from an in-memory HF state dict (e.g. `model.state_dict()`)."""
    return dict(ninfer_tensors(text_config, state_dict.__getitem__, set(state_dict.keys()),
                               include_mtp=include_mtp, include_vision=include_vision))
