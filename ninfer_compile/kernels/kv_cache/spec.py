"""Family spec of `kv_append`: write a step's K / V columns into the per-slot cache (no torch /
triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..spec_util import INDEX, VALUE, Bad, checker, eq
from .formats import KV_DTYPES, KV_MATCH  # noqa: F401  (the formats as data; KV_MATCH: CLI name -> table value)

KV_DTYPE = Attr("kv_dtype", (str, type(None)), None, to_launcher=False,
                doc=f"cache format (--kv-dtype: {' | '.join(KV_DTYPES)}; kv_cache/formats.py), part of the "
                    f"route match; unset: the graph's")
CACHE = tuple(Operand(n, io="inout", roles=("state",), rank=4, doc=f"[slots, max_ctx, Hkv, code width] {d}")
              for n, d in (("k_cache", "K codes of the format (bf16 / i8 / u8)"),
                           ("v_cache", "V codes of the format (bf16 / i8 / u8)")))
SCALES = tuple(Operand(n, io="inout", roles=("state",), dtypes=("f16", "u8"), rank=4, optional=True,
                       doc="[slots, max_ctx, Hkv, scale width] scales of a quantized format (f16, or u8 e4m3)")
               for n in ("k_scale", "v_scale"))
POSITIONS = Operand("positions", roles=INDEX, dtypes=("i32",), rank=1, doc="[T] absolute positions")
SLOTS = Operand("slots", roles=INDEX, dtypes=("i32",), rank=1, doc="[T] sequence slots")


def kv_match(v: OpView) -> dict:
    """The cache part of a kv_append / attention match."""
    kvd = v.attr("kv_dtype") or v.meta.get("kv_dtype", "bf16")
    head = v.shape("q")[-1] if v.has("q") else v.shape("k")[-1]  # D (a 4-bit cache row holds D / 2 bytes)
    return {"format": "BF16", "kv_dtype": KV_MATCH.get(kvd, kvd), "head_dim": int(head)}


@checker
def _check(v: OpView) -> None:
    k, vv = v.shape("k"), v.shape("v")
    eq("v", vv, k)
    eq("positions", v.shape("positions"), (k[0],))
    eq("slots", v.shape("slots"), (k[0],))
    for c in ("k_cache", "v_cache"):
        cs = v.shape(c)
        if cs[2] != k[1] or cs[3] not in (k[2], k[2] // 2):
            raise Bad(f"{c} {list(cs)} does not hold [*, *, {k[1]}, {k[2]} (or {k[2] // 2} packed 4-bit)]")
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
    torch_impl="ninfer_compile.kernels.kv_cache.torch_impl:kv_append",
    match_keys=("kv_dtype", "head_dim"), int_match_keys=("head_dim",),
    layer_kind="attention",
    doc="cache[slots[t], positions[t]] = k[t], v[t] encoded in the cache's KV format (kv_cache/formats.py)",
),)
