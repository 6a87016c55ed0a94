"""Model contracts: the YAML schema (pydantic) and the `Contract` model.

A contract (`graphs/<model_id>.yaml`) says what the objects of an artifact *mean*: dimensions,
which text layers are full attention and which are Gated DeltaNet, the object inventory as name
patterns with shapes written over the dimensions, fused row views, aliases, and the format of
every role. `Contract.resolve()` turns it into a concrete, frozen `ModelSpec`.

Split by seam: `vocab.py` (closed vocabularies, family rules), `expr.py` (the shape-expression
language), `resolve.py` (`ModelSpec` and the resolution the `Contract` model inherits), here the
pydantic models. Every name of those modules is importable from here as before.

Errors name `file:line` and the field path. pydantic validates types and forbids unknown keys
(the loader maps pydantic's `loc` to YAML lines); everything that needs more than one field —
unknown dimension names, placeholders, view bounds, format/rank rules, family invariants — is
checked here with the same location scheme, so a contract is either fully valid or rejected
with one precise line.
"""

from __future__ import annotations

from typing import Annotated, Iterable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, PrivateAttr, StrictBool

from ..errors import ContractError
from ..yaml_lines import format_path, nearest_line
from .expr import ExpressionError, ShapeExpr, as_expr, parse_expr, validate_expr  # noqa: F401  (re-exported)
from .resolve import ContractResolver, ExpectedObject, ExpertBank, ModelSpec, Path_, RowView  # noqa: F401  (re-exported)
from .vocab import (  # noqa: F401  (re-exported)
    DIRECT_LAYOUT,
    FAMILIES,
    FORMAT_LAYOUTS,
    IDENTIFIER_PATTERN,
    LAYER_KINDS,
    MODEL_ID_PATTERN,
    PART_NAMES,
    RESOURCE_ENCODING,
    ROW_SPLIT_LAYOUT,
    FamilyRules,
    FormatName,
    LayerKind,
    PartName,
    PartStatus,
)

_validate_expr, _as_expr = validate_expr, as_expr  # the names they had here

# An integer or an expression over dimension names; stored as written so rendering round-trips.
Expr = Annotated[Union[int, str], PlainValidator(validate_expr)]
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Identifier = Annotated[str, Field(pattern=IDENTIFIER_PATTERN)]


# --------------------------------------------------------------------------------------------
# The YAML schema
# --------------------------------------------------------------------------------------------


class StrictModel(BaseModel):
    """Base of every contract node: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Params(StrictModel):
    """Scalar hyper-parameters the math needs (not shapes)."""

    rms_eps: PositiveFloat = Field(description="RMSNorm epsilon of the text model")
    rope_theta: PositiveFloat = Field(description="RoPE base of the text attention")
    partial_rotary_factor: Optional[PositiveFloat] = Field(
        None, description="rotary_dim/head_dim; derived from the dims when omitted")
    mrope_section: Optional[list[Annotated[int, Field(strict=True, ge=0)]]] = Field(
        None, description="frequencies per (temporal, height, width) MRoPE axis; None = 1-D RoPE")
    mrope_interleaved: StrictBool = Field(False, description="MRoPE axes interleaved per frequency")
    token_ids: PositiveInt = Field(description="tokenizer-addressable ids 0..token_ids-1 (<= vocab_rows)")
    max_positions: Optional[PositiveInt] = Field(None, description="native context capacity")
    vision_rope_theta: Optional[PositiveFloat] = Field(None, description="RoPE base of the vision tower")
    dflash_target_layers: Optional[list[Annotated[int, Field(strict=True, ge=0)]]] = Field(
        None, description="text layers whose outputs feed the DFlash/DFlash2 feature projection, in order")
    dflash_mask_row: Optional[Annotated[int, Field(strict=True, ge=0)]] = Field(
        None, description="embedding row the DFlash/DFlash2 drafter uses as its mask token")


class LayerPattern(StrictModel):
    """Which text layers are full attention. Either `attention_every: N` (layer l is attention
    iff (l+1) % N == 0, the Qwen3.5 rule) or an explicit `kinds` list of length `count`."""

    count: Expr = Field(description="number of text layers (usually the dim name `layers`)")
    attention_every: Optional[Expr] = None
    kinds: Optional[list[LayerKind]] = None


class Parts(StrictModel):
    """Per model component: `required`, `absent`, or `optional` (all of its objects or none).
    The drafter companions (`dflash`, `dflash2`) exist only in contracts that name them."""

    text: PartStatus
    mtp: PartStatus
    draft_head: PartStatus
    vision: PartStatus
    frontend: PartStatus
    dflash: Optional[PartStatus] = None
    dflash2: Optional[PartStatus] = None


class TensorPattern(StrictModel):
    """One tensor object; inside a repeating section, one per index (name holds `{l}`/`{b}`)."""

    name: str = Field(min_length=1)
    shape: list[Expr] = Field(min_length=1, description="expressions over the dims, [N, K] for matrices")
    role: Identifier = Field(description="key into `formats`; groups tensors that share a format")
    layer_roles: Optional[dict[Identifier, list[Annotated[int, Field(strict=True, ge=0)]]]] = Field(
        None, description="per_layer sections only: role -> the text layers whose object takes that "
                          "role (and its format) instead of `role`")


class PerLayerGroups(StrictModel):
    """The objects of one text layer, by the layer's kind, in writer order."""

    attention: list[TensorPattern]
    gdn: list[TensorPattern]


class Repeat(StrictModel):
    """Repeat a section's tensors for index = 0 .. count-1 (e.g. the vision blocks)."""

    index: Identifier
    count: Expr


class Section(StrictModel):
    """A run of consecutive objects of one part in writer order: `resources`, plain `tensors`,
    `tensors` with `repeat`, or `per_layer` (every text layer, its group chosen by layer kind)."""

    part: PartName
    resources: Optional[list[Annotated[str, Field(min_length=1)]]] = None
    tensors: Optional[list[TensorPattern]] = None
    repeat: Optional[Repeat] = None
    per_layer: Optional[PerLayerGroups] = None


class ViewGroup(StrictModel):
    """Fused row views of one parent: role -> [begin, end) row range (expressions). The views of
    a parent must tile its rows exactly, so a wrong dim cannot silently drop or share rows.

    With `experts: E` the parent is an expert bank: E equal blocks of rows, expert e's block
    first at row e*(rows/E); `rows` then tile one block (rows relative to its start), so row r of
    role p of expert e is stored at e*(rows/E) + begin(p) + r."""

    parent: str = Field(min_length=1)
    rows: dict[Identifier, tuple[Expr, Expr]] = Field(min_length=1)
    experts: Optional[Expr] = Field(None, description="number of expert blocks of an expert bank")


class Alias(StrictModel):
    """A logical consumer role served by another stored object (e.g. the MTP embedding)."""

    role: str = Field(min_length=1)
    target: str = Field(min_length=1)
    part: PartName = Field(description="the consuming part; the alias exists only when it is present")


# --------------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------------


def format_field_path(path: Iterable[Union[str, int]]) -> str:
    """('inventory', 3, 'tensors', 0, 'shape', 1) -> 'inventory[3].tensors[0].shape[1]'."""
    return format_path(path, top="<top>")


class Contract(ContractResolver, StrictModel):
    """One model contract file. Load with `load_contract`; make concrete with `resolve()`."""

    model_id: str = Field(pattern=MODEL_ID_PATTERN)
    family: Literal["qwen3_5_hybrid", "qwen3_5_moe"]
    dims: dict[Identifier, PositiveInt]
    params: Params
    layers: LayerPattern
    parts: Parts
    formats: dict[Identifier, FormatName]
    inventory: list[Section] = Field(min_length=1)
    views: list[ViewGroup] = Field(default_factory=list)
    aliases: list[Alias] = Field(default_factory=list)

    # Where the contract came from, and YAML line of every field path (filled by the loader).
    _source: Optional[str] = PrivateAttr(default=None)
    _lines: dict[Path_, int] = PrivateAttr(default_factory=dict)

    # ---- locations -------------------------------------------------------------------------

    @property
    def source(self) -> Optional[str]:
        """The file this contract was loaded from (None when built in memory)."""
        return self._source

    def attach_source(self, source: Optional[str], lines: dict[Path_, int]) -> "Contract":
        self._source = source
        self._lines = dict(lines)
        return self

    def locate(self, path: Path_) -> str:
        """'file:line' of a field path: the deepest prefix of `path` the YAML had a line for."""
        name = self._source or f"<contract {self.model_id}>"
        line = nearest_line(self._lines, path, None)
        return name if line is None else f"{name}:{line}"

    def error(self, path: Path_, message: str) -> ContractError:
        return ContractError(f"{self.locate(path)}: {format_field_path(path)}: {message}")

    # evaluation, validation and resolution (resolve, resolve_for, part_status): resolve.py
