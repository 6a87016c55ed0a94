"""Synthetic artifacts: a contract's exact inventory with random but valid payloads.

Speed does not depend on weight values, so benchmark artifacts (the full `qwen3.6-27b` inventory,
~17 GB) are generated directly in encoded byte form, a chunk of rows at a time, never holding more
than one chunk (~64 MB) of payload. Every payload is a function of (seed, object index) only, so
the same seed gives the same bytes.

Validity (tensor-formats.md §5-6, storage-layouts.md §3):
- grouped formats: random base/high bytes; lanes at columns >= K (the partial group's tail and
  wholly physical groups) are zero-code; W8 never has byte 0x80 (-128); scales are random small
  positive binary16 normals for logical groups and +0 for wholly physical groups; plane gaps zero;
- BF16/FP32 direct tensors: finite values with role-appropriate magnitudes (zero-centred norms
  small, gated/LayerNorm weights near 1, a_log = log(uniform[1,16]), dt_bias in [0,1]);
- I32 (draft-head token ids): unique ids in the tokenizer-addressable range;
- resources: small placeholder bytes (valid JSON where the name ends in .json).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..artifact.formats import FORMATS, GROUPED_FORMATS, RowSplitGeometry, row_split_geometry
from ..errors import ConvertError

CHUNK_BYTES = 64 << 20

_GROUPED = GROUPED_FORMATS  # row-split formats; their geometry is artifact/formats.py's
_DIRECT = {"BF16": 2, "FP32": 4, "I32": 4}
# small positive binary16 normals: exponent field 4..8 → [2^-11, 2^-6)
_SCALE_LO, _SCALE_HI = 0x1000, 0x2400


def _geometry(fmt: str, shape) -> RowSplitGeometry:
    if len(shape) != 2 or shape[0] <= 0 or shape[1] <= 0:
        raise ConvertError(f"{fmt}: row-split tensors must be positive [N,K], got {list(shape)}")
    return row_split_geometry(fmt, int(shape[0]), int(shape[1]))


def _row_chunks(n: int, row_bytes: int) -> Iterator[tuple[int, int]]:
    step = max(1, CHUNK_BYTES // max(1, row_bytes))
    for r in range(0, n, step):
        yield r, min(n, r + step)


def _bytes_of(a: np.ndarray) -> memoryview:
    """A zero-copy flat byte view of a C-contiguous array."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).data


def _zeros(n: int) -> Iterator[bytes | memoryview]:
    while n > 0:
        m = min(n, CHUNK_BYTES)
        yield bytes(m)
        n -= m


def _random_u8(rng, rows: int, width: int) -> np.ndarray:
    """Uniform random bytes [rows, width] (width a multiple of 8), drawn as full-range uint64
    words: several times faster than drawing uint8 directly."""
    words = rng.integers(0, np.iinfo(np.uint64).max, size=(rows, width // 8), dtype=np.uint64, endpoint=True)
    return words.view(np.uint8)


def _base_rows(rng, geo: RowSplitGeometry, rows: int) -> np.ndarray:
    a = _random_u8(rng, rows, geo.base_row_bytes)
    if FORMATS[geo.format].bits == 8:
        a[a == 0x80] = 0  # -128 is outside W8's code language
        a[:, geo.k:] = 0
    else:
        full = geo.k // 2
        if geo.k % 2:
            a[:, full] &= 0x0F  # odd K: the last logical lane is the low nibble
            full += 1
        a[:, full:] = 0
    return a


def _high_rows(rng, geo: RowSplitGeometry, rows: int) -> np.ndarray:
    a = _random_u8(rng, rows, geo.high_row_bytes)
    hb = FORMATS[geo.format].bits - 4
    used_bits = geo.k * hb  # lane-major bit stream within a row
    full = used_bits // 8
    if used_bits % 8:
        a[:, full] &= (1 << (used_bits % 8)) - 1
        full += 1
    a[:, full:] = 0
    return a


def _scale_rows(rng, geo: RowSplitGeometry, rows: int) -> np.ndarray:
    s = np.zeros((rows, geo.groups_per_row), dtype="<u2")
    s[:, :geo.logical_groups] = rng.integers(_SCALE_LO, _SCALE_HI, size=(rows, geo.logical_groups),
                                             dtype=np.uint16)
    return s.view(np.uint8)


def grouped_chunks(fmt: str, shape, rng) -> Iterator[bytes | memoryview]:
    """The complete row-split-k128-v1 payload of a random valid tensor, in chunks."""
    geo = _geometry(fmt, shape)
    for r0, r1 in _row_chunks(geo.n, geo.base_row_bytes):
        yield _bytes_of(_base_rows(rng, geo, r1 - r0))
    yield from _zeros(geo.high_offset - geo.base_bytes)
    if geo.high_bytes:
        for r0, r1 in _row_chunks(geo.n, geo.high_row_bytes):
            yield _bytes_of(_high_rows(rng, geo, r1 - r0))
    yield from _zeros(geo.scale_offset - geo.high_offset - geo.high_bytes)
    for r0, r1 in _row_chunks(geo.n, geo.scale_row_bytes):
        yield _bytes_of(_scale_rows(rng, geo, r1 - r0))


def _direct_kind(name: str, role: str | None) -> str:
    """Value family of a direct tensor, from its role (when the contract gives one) or its name."""
    key = f"{role or ''} {name}"
    leaf = name.rsplit("/", 1)[-1]
    if "a_log" in key:
        return "a_log"
    if "dt_bias" in key:
        return "dt_bias"
    if name.startswith("vision/") and ("norm" in name) and leaf == "weight":
        return "one"  # LayerNorm weight
    if name.endswith("gdn/norm"):
        return "one"  # gated RMSNorm multiplies by w directly
    if "norm" in leaf or leaf.endswith("bias"):
        return "small"  # zero-centred RMSNorm (1+w) and biases
    return "weight"


def direct_chunks(fmt: str, shape, rng, *, name: str = "", role: str | None = None,
                  token_count: int | None = None) -> Iterator[bytes | memoryview]:
    n = 1
    for d in shape:
        n *= int(d)
    if fmt == "I32":
        hi = int(token_count or (shape[0] if shape else 1))
        if n > hi:
            raise ConvertError(f"{name}: {n} unique ids do not fit in the token range 0..{hi - 1}")
        ids = rng.choice(hi, size=n, replace=False).astype("<i4")
        yield _bytes_of(ids)
        return
    kind = _direct_kind(name, role)
    per = max(1, CHUNK_BYTES // 4)
    done = 0
    while done < n:
        m = min(per, n - done)
        if kind == "a_log":
            x = np.log(rng.uniform(1.0, 16.0, size=m)).astype(np.float32)
        elif kind == "dt_bias":
            x = rng.uniform(0.0, 1.0, size=m).astype(np.float32)
        elif kind == "one":
            x = (1.0 + 0.05 * rng.standard_normal(m, dtype=np.float32)).astype(np.float32)
        elif kind == "small":
            x = 0.05 * rng.standard_normal(m, dtype=np.float32)
        else:
            x = 0.02 * rng.standard_normal(m, dtype=np.float32)
        if fmt == "FP32":
            yield _bytes_of(x.astype("<f4"))
        elif fmt == "BF16":
            yield _bytes_of((x.view(np.uint32) >> 16).astype("<u2"))  # truncation: finite stays finite
        else:
            raise ConvertError(f"{name}: unknown direct format {fmt!r}")
        done += m


def resource_bytes(name: str, *, token_count: int = 2) -> bytes:
    """Small placeholder bytes for a frontend resource (valid JSON for *.json)."""
    leaf = name.rsplit("/", 1)[-1]
    eos = [max(0, token_count - 1)]
    if leaf == "generation_config.json":
        obj = {"eos_token_id": eos, "do_sample": False}
    elif leaf == "tokenizer.json":
        # a real (tiny) tokenizer that `tokenizers` loads: a byte-level word model over a few tokens
        from tokenizers import Tokenizer, models, pre_tokenizers

        vocab = {"<unk>": 0, "<|endoftext|>": 1, "<|im_start|>": 2, "<|im_end|>": 3, "synthetic": 4}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        return tok.to_str().encode() + b"\n"
    elif leaf == "tokenizer_config.json":
        obj = {"synthetic": True, "added_tokens_decoder": {}, "eos_token": None}
    elif leaf.endswith(".json"):
        obj = {"synthetic": True}
    elif leaf.endswith(".jinja"):
        return (b"{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
                b"{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
    else:
        return b"synthetic\n"
    return json.dumps(obj, sort_keys=True).encode() + b"\n"


def object_chunks(index: int, obj, seed: int, *, token_count: int) -> Iterator[bytes | memoryview]:
    """Payload chunks of contract object number `index` (an ExpectedObject)."""
    rng = np.random.Generator(np.random.SFC64([int(seed), int(index)]))
    if obj.kind == "resource":
        yield resource_bytes(obj.name, token_count=token_count)
    elif obj.format in _GROUPED:
        yield from grouped_chunks(obj.format, obj.shape, rng)
    elif obj.format in _DIRECT:
        yield from direct_chunks(obj.format, obj.shape, rng, name=obj.name, role=getattr(obj, "role", None),
                                 token_count=token_count)
    else:
        raise ConvertError(f"{obj.name}: unknown format {obj.format!r}")


# ----------------------------------------------------------------------------------------------
# pack --synthetic

@dataclass
class SyntheticResult:
    path: str
    model_id: str
    contract_path: str | None
    objects: int
    file_size: int
    sparse: bool


def pack_synthetic(model_id: str, out, *, seed: int = 0, contract_file=None, sparse: bool = False,
                   progress: bool = True) -> SyntheticResult:
    """Write the contract's exact inventory (every optional part included) with random valid
    payloads (or, `sparse`, only the header over a hole). Deterministic per seed."""
    import os
    import sys
    from pathlib import Path

    from tqdm import tqdm

    from ..artifact import ArtifactWriter, ResourceSpec, TensorSpec
    from ..contracts import CONTRACT_SUFFIX, GRAPHS_DIR, PART_NAMES, load_contract
    from ..errors import ArtifactError

    out = Path(out)
    if contract_file is not None:
        contract = load_contract(Path(contract_file))
        if model_id and model_id != contract.model_id:
            raise ConvertError(f"--synthetic {model_id}: the contract {contract_file} is for "
                               f"{contract.model_id!r}")
    else:
        contract = load_contract(model_id)
    model_id = contract.model_id
    spec = contract.resolve(present=PART_NAMES)
    token_count = int(spec.params.get("token_ids") or spec.dims.get("vocab_rows") or 2)

    specs = []
    resources: dict[str, bytes] = {}
    for name, obj in spec.objects.items():
        if obj.kind == "resource":
            resources[name] = resource_bytes(name, token_count=token_count)
            specs.append(ResourceSpec(name, len(resources[name])))
        else:
            specs.append(TensorSpec(name, obj.shape, obj.format))
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        writer = ArtifactWriter(out, model_id, specs)
        if sparse:
            writer.write_sparse()
        else:
            bar = tqdm(total=writer.plan.file_size, unit="B", unit_scale=True, unit_divisor=1024,
                       desc=f"synthesize {out.name}", file=sys.stderr, disable=not progress,
                       dynamic_ncols=True, leave=False)
            # Each payload is streamed chunk by chunk (~64 MB): memory stays flat whatever the size.
            with writer, bar:
                for index, (name, obj) in enumerate(spec.objects.items()):
                    if obj.kind == "resource":
                        writer.write(name, resources[name])
                        bar.update(len(resources[name]))
                        continue

                    def counted(chunks):
                        for chunk in chunks:
                            bar.update(len(chunk))
                            yield chunk
                    writer.write_chunks(name, counted(object_chunks(index, obj, seed, token_count=token_count)))
        contract_path = None
        if not (GRAPHS_DIR / f"{model_id}.yaml").is_file() and contract.source and os.path.isfile(contract.source):
            contract_path = Path(str(out) + CONTRACT_SUFFIX)
            if Path(contract.source).resolve() != contract_path.resolve():
                tmp = contract_path.with_name(contract_path.name + ".tmp")
                try:
                    tmp.write_bytes(Path(contract.source).read_bytes())
                    tmp.replace(contract_path)
                except BaseException:  # an interrupt included: no temp file left behind
                    tmp.unlink(missing_ok=True)
                    raise
    except ArtifactError as exc:
        raise ConvertError(str(exc)) from None
    except OSError as exc:
        raise ConvertError(f"{out}: cannot write: {exc.strerror or exc}") from None
    return SyntheticResult(str(out), model_id, str(contract_path) if contract_path else None, len(specs),
                           writer.plan.file_size, sparse)
