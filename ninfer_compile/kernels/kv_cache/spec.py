"""Family spec of `kv_append`: write a step's K / V columns into the per-slot cache (no torch /
triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..spec_util import INDEX, VALUE, Bad, checker, eq

# The CLI's --kv-dtype spelling -> the route tables' kv_dtype match value.
KV_MATCH = {"bf16": "bf16", "int8": "int8_g64"}
KV_DTYPE = Attr("kv_dtype", (str, type(None)), None, to_launcher=False,
                doc="cache format (--kv-dtype: bf16 | int8), part of the route match; unset: the graph's")
CACHE = tuple(Operand(n, io="inout", roles=("state",), rank=4, doc=f"[slots, max_ctx, Hkv, D] {d}")
              for n, d in (("k_cache", "bf16 or int8 codes"), ("v_cache", "bf16 or int8 codes")))
SCALES = tuple(Operand(n, io="inout", roles=("state",), dtypes=("f16",), rank=4, optional=True,
                       doc="[slots, max_ctx, Hkv, D / 64] f16 scales of the int8 cache")
               for n in ("k_scale", "v_scale"))
POSITIONS = Operand("positions", roles=INDEX, dtypes=("i32",), rank=1, doc="[T] absolute positions")
SLOTS = Operand("slots", roles=INDEX, dtypes=("i32",), rank=1, doc="[T] sequence slots")


def kv_match(v: OpView) -> dict:
    """The cache part of a kv_append / attention match."""
    kvd = v.attr("kv_dtype") or v.meta.get("kv_dtype", "bf16")
    return {"format": "BF16", "kv_dtype": KV_MATCH.get(kvd, kvd), "head_dim": int(v.shape("k_cache")[-1])}


@checker
def _check(v: OpView) -> None:
    k, vv = v.shape("k"), v.shape("v")
    eq("v", vv, k)
    eq("positions", v.shape("positions"), (k[0],))
    eq("slots", v.shape("slots"), (k[0],))
    for c in ("k_cache", "v_cache"):
        cs = v.shape(c)
        if tuple(cs[2:]) != tuple(k[1:]):
            raise Bad(f"{c} {list(cs)} does not hold [*, *, {k[1]}, {k[2]}]")
        eq(f"{c} (updated)", v.shape(c, out=True), cs)
    if v.has("k_scale") != v.has("v_scale"):
        raise Bad("k_scale and v_scale come together")


SPECS = (FamilySpec(
    name="kv_append",
    operands=(
        Operand("k", roles=VALUE, rank=3, doc="[T, Hkv, D]"),
        Operand("v", roles=VALUE, rank=3, doc="[T, Hkv, D]"),
        POSITIONS, SLOTS, *CACHE, *SCALES,
    ),
    attrs=(KV_DTYPE,),
    t_operand="k", match=kv_match, check=_check,
    reference="ninfer_compile.kernels.kv_cache.reference:kv_append",
    match_keys=("kv_dtype", "head_dim"), int_match_keys=("head_dim",),
    layer_kind="attention",
    doc="cache[slots[t], positions[t]] = k[t], v[t] (int8: codes + f16 scales per 64)",
),)
