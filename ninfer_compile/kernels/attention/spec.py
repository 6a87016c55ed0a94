"""Family spec of `attention`: gated GQA attention over the KV cache (no torch / triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..kv_cache.spec import KV_DTYPE, POSITIONS, SLOTS, kv_match
from ..spec_util import VALUE, Bad, checker, eq


@checker
def _check(v: OpView) -> None:
    q = v.shape("q")
    eq("gate", v.shape("gate"), q)
    kc = v.shape("k_cache")
    vc = v.shape("v_cache")
    if tuple(vc[:3]) != tuple(kc[:3]) or vc[3] not in (q[2], q[2] // 2):
        raise Bad(f"v_cache {list(vc)} does not match k_cache {list(kc)} for head dim {q[2]}")
    if q[1] % kc[2]:
        raise Bad(f"query heads {q[1]} not a multiple of KV heads {kc[2]}")
    if kc[3] not in (q[2], q[2] // 2):
        raise Bad(f"head dim {q[2]} != cache head dim {kc[3]} (or {q[2] // 2} packed 4-bit)")
    if v.has("k_scale") != v.has("v_scale"):
        raise Bad("k_scale and v_scale come together")
    eq("out", v.shape("out", out=True), (q[0], q[1] * q[2]))


def _match(v: OpView) -> dict:
    return {**kv_match(v), "phase": v.phase}


SPECS = (FamilySpec(
    name="attention",
    operands=(
        Operand("q", roles=VALUE, rank=3, doc="[T, Hq, D] (normed, rotated)"),
        Operand("gate", roles=VALUE, rank=3, doc="[T, Hq, D] output gate (sigmoid)"),
        Operand("k_cache", roles=("state",), rank=4, doc="[slots, max_ctx, Hkv, code width] (this step appended)"),
        Operand("v_cache", roles=("state",), rank=4, doc="[slots, max_ctx, Hkv, code width]"),
        Operand("k_scale", roles=("state",), dtypes=("f16", "u8"), rank=4, optional=True,
                doc="scales of a quantized KV format (kv_cache/formats.py)"),
        Operand("v_scale", roles=("state",), dtypes=("f16", "u8"), rank=4, optional=True,
                doc="scales of a quantized KV format"),
        POSITIONS, SLOTS,
        Operand("out", io="out", roles=VALUE, rank=2, doc="[T, Hq * D]"),
    ),
    attrs=(Attr("scale", (float, int), doc="softmax scale (1/sqrt(D))"), KV_DTYPE,
           Attr("window", (int,), None, optional=True,
                doc="a verify op's row width W (rows of W consecutive columns of one slot; set by lowering "
                    "at phase verify): attention_verify_packed reads a row's cache once for its W columns")),
    t_operand="q", match=_match, check=_check,
    reference="ninfer_compile.kernels.attention.reference:attention",
    torch_impl="ninfer_compile.kernels.attention.torch_impl:attention",
    match_keys=("phase", "kv_dtype", "head_dim"), int_match_keys=("head_dim",),
    layer_kind="attention",
    doc="column t attends to its slot's cache rows 0..positions[t]; out gated by sigmoid(gate)",
),)
