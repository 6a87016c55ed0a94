"""Hugging Face Qwen3.5/3.6 checkpoint → NInfer logical tensors.

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
    if c.get("attention_bias"):
        raise ConvertError(f"{where}: attention_bias=true is not supported (NInfer attention has no bias)")
    return TextGeometry(
        hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        k_heads=int(_cfg(c, "linear_num_key_heads", 16, where=where)),
        k_dim=int(_cfg(c, "linear_key_head_dim", 128, where=where)),
        v_heads=int(_cfg(c, "linear_num_value_heads", 32, where=where)),
        v_dim=int(_cfg(c, "linear_value_head_dim", 128, where=where)),
        intermediate=int(_cfg(c, "intermediate_size", where=where)),
        vocab=int(_cfg(c, "vocab_size", where=where)),
        layer_kinds=tuple(kinds),
        mtp_layers=int(c.get("mtp_num_hidden_layers") or 0),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
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
    for l, kind in enumerate(g.layer_kinds):
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
        rec += mtp_recipes(g, names)
    return rec


def mtp_recipes(g: TextGeometry, names: set[str]) -> list[ObjectRecipe]:
    layer_ids = {n.split(".")[2] for n in names if n.startswith("mtp.layers.")}
    if layer_ids != {"0"}:
        raise ConvertError(f"mtp: expected exactly one MTP layer (mtp.layers.0.*), found layers "
                           f"{sorted(layer_ids) or 'none'}")
    m = "mtp.layers.0."
    rec = [
        ObjectRecipe("mtp/input_projection", ("mtp.fc.weight",), _identity, "mtp"),
        ObjectRecipe("mtp/embedding_norm", ("mtp.pre_fc_norm_embedding.weight",), _identity, "mtp"),
        ObjectRecipe("mtp/hidden_norm", ("mtp.pre_fc_norm_hidden.weight",), _identity, "mtp"),
        ObjectRecipe("mtp/layer/input_norm", (m + "input_layernorm.weight",), _identity, "mtp"),
    ]
    rec += _attention_recipes("mtp/layer/", m, g, "mtp", mtp=True)
    rec.append(ObjectRecipe("mtp/layer/post_attention_norm", (m + "post_attention_layernorm.weight",),
                            _identity, "mtp"))
    rec += _mlp_recipes("mtp/layer/", m, "mtp")
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


# ----------------------------------------------------------------------------------------------
# checkpoint reading

FRONTEND_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                  "preprocessor_config.json", "video_preprocessor_config.json")
MODEL_TYPES = {"qwen3_5", "qwen3_5_text"}
ARCHITECTURES = {"Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"}


class HFCheckpoint:
    """A Hugging Face checkpoint directory read lazily, one tensor at a time.

    `config` (the raw config.json), `text_config` (the text part; top-level `tie_word_embeddings`
    merged in for multimodal configs), `vision_config` (or None), `names` (all tensor names),
    `shape(name)`, `dtype(name)`, `get(name)`, `resources()` → [(object name, path)] in NInfer order.
    """

    def __init__(self, hf_dir):
        import json
        from pathlib import Path

        self.dir = Path(hf_dir)
        if not self.dir.is_dir():
            raise ConvertError(f"{self.dir}: not a directory")
        cfg_path = self.dir / "config.json"
        if not cfg_path.is_file():
            raise ConvertError(f"{cfg_path}: missing (not a Hugging Face checkpoint directory)")
        try:
            self.config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConvertError(f"{cfg_path}: cannot parse: {_one_line(exc)}") from None
        if not isinstance(self.config, dict):
            raise ConvertError(f"{cfg_path}: not a JSON object")
        self.config_path = cfg_path
        model_type = self.config.get("model_type")
        archs = self.config.get("architectures") or []
        if model_type is None and not archs:
            raise ConvertError(f"{cfg_path}: missing field 'model_type'")
        if model_type is not None and model_type not in MODEL_TYPES:
            raise ConvertError(f"{cfg_path}: model_type {model_type!r} is not a Qwen3.5/3.6 hybrid "
                               f"(expected one of {sorted(MODEL_TYPES)})")
        bad = [a for a in archs if a not in ARCHITECTURES]
        if bad:
            raise ConvertError(f"{cfg_path}: unsupported architecture {bad[0]!r} "
                               f"(expected one of {sorted(ARCHITECTURES)})")
        if "text_config" in self.config:
            tc = self.config["text_config"]
            if not isinstance(tc, dict):
                raise ConvertError(f"{cfg_path}: field 'text_config' is not an object")
            self.text_config = dict(tc)
            if "tie_word_embeddings" in self.config and "tie_word_embeddings" not in tc:
                self.text_config["tie_word_embeddings"] = self.config["tie_word_embeddings"]
            self.config_where = f"{cfg_path}: text_config"
        else:
            self.text_config = dict(self.config)
            self.config_where = str(cfg_path)
        self.vision_config = self.config.get("vision_config")
        self.geometry = text_geometry(self.text_config, where=self.config_where)
        self._index = self._read_index()
        self.names = set(self._index)
        self._handles: dict = {}

    def _read_index(self) -> dict[str, str]:
        import json

        from safetensors import safe_open

        idx_path = self.dir / "model.safetensors.index.json"
        if idx_path.is_file():
            try:
                wm = json.loads(idx_path.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ConvertError(f"{idx_path}: cannot read weight_map: {_one_line(exc)}") from None
            for f in sorted(set(wm.values())):
                if not (self.dir / f).is_file():
                    raise ConvertError(f"{idx_path}: shard '{f}' is missing")
            return dict(wm)
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise ConvertError(f"{self.dir}: no model.safetensors(.index.json) found")
        index: dict[str, str] = {}
        for f in files:
            try:
                with safe_open(str(f), framework="pt") as h:
                    for k in h.keys():
                        index[k] = f.name
            except Exception as exc:  # safetensors raises its own error types
                raise ConvertError(f"{f}: cannot open safetensors: {_one_line(exc)}") from None
        return index

    def _handle(self, fname: str):
        from safetensors import safe_open

        h = self._handles.get(fname)
        if h is None:
            path = self.dir / fname
            try:
                h = safe_open(str(path), framework="pt")
            except Exception as exc:
                raise ConvertError(f"{path}: cannot open safetensors: {_one_line(exc)}") from None
            self._handles[fname] = h
        return h

    def _file_of(self, name: str) -> str:
        try:
            return self._index[name]
        except KeyError:
            raise ConvertError(f"{self.dir}: missing tensor '{name}'") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self._file_of(name)).get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        code = self._handle(self._file_of(name)).get_slice(name).get_dtype()
        return {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
                "I32": torch.int32, "I64": torch.int64}.get(code, torch.float32)

    def get(self, name: str) -> torch.Tensor:
        fname = self._file_of(name)
        try:
            return self._handle(fname).get_tensor(name)
        except ConvertError:
            raise
        except Exception as exc:
            raise ConvertError(f"{self.dir / fname}: cannot read tensor '{name}': {_one_line(exc)}") from None

    def resources(self) -> list[tuple[str, "object"]]:
        """`[("frontend/<file>", path)]` for the frontend files present, in NInfer order."""
        return [(f"frontend/{f}", self.dir / f) for f in FRONTEND_FILES if (self.dir / f).is_file()]

    def has_vision(self) -> bool:
        return any(n.startswith("model.visual.") for n in self.names)

    def has_mtp(self) -> bool:
        return any(n.startswith("mtp.") for n in self.names)

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ----------------------------------------------------------------------------------------------
# recipes (numeric formats per role) and contracts for new checkpoints

RECIPES = ("default", "bf16")
BASE_CONTRACT = "qwen3.6-27b"  # structure (inventory, views, aliases) and the `default` formats


def default_model_id(geometry: TextGeometry, recipe: str = "default") -> str:
    """`hf-qwen3_5-<hidden>x<layers>`, with `-<recipe>` for a non-default recipe."""
    base = f"hf-qwen3_5-{geometry.hidden}x{geometry.layers}"
    return base if recipe == "default" else f"{base}-{recipe}"


def recipe_formats(base, recipe: str) -> dict[str, str]:
    """Per-role format overrides over the base contract: `default` keeps the 27B table (Q6
    embedding/head, Q4 q/k, gate_up, GDN query_key, Q5 gate_value/output/value_z/down, BF16 norms,
    conv, a/b, FP32 a_log/dt_bias, W8 MTP matrices, ...); `bf16` makes every quantized role BF16."""
    if recipe == "default":
        return {}
    if recipe == "bf16":
        return {role: "BF16" for role, fmt in base.formats.items() if fmt not in ("BF16", "FP32", "I32")}
    raise ConvertError(f"unknown recipe {recipe!r} (known: {', '.join(RECIPES)})")


def vision_dims(vision_config: Mapping, *, where: str) -> dict[str, int]:
    v = vision_config
    hidden = int(_cfg(v, "hidden_size", 1152, where=where))
    merge = int(_cfg(v, "spatial_merge_size", 2, where=where))
    patch = v.get("patch_size", 16)
    patch = int(patch[0] if isinstance(patch, (list, tuple)) else patch)
    temporal = v.get("temporal_patch_size", 2)
    temporal = int(temporal[0] if isinstance(temporal, (list, tuple)) else temporal)
    return {
        "vision_depth": int(_cfg(v, "depth", 27, where=where)),
        "vision_hidden": hidden,
        "vision_intermediate": int(_cfg(v, "intermediate_size", 4304, where=where)),
        "vision_heads": int(_cfg(v, "num_heads", 16, where=where)),
        "vision_patch_in": int(_cfg(v, "in_channels", 3, where=where)) * temporal * patch * patch,
        "vision_positions": int(_cfg(v, "num_position_embeddings", 2304, where=where)),
        "vision_merge_in": hidden * merge * merge,
        "vision_out": int(_cfg(v, "out_hidden_size", where=where)),
    }


def _json_file(path) -> dict:
    import json
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{path}: cannot parse JSON: {_one_line(exc)}") from None
    if not isinstance(data, dict):
        raise ConvertError(f"{path}: not a JSON object")
    return data


def tokenizer_ids(hf_dir) -> tuple[int | None, list[int]]:
    """(tokenizer-addressable id count or None, ascending special ids) from tokenizer.json's vocab
    and added tokens merged with tokenizer_config.json's added_tokens_decoder."""
    from pathlib import Path
    d = Path(hf_dir)
    top = -1
    special: dict[int, bool] = {}
    tj = d / "tokenizer.json"
    if tj.is_file():
        data = _json_file(tj)
        vocab = (data.get("model") or {}).get("vocab")
        if isinstance(vocab, dict) and vocab:
            top = max(top, max(int(i) for i in vocab.values()))
        elif isinstance(vocab, list) and vocab:
            top = max(top, len(vocab) - 1)
        for tok in data.get("added_tokens") or []:
            i = int(tok["id"])
            top = max(top, i)
            special[i] = bool(tok.get("special", False))
    tc = d / "tokenizer_config.json"
    if tc.is_file():
        for key, tok in (_json_file(tc).get("added_tokens_decoder") or {}).items():
            i = int(key)
            top = max(top, i)
            if isinstance(tok, dict):
                special[i] = bool(tok.get("special", special.get(i, False)))
    return (top + 1 if top >= 0 else None), sorted(i for i, s in special.items() if s)


def draft_token_ids_from_ranking(path, *, vocab_rows: int, token_ids: int, draft_rows: int,
                                 special_ids: Iterable[int]) -> torch.Tensor:
    """The optimized draft-head id map (artifact doc §11.4) from a little-endian I64 count file
    (row width `vocab_rows`, row 0 used)."""
    import numpy as np
    from pathlib import Path
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConvertError(f"{p}: cannot read draft ranking: {exc.strerror or exc}") from None
    if len(raw) == 0 or len(raw) % (8 * vocab_rows):
        raise ConvertError(f"{p}: draft ranking is {len(raw)} bytes, not a whole number of I64 rows "
                           f"of width {vocab_rows}")
    counts = np.frombuffer(raw, dtype="<i8", count=vocab_rows).astype(np.int64)[:token_ids]
    forced = sorted({int(i) for i in special_ids if 0 <= int(i) < token_ids})
    if draft_rows > token_ids or len(forced) > draft_rows:
        raise ConvertError(f"{p}: cannot select {draft_rows} draft ids from {token_ids} tokens "
                           f"({len(forced)} forced special ids)")
    ids = np.arange(token_ids, dtype=np.int64)
    order = np.lexsort((ids, -counts))  # descending count, ascending id on ties
    forced_mask = np.zeros(token_ids, dtype=bool)
    forced_mask[forced] = True
    chosen = order[~forced_mask[order]][: draft_rows - len(forced)]
    merged = np.concatenate([chosen, np.asarray(forced, dtype=np.int64)])
    merged = merged[np.argsort(-counts[merged], kind="stable")]
    if len(merged) != draft_rows or len(np.unique(merged)) != draft_rows:
        raise ConvertError(f"{p}: draft selection gave {len(np.unique(merged))} unique ids, "
                           f"need {draft_rows}")
    return torch.from_numpy(merged.astype(np.int32))


# ----------------------------------------------------------------------------------------------
# encoding

_ROW_CHUNK_ELEMS = 1 << 25  # rows per quantization chunk: ~128 MB of float32


def encode_object(expected, tensor: torch.Tensor) -> bytes | bytearray:
    """Encode one logical tensor in the contract's format (canonical MAXABS encoder for grouped
    formats, quantized in row chunks: groups never cross rows, so chunking is bit-exact)."""
    from ..artifact import encode_direct, encode_row_split, quantize_maxabs, row_split_geometry
    from ..errors import ArtifactError

    fmt = expected.format
    try:
        if fmt == "BF16":
            return encode_direct("BF16", tensor.to(torch.bfloat16))
        if fmt == "FP32":
            return encode_direct("FP32", tensor.to(torch.float32))
        if fmt == "I32":
            if tensor.is_floating_point():
                raise ConvertError(f"{expected.name}: I32 object from a floating-point source")
            return encode_direct("I32", tensor.to(torch.int32))
        n, k = tensor.shape
        geo = row_split_geometry(fmt, n, k)
        step = max(1, _ROW_CHUNK_ELEMS // max(1, k))
        if step >= n:
            codes, scales = quantize_maxabs(fmt, tensor)
            return encode_row_split(fmt, codes, scales)
        out = bytearray(geo.total)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            codes, scales = quantize_maxabs(fmt, tensor[r0:r1])
            part = encode_row_split(fmt, codes, scales)
            cg = row_split_geometry(fmt, r1 - r0, k)
            for off, sub_off, row_bytes, nbytes in (
                    (geo.base_offset, cg.base_offset, geo.base_row_bytes, cg.base_bytes),
                    (geo.high_offset, cg.high_offset, geo.high_row_bytes, cg.high_bytes),
                    (geo.scale_offset, cg.scale_offset, geo.scale_row_bytes, cg.scale_bytes)):
                if nbytes:
                    dst = off + r0 * row_bytes
                    out[dst:dst + nbytes] = part[sub_off:sub_off + nbytes]
        return out
    except ArtifactError as exc:
        raise ConvertError(f"{expected.name}: {exc}") from None


# ----------------------------------------------------------------------------------------------
# pack

@dataclass
class PackResult:
    path: str
    model_id: str
    contract_path: str | None  # the contract written beside the artifact (None for graphs/ ids)
    objects: int
    file_size: int


def _progress(total: int, enabled: bool, desc: str):
    import sys

    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr,
                disable=not enabled, dynamic_ncols=True, leave=False)


def _known_ids() -> set[str]:
    from ..contracts import GRAPHS_DIR
    return {p.stem for p in GRAPHS_DIR.glob("*.yaml")}


def _base_with_resources(base, present_files: list[str]):
    """The base contract with its frontend resource list narrowed to the files present."""
    from ..contracts import Contract
    data = base.model_dump(mode="python", exclude_none=True)
    keep = {f"frontend/{f}" for f in present_files}
    inventory = []
    for section in data["inventory"]:
        if section.get("resources") is not None:
            section = {**section, "resources": [r for r in section["resources"] if r in keep]}
            if not section["resources"]:
                continue
        inventory.append(section)
    data["inventory"] = inventory
    return Contract.model_validate(data)


def build_contract(ckpt: HFCheckpoint, *, model_id: str, recipe: str, draft_rows: int | None,
                   with_draft: bool):
    """(contract, yaml text) for a checkpoint whose model id is not in graphs/: the structure of
    qwen3.6-27b with this checkpoint's dims/params/layer pattern, the recipe's formats, and the
    parts the checkpoint actually has (MTP if `mtp.*`, vision if `model.visual.*`, the frontend
    files present, the draft head only with a ranking)."""
    from ..contracts import dims_from_hf_config, load_contract, parse_contract, render_contract
    from ..errors import ContractError

    try:
        dims, params, kinds = dims_from_hf_config(ckpt.text_config)
    except ContractError as exc:
        raise ConvertError(f"{ckpt.config_path}: {exc}") from None
    params = dict(params)
    n_tok, _ = tokenizer_ids(ckpt.dir)
    if n_tok is not None:
        params["token_ids"] = min(n_tok, dims["vocab_rows"])
    parts = {"text": "required"}
    if ckpt.has_mtp():
        parts["mtp"] = "required"
        dims["mtp_layers"] = len({n.split(".")[2] for n in ckpt.names if n.startswith("mtp.layers.")}) or 1
    else:
        parts["mtp"] = "absent"
        dims.pop("mtp_layers", None)
    if ckpt.has_vision():
        if not isinstance(ckpt.vision_config, dict):
            raise ConvertError(f"{ckpt.config_path}: model.visual.* tensors present but no vision_config")
        dims.update(vision_dims(ckpt.vision_config, where=f"{ckpt.config_path}: vision_config"))
        parts["vision"] = "required"
    else:
        parts["vision"] = "absent"
    if with_draft:
        dims["draft_rows"] = min(draft_rows or 131072, params["token_ids"])
        parts["draft_head"] = "required"
    else:
        parts["draft_head"] = "absent"
    files = [f for f in FRONTEND_FILES if (ckpt.dir / f).is_file()]
    parts["frontend"] = "required" if files else "absent"
    base = load_contract(BASE_CONTRACT)
    absent = {p for p, st in parts.items() if st == "absent"}
    used_roles = set()
    for section in base.model_dump(mode="python", exclude_none=True)["inventory"]:
        if section["part"] in absent:
            continue
        groups = [section.get("tensors") or []] + list((section.get("per_layer") or {}).values())
        used_roles |= {t["role"] for g in groups for t in g}
    overrides = {r: f for r, f in recipe_formats(base, recipe).items() if r in used_roles}
    base = _base_with_resources(base, files or list(FRONTEND_FILES))
    try:
        text = render_contract(base, model_id, dims, params, overrides, parts, kinds)
        contract = parse_contract(text, f"<contract {model_id}>")
    except ContractError as exc:
        raise ConvertError(f"{ckpt.config_path}: cannot build a contract: {exc}") from None
    return contract, text


def pack_hf(hf_dir, out, *, recipe: str | None = None, model_id: str | None = None, contract_file=None,
            draft_ranking=None, draft_rows: int | None = None, progress: bool = True) -> PackResult:
    """Convert a Hugging Face Qwen3.5/3.6 checkpoint to `out` (.ninfer), streaming one object at
    a time. See `ninfer-compile pack --help` for the contract rules."""
    import sys
    from pathlib import Path

    from ..artifact import ArtifactWriter, ResourceSpec, TensorSpec
    from ..contracts import CONTRACT_SUFFIX, load_contract
    from ..errors import ArtifactError, ContractError

    out = Path(out)
    ckpt = HFCheckpoint(hf_dir)
    contract_text = None
    try:
        if contract_file is not None:
            if recipe is not None:
                raise ConvertError("--recipe conflicts with --contract (the contract fixes every format)")
            contract = load_contract(Path(contract_file))
            if model_id is not None and model_id != contract.model_id:
                raise ConvertError(f"--model-id {model_id!r} differs from the contract's model_id "
                                   f"{contract.model_id!r} ({contract_file})")
            model_id = contract.model_id
            if model_id not in _known_ids():
                contract_text = Path(contract_file).read_text(encoding="utf-8")
        else:
            recipe = recipe or "default"
            model_id = model_id or default_model_id(ckpt.geometry, recipe)
            if model_id in _known_ids():
                if recipe != "default":
                    raise ConvertError(f"model id {model_id!r} is registered in graphs/ with the default "
                                       f"recipe; --recipe {recipe} would change its formats (pass another "
                                       f"--model-id, e.g. {model_id}-{recipe})")
                contract = load_contract(model_id)
            else:
                contract, contract_text = build_contract(ckpt, model_id=model_id, recipe=recipe,
                                                         draft_rows=draft_rows,
                                                         with_draft=draft_ranking is not None)
    except ContractError as exc:
        raise ConvertError(str(exc)) from None

    status = contract.part_status()
    present = []
    if status["mtp"] == "optional" and ckpt.has_mtp():
        present.append("mtp")
    if status["vision"] == "optional" and ckpt.has_vision():
        present.append("vision")
    if status["draft_head"] == "optional" and draft_ranking is not None:
        present.append("draft_head")
    if status["frontend"] == "optional":
        from ..contracts import PART_NAMES
        wanted = [n for n, o in contract.resolve(present=PART_NAMES).objects.items() if o.part == "frontend"]
        have = dict(ckpt.resources())
        if wanted and all(n in have for n in wanted):
            present.append("frontend")
        elif have:
            missing = [n.split("/", 1)[1] for n in wanted if n not in have]
            print(f"warning: {ckpt.dir}: frontend resources not packed (optional part of {model_id}, "
                  f"all or nothing; missing {', '.join(missing)})", file=sys.stderr)
    spec = contract.resolve(present=present)
    where = f"{ckpt.dir}"

    # draft head ids
    draft_ids = None
    if spec.parts.get("draft_head"):
        if draft_ranking is None:
            raise ConvertError(f"{model_id}: the contract requires the optimized draft head "
                               f"(text/draft_head), which NInfer builds from a token-frequency ranking; "
                               f"pass --draft-ranking FILE.i64")
        _, special = tokenizer_ids(ckpt.dir)
        draft_ids = draft_token_ids_from_ranking(
            draft_ranking, vocab_rows=spec.dims["vocab_rows"], token_ids=int(spec.params["token_ids"]),
            draft_rows=spec.dims["draft_rows"], special_ids=special)
    if spec.parts.get("mtp") and not ckpt.has_mtp():
        raise ConvertError(f"{where}: contract {model_id} requires the MTP part but the checkpoint has "
                           f"no mtp.* tensors")
    if spec.parts.get("vision") and not ckpt.has_vision():
        raise ConvertError(f"{where}: contract {model_id} requires the vision part but the checkpoint "
                           f"has no model.visual.* tensors")

    recipes = text_recipes(ckpt.text_config, ckpt.names, include_mtp=bool(spec.parts.get("mtp")),
                           draft_token_ids=draft_ids, where=ckpt.config_where)
    if spec.parts.get("vision"):
        recipes += vision_recipes(ckpt.names)
    by_name = {r.name: r for r in recipes}
    resources = dict(ckpt.resources())

    # Everything is checked before a byte is written: names, sources, shapes (from metadata).
    writer_specs = []
    for name, exp in spec.objects.items():
        if exp.kind == "resource":
            path = resources.get(name)
            if path is None:
                raise ConvertError(f"{where}: missing frontend file '{name.split('/', 1)[1]}' "
                                   f"(resource {name} of contract {model_id})")
            size = path.stat().st_size
            if size == 0:
                raise ConvertError(f"{path}: empty file (raw-bytes-v1 resources are nonempty)")
            writer_specs.append(ResourceSpec(name, size))
            continue
        r = by_name.get(name)
        if r is None:
            raise ConvertError(f"{where}: contract {model_id} expects {name}, which this converter "
                               f"cannot produce from the checkpoint")
        check_sources([r], ckpt.names, where=where)
        shapes = {s: ckpt.shape(s) for s in r.sources}
        shape = r.meta_shape(shapes, {s: ckpt.dtype(s) for s in r.sources}) if r.sources else \
            tuple(r.build(ckpt.get).shape)
        if tuple(shape) != tuple(exp.shape):
            desc = ", ".join(f"{s} {list(v)}" for s, v in shapes.items())
            raise ConvertError(f"{name}: built shape {list(shape)} from {desc}, contract {model_id} "
                               f"expects {list(exp.shape)}")
        writer_specs.append(TensorSpec(name, exp.shape, exp.format))
    extra = [r.name for r in recipes if r.name not in spec.objects]
    if extra:
        raise ConvertError(f"{where}: produced object {extra[0]} is not in contract {model_id}")

    contract_path = None
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        writer = ArtifactWriter(out, model_id, writer_specs)
        with writer, _progress(writer.plan.file_size, progress, f"pack {out.name}") as bar:
            for ws in writer_specs:
                if isinstance(ws, ResourceSpec):
                    payload = resources[ws.name].read_bytes()
                    if len(payload) != ws.nbytes:
                        raise ConvertError(f"{resources[ws.name]}: changed size while packing")
                else:
                    tensor = by_name[ws.name].build(ckpt.get)
                    if tuple(tensor.shape) != ws.shape:
                        raise ConvertError(f"{ws.name}: built shape {list(tensor.shape)}, contract "
                                           f"expects {list(ws.shape)}")
                    payload = encode_object(spec.objects[ws.name], tensor)
                    del tensor
                writer.write(ws.name, payload)
                bar.update(len(payload))
                del payload
        if contract_text is not None:
            contract_path = Path(str(out) + CONTRACT_SUFFIX)
            tmp = contract_path.with_name(contract_path.name + ".tmp")
            try:
                tmp.write_text(contract_text, encoding="utf-8")
                tmp.replace(contract_path)
            except BaseException:  # an interrupt included: no temp file left behind
                tmp.unlink(missing_ok=True)
                raise
    except ArtifactError as exc:
        raise ConvertError(str(exc)) from None
    except OSError as exc:
        raise ConvertError(f"{out}: cannot write: {exc.strerror or exc}") from None
    finally:
        ckpt.close()
    return PackResult(str(out), model_id, str(contract_path) if contract_path else None,
                      len(writer_specs), writer.plan.file_size)
