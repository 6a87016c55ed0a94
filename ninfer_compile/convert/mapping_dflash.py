"""DFlash companion checkpoint tensors → the `dflash/` objects (qwen3.6-35b-a3b artifact reference,
section 13.3). The companion is a separate safetensors checkpoint; its source names are prefixed
with `dflash:` here so one pack can read both checkpoints.

- `fc.weight` → `dflash/feature_projection` (its input columns stay in captured-layer order);
- `hidden_norm.weight` → `dflash/context_norm`, `norm.weight` → `dflash/final_norm`;
- per draft layer: `self_attn.{q,k,v}_proj` → one `[query, key, value]` parent, `mlp.{gate,up}_proj`
  → one `[gate, up]` parent, the norms and `o_proj` / `down_proj` as they are.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConvertError
from .mapping import ObjectRecipe, _cat, _identity

PREFIX = "dflash:"


def dflash_recipes(names: Iterable[str]) -> list[ObjectRecipe]:
    """Recipes of the dflash part, in writer order, from the companion's (prefixed) tensor names."""
    names = {n[len(PREFIX):] for n in names if n.startswith(PREFIX)}
    layers = sorted({int(n.split(".")[1]) for n in names if n.startswith("layers.")})
    if not layers or layers != list(range(len(layers))):
        raise ConvertError(f"DFlash checkpoint: layers.* indices {layers or 'none'} are not 0..N-1")

    def r(out: str, sources: tuple[str, ...], fn=_identity) -> ObjectRecipe:
        return ObjectRecipe(out, tuple(PREFIX + s for s in sources), fn, "dflash")

    rec = [r("dflash/feature_projection", ("fc.weight",)), r("dflash/context_norm", ("hidden_norm.weight",))]
    for l in layers:
        o, s = f"dflash/layers/{l}/", f"layers.{l}."
        a = s + "self_attn."
        rec += [
            r(o + "input_norm", (s + "input_layernorm.weight",)),
            r(o + "attention/query_key_value", (a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"), _cat),
            r(o + "attention/query_norm", (a + "q_norm.weight",)),
            r(o + "attention/key_norm", (a + "k_norm.weight",)),
            r(o + "attention/output", (a + "o_proj.weight",)),
            r(o + "post_attention_norm", (s + "post_attention_layernorm.weight",)),
            r(o + "mlp/gate_up", (s + "mlp.gate_proj.weight", s + "mlp.up_proj.weight"), _cat),
            r(o + "mlp/down", (s + "mlp.down_proj.weight",)),
        ]
    rec.append(r("dflash/final_norm", ("norm.weight",)))
    return rec
