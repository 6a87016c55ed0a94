"""Loading, finding, generating and writing model contracts.

YAML is read by the shared bounded reader (`ninfer_compile/yaml_lines.py`) so every field path has a
line number; pydantic errors
(whose `loc` is a field path) and the contract's own checks both report `file:line: field: why`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import yaml
from pydantic import ValidationError

from ..errors import ContractError
from ..yaml_lines import YamlInputError, nearest_line, parse_yaml_with_lines, read_yaml_text
from .schema import PART_NAMES, Contract, Path_, format_field_path

# graphs/ sits at the repository root, beside the package.
GRAPHS_DIR = Path(__file__).resolve().parents[2] / "graphs"
CONTRACT_SUFFIX = ".contract.yaml"


# --------------------------------------------------------------------------------------------
# YAML with line numbers
# --------------------------------------------------------------------------------------------


def _parse_yaml(text: str, source: str) -> tuple[Any, dict[Path_, int]]:
    """Data + line map through the shared bounded reader (`ninfer_compile/yaml_lines.py`: aliases,
    oversized files and too many nodes refused). Duplicate keys are an error (first one reported)."""
    try:
        doc = parse_yaml_with_lines(text, source)
    except YamlInputError as exc:
        kind = "YAML syntax" if exc.syntax else "YAML"
        raise ContractError(f"{source}:{exc.line}: {kind}: {exc.problem}") from None
    if doc.data is None:
        raise ContractError(f"{source}:1: the contract is empty")
    if doc.duplicates:
        line, path, first = doc.duplicates[0]
        raise ContractError(f"{source}:{line}: {format_field_path(path)}: duplicate key (first at line {first})")
    return doc.data, doc.lines


def _validation_message(exc: ValidationError, lines: dict[Path_, int], source: str) -> str:
    """The first error in file order as `file:line: field: message (+N more)`."""
    located = []
    for err in exc.errors():
        # pydantic adds markers such as '[key]' or union tags; keep the prefix that is a real
        # YAML path, which is what the user can find in the file.
        path: list = []
        for part in err["loc"]:
            if tuple(path + [part]) in lines:
                path.append(part)
            elif part == "[key]":
                continue
            else:
                # A missing required field: name it, locate its parent mapping.
                if err["type"] == "missing" and part == err["loc"][-1]:
                    path.append(part)
                break
        key = tuple(path)
        line = nearest_line(lines, key)
        message = err["msg"]
        if err["type"] == "value_error":  # our own validators: drop pydantic's prefix
            message = message.removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key (not allowed here)"
        elif err["type"] == "missing":
            message = "required field is missing"
        elif err["type"].startswith("literal_error") or err["type"] == "enum":
            message = f"{err['msg']}, got {err.get('input')!r}"
        located.append((line, format_field_path(key), message))
    located.sort(key=lambda item: item[0])
    line, field_path, message = located[0]
    more = f" (+{len(located) - 1} more)" if len(located) > 1 else ""
    return f"{source}:{line}: {field_path}: {message}{more}"


def parse_contract(text: str, source: str = "<contract>") -> Contract:
    """Validate contract YAML text. `source` names it in errors. Runs the full consistency
    check (a resolve with every optional part present) so a bad contract fails at load."""
    data, lines = _parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ContractError(f"{source}:1: a contract is a mapping (model_id, family, dims, ...)")
    try:
        contract = Contract.model_validate(data)
    except ValidationError as exc:
        raise ContractError(_validation_message(exc, lines, source)) from None
    contract.attach_source(source, lines)
    contract.resolve(present=PART_NAMES)
    return contract


def _graphs_path(model_id: str) -> Path:
    return GRAPHS_DIR / f"{model_id}.yaml"


def _looks_like_model_id(source: str) -> bool:
    return not source.endswith((".yaml", ".yml")) and os.sep not in source and "/" not in source


def load_contract(source: Union[str, Path]) -> Contract:
    """Load a contract from a YAML path, or by model id from `graphs/<model_id>.yaml`."""
    if isinstance(source, str) and _looks_like_model_id(source):
        path = _graphs_path(source)
        if not path.is_file():
            raise ContractError(f"no contract for model id {source!r}: {path} does not exist")
        contract = _load_file(path)
        if contract.model_id != source:
            raise ContractError(f"{path}:{contract._lines.get(('model_id',), 1)}: model_id: "
                                f"{contract.model_id!r} in a file named for {source!r}")
        return contract
    path = Path(source)
    if not path.is_file():
        raise ContractError(f"contract file {path} does not exist")
    return _load_file(path)


def _load_file(path: Path) -> Contract:
    try:
        text = read_yaml_text(path)
    except YamlInputError as exc:
        raise ContractError(f"{path}: contract refused: {exc.problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ContractError(f"{path}: cannot read contract: {exc}") from None
    return parse_contract(text, str(path))


def find_contract(artifact_path: Union[str, Path], model_id: str,
                  explicit: Optional[Union[str, Path]] = None) -> Contract:
    """The contract for an artifact: `explicit` (--contract) if given, else
    `graphs/<model_id>.yaml`, else `<artifact>.contract.yaml` beside the artifact."""
    if explicit is not None:
        return load_contract(Path(explicit))
    looked: list[str] = []
    if model_id and _looks_like_model_id(model_id) and not model_id.startswith("."):
        path = _graphs_path(model_id)
        looked.append(str(path))
        if path.is_file():
            return load_contract(model_id)
    beside = Path(str(artifact_path) + CONTRACT_SUFFIX)
    looked.append(str(beside))
    if beside.is_file():
        return load_contract(beside)
    raise ContractError(f"no contract for model id {model_id!r} (artifact {artifact_path}): looked for "
                        f"{' and '.join(looked)}; pass --contract FILE")


# --------------------------------------------------------------------------------------------
# Hugging Face configs -> dims/params/layer kinds
# --------------------------------------------------------------------------------------------

_HF_LAYER_KINDS = {"full_attention": "attention", "linear_attention": "gdn"}


def dims_from_hf_config(text_config: dict) -> tuple[dict[str, int], dict[str, Any], list[str]]:
    """Map a Hugging Face Qwen3.5 text config (a dict; a full config's `text_config` is used
    when present) onto contract dims, params and per-layer kinds ("attention" | "gdn"). A sparse
    MoE config (`num_experts`, family qwen3_5_moe) gives the expert dims instead of `intermediate`."""
    cfg = text_config.get("text_config", text_config) if isinstance(text_config, dict) else None
    if not isinstance(cfg, dict):
        raise ContractError("Hugging Face config: expected a mapping")
    if cfg.get("num_local_experts"):
        raise ContractError("Hugging Face config: num_local_experts is not a Qwen3.5 MoE field (num_experts)")
    moe = bool(cfg.get("num_experts"))

    def need(key: str) -> Any:
        if key not in cfg:
            raise ContractError(f"Hugging Face config: missing {key!r}")
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ContractError(f"Hugging Face config: {key!r} must be a positive integer, got {value!r}")
        return value

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    head_dim = cfg.get("head_dim") or hidden // heads
    # Newer configs group RoPE settings in rope_parameters; older ones use rope_scaling plus
    # top-level rope_theta / partial_rotary_factor.
    rope_cfg = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_theta = float(rope_cfg.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    factor = float(rope_cfg.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    rotary = head_dim * factor
    if abs(rotary - round(rotary)) > 1e-9:
        raise ContractError(f"Hugging Face config: head_dim {head_dim} × partial_rotary_factor {factor} "
                            "is not an integer rotary width")
    layers = need("num_hidden_layers")

    layer_types = cfg.get("layer_types")
    interval = cfg.get("full_attention_interval")
    if layer_types is not None:
        unknown = sorted({t for t in layer_types if t not in _HF_LAYER_KINDS})
        if unknown:
            raise ContractError(f"Hugging Face config: unsupported layer_types {unknown}")
        if len(layer_types) != layers:
            raise ContractError(f"Hugging Face config: {len(layer_types)} layer_types for {layers} layers")
        layer_kinds = [_HF_LAYER_KINDS[t] for t in layer_types]
    else:
        interval = interval or 4  # the transformers default for Qwen3.5
        layer_kinds = ["attention" if (l + 1) % interval == 0 else "gdn" for l in range(layers)]

    dims = {
        "vocab_rows": need("vocab_size"),
        "hidden": hidden,
        "layers": layers,
        **({} if moe else {"intermediate": need("intermediate_size")}),
        "attn_heads": heads,
        "kv_heads": need("num_key_value_heads"),
        "head_dim": head_dim,
        "rotary_dim": int(round(rotary)),
        "gdn_k_heads": need("linear_num_key_heads"),
        "gdn_k_dim": need("linear_key_head_dim"),
        "gdn_v_heads": need("linear_num_value_heads"),
        "gdn_v_dim": need("linear_value_head_dim"),
        "conv_kernel": need("linear_conv_kernel_dim"),
    }
    if moe:
        dims.update(experts=need("num_experts"), experts_per_token=need("num_experts_per_tok"),
                    expert_intermediate=need("moe_intermediate_size"),
                    shared_intermediate=need("shared_expert_intermediate_size"))
    regular = attention_interval(layer_kinds)
    if regular is not None:
        dims["full_attention_interval"] = regular
    mtp_layers = cfg.get("mtp_num_hidden_layers") or 0
    if mtp_layers:
        dims["mtp_layers"] = mtp_layers

    params: dict[str, Any] = {
        "rms_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": rope_theta,
        "partial_rotary_factor": factor,
        "token_ids": dims["vocab_rows"],  # the converter narrows this from the tokenizer
    }
    if rope_cfg.get("mrope_section") is not None:
        params["mrope_section"] = [int(x) for x in rope_cfg["mrope_section"]]
    if rope_cfg.get("mrope_interleaved") is not None:
        params["mrope_interleaved"] = bool(rope_cfg["mrope_interleaved"])
    if cfg.get("max_position_embeddings"):
        params["max_positions"] = int(cfg["max_position_embeddings"])
    return dims, params, layer_kinds


def attention_interval(layer_kinds: list[str]) -> Optional[int]:
    """N when layer l is attention exactly iff (l+1) % N == 0 (N <= layer count), else None."""
    for every in range(1, len(layer_kinds) + 1):
        if all((k == "attention") == ((l + 1) % every == 0) for l, k in enumerate(layer_kinds)):
            return every
    return None


# --------------------------------------------------------------------------------------------
# Rendering contracts for new model ids
# --------------------------------------------------------------------------------------------


class _ContractDumper(yaml.SafeDumper):
    """Block style for structure; one-line flow style for short scalar lists (shapes, row
    ranges) and for the small per-object mappings (tensor patterns, aliases, repeat), so a
    rendered contract reads like a hand-written one."""


_FLOW_LIMIT = 110  # characters; longer items stay in block style


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, (list, tuple, dict))


def _flow_length(data: Any) -> int:
    return len(yaml.dump(data, Dumper=yaml.SafeDumper, default_flow_style=True, width=10_000))


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(_is_scalar(x) for x in data) and _flow_length(list(data)) < _FLOW_LIMIT
    return dumper.represent_sequence("tag:yaml.org,2002:seq", list(data), flow_style=flow)


def _represent_dict(dumper: yaml.SafeDumper, data: dict) -> yaml.Node:
    small_record = bool({"name", "target", "index"} & set(data)) and all(
        _is_scalar(v) or (isinstance(v, (list, tuple)) and all(_is_scalar(x) for x in v))
        for v in data.values())
    flow = small_record and _flow_length(data) < _FLOW_LIMIT
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=flow)


_ContractDumper.add_representer(list, _represent_list)
_ContractDumper.add_representer(tuple, _represent_list)
_ContractDumper.add_representer(dict, _represent_dict)


def render_contract(base: Union[Contract, str], model_id: str, dims: dict[str, int],
                    params: dict[str, Any], formats_override: Optional[dict[str, str]] = None,
                    parts: Optional[dict[str, str]] = None,
                    layer_kinds: Optional[list[str]] = None) -> str:
    """YAML text of a contract with `base`'s structure (inventory, views, aliases, formats) and
    new dims/params (replaced wholesale), format overrides per role, part statuses (merged
    over the base's) and, when given, an explicit layer pattern. Sections, views, aliases and
    format roles that only serve parts now `absent` are dropped. The text is validated before
    it is returned and loads back to an identical contract."""
    base_contract = load_contract(base) if isinstance(base, str) else base
    data = base_contract.model_dump(mode="python", exclude_none=True)
    data["model_id"] = model_id
    data["dims"] = dict(dims)
    data["params"] = dict(params)
    if parts:
        unknown = set(parts) - set(PART_NAMES)
        if unknown:
            raise ContractError(f"render_contract: unknown part(s) {sorted(unknown)}")
        data["parts"] = {**data["parts"], **parts}
    absent = {p for p, s in data["parts"].items() if s == "absent"}

    if layer_kinds is not None:
        every = attention_interval(layer_kinds)
        if every is not None and data["dims"].get("full_attention_interval") == every:
            data["layers"] = {"count": "layers", "attention_every": "full_attention_interval"}
        elif every is not None:
            data["layers"] = {"count": "layers", "attention_every": every}
        else:
            data["layers"] = {"count": "layers", "kinds": list(layer_kinds)}

    # Drop what only absent parts use; keep the writer order of everything else.
    kept_sections = [s for s in data["inventory"] if s["part"] not in absent]
    absent_patterns: set[str] = set()
    for section in data["inventory"]:
        if section["part"] in absent:
            absent_patterns |= set(_section_names(section))
    data["inventory"] = kept_sections
    data["views"] = [v for v in data.get("views", []) if v["parent"] not in absent_patterns]
    data["aliases"] = [a for a in data.get("aliases", [])
                       if a["part"] not in absent and a["target"] not in absent_patterns]
    used_roles = {role for s in kept_sections for t in _section_tensors(s)
                  for role in [t["role"], *(t.get("layer_roles") or {})]}
    formats = {role: fmt for role, fmt in data["formats"].items() if role in used_roles}
    for role, fmt in (formats_override or {}).items():
        if role not in used_roles:
            raise ContractError(f"render_contract: format override for unknown role {role!r} "
                                f"(roles: {', '.join(sorted(used_roles))})")
        formats[role] = fmt
    data["formats"] = formats
    if not data["views"]:
        data.pop("views")
    if not data["aliases"]:
        data.pop("aliases")

    ordered = {key: data[key] for key in ("model_id", "family", "dims", "params", "layers", "parts",
                                          "formats", "inventory", "views", "aliases") if key in data}
    header = (f"# Model contract for {model_id}, rendered by ninfer-compile from the structure of "
              f"{base_contract.model_id}.\n# Same object inventory and names; dimensions, parts and "
              "formats as below.\n")
    text = header + yaml.dump(ordered, Dumper=_ContractDumper, sort_keys=False, width=10_000,
                              default_flow_style=False, allow_unicode=True)
    rendered = parse_contract(text, f"<rendered contract {model_id}>")
    # The rendered file must mean exactly what was asked for.
    expected = Contract.model_validate(ordered)
    if rendered.model_dump() != expected.model_dump():  # pragma: no cover - a dumper bug
        raise ContractError(f"render_contract: {model_id}: rendered YAML does not load back identically")
    return text


def _section_tensors(section: dict) -> Iterable[dict]:
    if section.get("tensors"):
        yield from section["tensors"]
    if section.get("per_layer"):
        for group in section["per_layer"].values():
            yield from group


def _section_names(section: dict) -> Iterable[str]:
    yield from section.get("resources") or ()
    for tensor in _section_tensors(section):
        yield tensor["name"]


def write_contract(path: Union[str, Path], base: Union[Contract, str], model_id: str,
                   dims: dict[str, int], params: dict[str, Any],
                   formats_override: Optional[dict[str, str]] = None,
                   parts: Optional[dict[str, str]] = None,
                   layer_kinds: Optional[list[str]] = None) -> Contract:
    """Render a contract (see `render_contract`) and write it atomically to `path`
    (conventionally `<artifact>.contract.yaml`); returns the contract loaded from the file."""
    text = render_contract(base, model_id, dims, params, formats_override, parts, layer_kinds)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise ContractError(f"{path}: cannot write contract: {exc}") from None
    return load_contract(path)
