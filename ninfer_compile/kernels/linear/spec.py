"""Family spec of `linear`: x @ W^T with an optional epilogue (no torch / triton imports)."""

from ..family import Attr, FamilySpec, OpView, Operand
from ..spec_util import VALUE, Bad, checker, eq

EPILOGUES = ("none", "residual", "swiglu")

# Contract roles (qwen3_5_hybrid) of 2-D tensors that are not linear weights.
EMBEDDING_ROLES = {"token_embedding"}
NOT_LINEAR_ROLES = {"gdn_convolution", "vision_other", "draft_head_token_ids", "text_norm",
                    "mtp_norm", "gdn_decay"}


def _not_linear_name(name: str) -> bool:
    leaf = name.rsplit("/", 1)[-1]
    return any(w in leaf for w in ("norm", "bias", "convolution", "position", "token_ids"))


def weight_objects(contract) -> tuple[dict, dict]:
    """The contract's 2-D tensor objects by (format, n, k): (linear weights, embedding tables)."""
    linear: dict[tuple, list[str]] = {}
    embed: dict[tuple, list[str]] = {}
    for obj in contract.objects.values():
        if obj.kind != "tensor" or obj.shape is None or obj.format is None or len(obj.shape) != 2:
            continue
        role = obj.role or ""
        n, k = obj.shape
        if role in EMBEDDING_ROLES or (not role and "embedding" in obj.name and "patch" not in obj.name):
            embed.setdefault((obj.format, n, k), []).append(obj.name)
        elif role in NOT_LINEAR_ROLES or _not_linear_name(obj.name):
            continue
        else:
            linear.setdefault((obj.format, n, k), []).append(obj.name)
    return linear, embed


def objects_note(names: list[str]) -> str:
    names = sorted(names)
    if len(names) <= 2:
        return ", ".join(names)
    return f"{names[0]} … ({len(names)} objects)"


def _model_matches(contract, tables) -> list[tuple[dict, str]]:
    """One match per linear weight shape and epilogue the tables know for its format."""
    out = []
    for (fmt, n, k), names in sorted(weight_objects(contract)[0].items()):
        eps = {"none"}
        for table in tables:
            for g in table.groups.get("linear", []):
                if g.eff.get("format") in (None, fmt):
                    eps.add(g.eff["epilogue"])
        for ep in sorted(eps):
            out.append(({"format": fmt, "n": n, "k": k, "epilogue": ep}, objects_note(names)))
    return out


@checker
def _check(v: OpView) -> None:
    x, w, out = v.shape("x"), v.shape("weight"), v.shape("out", out=True)
    if x[1] != w[1]:
        raise Bad(f"x {list(x)} has K={x[1]}, weight {list(w)} has K={w[1]}")
    epi = v.attr("epilogue", "none")
    if epi not in EPILOGUES:
        raise Bad(f"unknown epilogue {epi!r}")
    if epi == "swiglu" and w[0] % 2:
        raise Bad(f"swiglu epilogue needs an even row count, weight {list(w)}")
    eq("out", out, (x[0], w[0] // 2 if epi == "swiglu" else w[0]))
    if epi == "residual":
        if not v.has("residual"):
            raise Bad("missing input operand 'residual'")
        eq("residual", v.shape("residual"), out)
    elif v.has("residual"):
        raise Bad(f"operand residual without the residual epilogue (epilogue {epi})")


def _match(v: OpView) -> dict:
    n, k = v.shape("weight")
    return {"format": v.format("weight"), "n": int(n), "k": int(k), "epilogue": v.attr("epilogue", "none")}


SPECS = (FamilySpec(
    name="linear",
    operands=(
        Operand("x", roles=VALUE, rank=2, doc="[T, K]"),
        Operand("weight", roles=("weight",), rank=2, doc="[N, K] (artifact format: BF16 or a quantized one)"),
        Operand("residual", roles=VALUE, rank=2, optional=True, doc="[T, N]; epilogue residual only"),
        Operand("out", io="out", roles=VALUE, rank=2, doc="[T, N] (swiglu: [T, N/2])"),
    ),
    attrs=(
        Attr("epilogue", (str,), "none",
             doc="none | residual (out = residual + xW^T) | swiglu (silu(gate) * up over [gate | up] rows); "
                 "part of the route match, and the launchers' `epilogue` argument"),
        Attr("merged", (list,), None, to_launcher=False,
             doc="names of the ops a fuse rule merged into this one (provenance only)"),
    ),
    t_operand="x", match=_match, check=_check,
    reference="ninfer_compile.kernels.linear.reference:linear",
    model_matches=_model_matches,
    doc="out = x @ weight^T (+ epilogue)",
),)
