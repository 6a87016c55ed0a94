"""Hugging Face Qwen3.5/3.6 checkpoint → `.ninfer`: contracts for new checkpoints and the packer.

- `mapping.py`: config geometry (`TextGeometry`) and the source → NInfer tensor mapping
  (`ObjectRecipe`s, `ninfer_tensors`, `convert_state_dict`; the transforms are documented there);
- `checkpoint.py`: lazy checkpoint reading (`HFCheckpoint`), tokenizer ids, the draft-head id map;
- here: the numeric recipes, `build_contract` (a contract for a model id not in graphs/),
  `encode_object` and the streaming packer `pack_hf`.

The names of mapping.py and checkpoint.py are re-exported, so `from ninfer_compile.convert.hf import
X` keeps working for every public name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..errors import ConvertError
from .checkpoint import (  # noqa: F401  (re-exported)
    ARCHITECTURES,
    FRONTEND_FILES,
    MODEL_TYPES,
    HFCheckpoint,
    draft_token_ids_from_ranking,
    tokenizer_ids,
)
from .mapping import (  # noqa: F401  (re-exported)
    ObjectRecipe,
    TextGeometry,
    Transform,
    _cfg,
    check_sources,
    convert_state_dict,
    mtp_recipes,
    ninfer_tensors,
    text_geometry,
    text_part,
    text_prefix,
    text_recipes,
    vision_recipes,
)


# ----------------------------------------------------------------------------------------------
# recipes (numeric formats per role) and contracts for new checkpoints

RECIPES = ("default", "bf16")
BASE_CONTRACT = "qwen3.6-27b"  # structure (inventory, views, aliases) and the `default` formats
MOE_BASE_CONTRACT = "qwen3.6-35b-a3b"  # the same for sparse-MoE (`qwen3_5_moe`) checkpoints


def base_contract_id(geometry: TextGeometry) -> str:
    """The registered contract whose structure a new checkpoint's contract takes."""
    return MOE_BASE_CONTRACT if geometry.experts else BASE_CONTRACT


def default_model_id(geometry: TextGeometry, recipe: str = "default") -> str:
    """`hf-qwen3_5-<hidden>x<layers>` (`hf-qwen3_5_moe-...` for sparse MoE), with `-<recipe>` for a
    non-default recipe."""
    family = "qwen3_5_moe" if geometry.experts else "qwen3_5"
    base = f"hf-{family}-{geometry.hidden}x{geometry.layers}"
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
    """The base contract with its frontend resource list narrowed to the files present, and without
    its per-layer role exceptions (they pick layers of that one checkpoint, e.g. the 35B-A3B's
    higher-precision routed-down layers; a new checkpoint gets the role's format on every layer)."""
    from ..contracts import Contract
    data = base.model_dump(mode="python", exclude_none=True)
    keep = {f"frontend/{f}" for f in present_files}
    inventory = []
    for section in data["inventory"]:
        if section.get("resources") is not None:
            section = {**section, "resources": [r for r in section["resources"] if r in keep]}
            if not section["resources"]:
                continue
        for group in (section.get("per_layer") or {}).values():
            for tensor in group:
                tensor.pop("layer_roles", None)
        inventory.append(section)
    data["formats"] = {role: fmt for role, fmt in data["formats"].items()
                       if any(t["role"] == role for s in inventory for t in _tensors_of(s))}
    data["inventory"] = inventory
    return Contract.model_validate(data)


def _tensors_of(section: dict):
    yield from section.get("tensors") or ()
    for group in (section.get("per_layer") or {}).values():
        yield from group


def build_contract(ckpt: HFCheckpoint, *, model_id: str, recipe: str, draft_rows: int | None,
                   with_draft: bool):
    """(contract, yaml text) for a checkpoint whose model id is not in graphs/: the structure of
    qwen3.6-27b (qwen3.6-35b-a3b for sparse MoE) with this checkpoint's dims/params/layer pattern,
    the recipe's formats, and the parts the checkpoint actually has (MTP if `mtp.*`, vision if
    `model.visual.*`, the frontend files present, the draft head only with a ranking; never the
    DFlash drafters, which come from separate checkpoints)."""
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
    base = load_contract(base_contract_id(ckpt.geometry))
    for part in base.part_status():
        parts.setdefault(part, "absent")
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


class _Sources:
    """Source tensors of one pack: the checkpoint's, and the DFlash companion's under `dflash:`."""

    def __init__(self, ckpt, dflash):
        from .mapping_dflash import PREFIX
        self.ckpt, self.dflash, self.prefix = ckpt, dflash, PREFIX
        self.names = set(ckpt.names) | ({PREFIX + n for n in dflash.names} if dflash else set())

    def _of(self, name: str):
        if name.startswith(self.prefix) and self.dflash is not None:
            return self.dflash, name[len(self.prefix):]
        return self.ckpt, name

    def get(self, name: str):
        src, n = self._of(name)
        return src.get(n)

    def shape(self, name: str):
        src, n = self._of(name)
        return src.shape(n)

    def dtype(self, name: str):
        src, n = self._of(name)
        return src.dtype(n)


def pack_hf(hf_dir, out, *, recipe: str | None = None, model_id: str | None = None, contract_file=None,
            draft_ranking=None, draft_rows: int | None = None, dflash_dir=None,
            progress: bool = True) -> PackResult:
    """Convert a Hugging Face Qwen3.5/3.6 checkpoint (plus, for a contract with the dflash part,
    the DFlash companion's safetensors directory `dflash_dir`) to `out` (.ninfer), streaming one
    object at a time. See `ninfer-compile pack --help` for the contract rules."""
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
    if status.get("dflash") == "optional" and dflash_dir is not None:
        present.append("dflash")
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
    if spec.parts.get("dflash") and dflash_dir is None:
        raise ConvertError(f"{model_id}: the contract requires the DFlash drafter (dflash/*), which comes "
                           f"from its own checkpoint; pass --dflash DIR (its safetensors directory)")
    if dflash_dir is not None and not spec.parts.get("dflash"):
        raise ConvertError(f"--dflash: contract {model_id} has no dflash part")
    from .checkpoint import SafetensorsDir
    from .mapping_dflash import dflash_recipes
    src = _Sources(ckpt, SafetensorsDir(dflash_dir) if dflash_dir is not None else None)

    recipes = text_recipes(ckpt.text_config, ckpt.names, include_mtp=bool(spec.parts.get("mtp")),
                           draft_token_ids=draft_ids, where=ckpt.config_where)
    if spec.parts.get("vision"):
        recipes += vision_recipes(ckpt.names)
    if spec.parts.get("dflash"):
        recipes += dflash_recipes(src.names)
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
        check_sources([r], src.names, where=f"{dflash_dir} (DFlash)" if r.part == "dflash" else where)
        shapes = {s: src.shape(s) for s in r.sources}
        shape = r.meta_shape(shapes, {s: src.dtype(s) for s in r.sources}) if r.sources else \
            tuple(r.build(src.get).shape)
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
                    tensor = by_name[ws.name].build(src.get)
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
