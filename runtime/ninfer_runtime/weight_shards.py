"""A `--tp N` rank's weight shards (the shard pass, ninfer_compile/passes/shard_tensor_parallel.py,
names them in the plan's bindings: `shard` rows / cols of an object).

- `weight_refs(plan)`: the objects the plan references whole and the (object, shard key) copies.
- `shard_copy(name, fmt, shape, raw, key, direct, geometry)`: a rank's copy of an object, made at
  upload from the artifact's bytes: the row ranges of every plane (direct formats: rows, then
  columns); a row-split format's column range on whole scale groups is each plane row's byte range
  of those groups, zero groups padding K to 128 (the layout's `row-split-k128-v1` alignment).
- `upload_shards(engine, direct, grouped)`: every copy the engine's plan references, uploaded.
"""

from __future__ import annotations

from typing import Any, Callable

from .errors import PlanError

# torch is imported where a copy is made: `weight_refs` runs before torch is imported (weight_stream.prestart)


def weight_refs(plan: dict) -> tuple[list[str], set[tuple]]:
    """(objects referenced whole, {(object, shard key)} a --tp rank copies), over the plan's launches."""
    whole, shards = set(), set()
    for x in plan["extents"].values():
        for L in x["launches"]:
            for ref in list((L.get("args") or {}).values()) + list((L.get("outs") or {}).values()):
                if "weight" in ref:
                    k = shard_key(ref)
                    (whole.add(ref["weight"]) if k is None else shards.add((ref["weight"], k)))
    return sorted(whole), shards


def shard_nbytes(fmt: str, shape: tuple[int, ...], key: tuple, direct: dict, geometry) -> tuple[tuple, int]:
    """(shape, bytes) of a rank's copy, without reading the payload."""
    new = shard_shape(shape, key)
    if fmt in direct:
        n = direct[fmt].itemsize
        for d in new:
            n *= d
        return new, n
    return new, int(geometry(fmt, new[0], new[1]).total)


def upload_shards(engine, direct: dict, grouped) -> dict[tuple, Any]:
    """A --tp rank's copies of objects (`engine._shard_refs`: rows / columns of its shard), made from
    the artifact's mmap at upload through the engine's backend; adds their bytes to weight_bytes."""
    import sys
    from types import SimpleNamespace

    import torch

    from .errors import PlanMismatch

    out: dict[tuple, Any] = {}
    geometry = None
    for name, key in sorted(engine._shard_refs, key=repr):
        e = engine.artifact.objects.get(name)
        if e is None or e.kind != "tensor":
            raise PlanMismatch(f"plan references object {name!r}, absent from artifact {engine.artifact.path.name}")
        if e.format in grouped and geometry is None:
            geometry = sys.modules[engine.quant_weight_cls().__module__].row_split_geometry
        shape, nbytes = shard_nbytes(e.format, tuple(e.shape), key, direct, geometry)
        dev = engine.backend.upload(lambda e=e, key=key: shard_copy(
            e.name, e.format, tuple(e.shape), torch.frombuffer(engine.artifact.span(e.name), dtype=torch.uint8),
            key, direct, geometry)[1], nbytes)
        out[(name, key)] = engine._bind_object(SimpleNamespace(name=name, format=e.format, shape=shape, bytes=nbytes), dev)
        engine.weight_bytes += nbytes
    return out


def shard_key(ref: dict) -> tuple | None:
    s = ref.get("shard")
    if not s:
        return None
    return (tuple(tuple(r) for r in s.get("rows") or ()) or None, tuple(tuple(c) for c in s.get("cols") or ()) or None)


def shard_shape(shape: tuple[int, ...], key: tuple) -> tuple[int, ...]:
    rows, cols = key
    n = shape[0] if rows is None else sum(c for _, c in rows)
    rest = tuple(shape[1:])
    if cols is not None:
        rest = (sum(c for _, c in cols), *rest[1:])
    return (n, *rest)


def _check_ranges(name: str, what: str, ranges, n: int) -> None:
    for b, c in ranges or ():
        if b < 0 or c < 1 or b + c > n:
            raise PlanError(f"weight {name}: shard {what} [{b},{b + c}) outside its {n} {what}")


def shard_copy(name: str, fmt: str, shape: tuple[int, ...], raw: torch.Tensor, key: tuple, direct: dict,
               geometry: Callable | None = None) -> tuple[tuple[int, ...], torch.Tensor]:
    """(shape, uint8 bytes) of a rank's copy of one object. `raw`: the object's payload (uint8);
    `direct`: format -> torch dtype of the direct formats; `geometry(format, n, k)`: the row-split
    plane geometry (grouped formats)."""
    import torch

    rows, cols = key
    _check_ranges(name, "rows", rows, shape[0])
    _check_ranges(name, "columns", cols, shape[1] if len(shape) > 1 else 0)
    if fmt in direct:
        t = raw.view(direct[fmt]).view(list(shape))
        if rows is not None:
            t = torch.cat([t[b:b + c] for b, c in rows], 0)
        if cols is not None:
            t = torch.cat([t[:, b:b + c] for b, c in cols], 1)
        return tuple(t.shape), t.contiguous().view(-1).view(torch.uint8)
    if geometry is None or len(shape) != 2:
        raise PlanError(f"weight {name}: cannot shard {fmt} {list(shape)}")
    g = geometry(fmt, int(shape[0]), int(shape[1]))
    planes = [("base", g.base_offset, g.base_row_bytes), ("high", g.high_offset, g.high_row_bytes),
              ("scale", g.scale_offset, g.scale_row_bytes)]
    new_shape = shard_shape(tuple(shape), key)
    ng = geometry(fmt, new_shape[0], new_shape[1])
    out = torch.zeros(ng.total, dtype=torch.uint8)
    if cols is not None:
        if len(cols) != 1 or cols[0][0] % g.group or cols[0][1] % g.group:
            raise PlanError(f"weight {name}: {fmt} column shard {list(cols)} is not one range of whole {g.group}-column "
                            f"scale groups")
        g0, gc = cols[0][0] // g.group, cols[0][1] // g.group
    for (plane, off, row_bytes), new_off in zip(planes, (ng.base_offset, ng.high_offset, ng.scale_offset)):
        if row_bytes == 0:
            continue
        m = raw[off:off + g.n * row_bytes].view(g.n, row_bytes)
        if rows is not None:
            m = torch.cat([m[b:b + c] for b, c in rows], 0)
        new_row = row_bytes * ng.groups_per_row // g.groups_per_row
        if cols is not None:
            per = row_bytes // g.groups_per_row  # bytes of one scale group in this plane's row
            dst = out[new_off:new_off + new_shape[0] * new_row].view(new_shape[0], new_row)
            dst[:, :gc * per] = m[:, g0 * per:(g0 + gc) * per]  # the groups past K' stay zero (padding)
        else:
            out[new_off:new_off + new_shape[0] * new_row] = m.reshape(-1)
    return new_shape, out
