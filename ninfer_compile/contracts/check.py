"""Check an artifact's directory against a resolved contract.

Works on anything shaped like `artifact.reader.Artifact`: `.path`, `.model_id` and `.objects`,
whose entries have `.name` and `.kind` plus `.shape/.format/.layout` (tensors) or `.encoding`
(resources). Every problem is collected before reporting, so one run shows the whole damage.
"""

from __future__ import annotations

from typing import Any

from ..errors import ContractError
from .schema import RESOURCE_ENCODING, ExpectedObject, ModelSpec


def _actual_describe(obj: Any) -> str:
    if getattr(obj, "kind", None) == "resource":
        return f"resource {obj.name}"
    return f"tensor {obj.name} {list(getattr(obj, 'shape', ()))} {getattr(obj, 'format', '?')}"


def artifact_problems(artifact: Any, spec: ModelSpec) -> list[str]:
    """One line per problem: model id, missing, extra, wrong kind, misshapen, misformatted
    (format, layout or encoding), and — only when the set of objects matches — order."""
    problems: list[str] = []
    if artifact.model_id != spec.model_id:
        problems.append(f"model_id: artifact says {artifact.model_id!r}, contract expects {spec.model_id!r}")

    actual = {obj.name: obj for obj in artifact.objects}
    for name, expected in spec.objects.items():
        obj = actual.get(name)
        if obj is None:
            problems.append(f"missing {expected.describe()} (part {expected.part})")
            continue
        problems.extend(_object_problems(expected, obj))
    for name, obj in actual.items():
        if name not in spec.objects:
            problems.append(f"extra {_actual_describe(obj)} (not in the contract)")

    if not problems:
        # Readers bind by name, but the writer order is part of the exact inventory: a
        # different order means a different writer, worth one line.
        expected_order = list(spec.objects)
        actual_order = [obj.name for obj in artifact.objects]
        if actual_order != expected_order:
            at = next(i for i, (a, e) in enumerate(zip(actual_order, expected_order)) if a != e)
            problems.append(f"order: object {at} is {actual_order[at]}, writer order expects {expected_order[at]}")
    return problems


def _object_problems(expected: ExpectedObject, obj: Any) -> list[str]:
    kind = getattr(obj, "kind", None)
    if kind != expected.kind:
        return [f"wrong kind {expected.name}: expected {expected.kind}, got {kind}"]
    if expected.kind == "resource":
        encoding = getattr(obj, "encoding", None)
        if encoding != RESOURCE_ENCODING:
            return [f"misformatted resource {expected.name}: expected encoding {RESOURCE_ENCODING}, got {encoding}"]
        return []
    out = []
    shape = tuple(obj.shape)
    if shape != expected.shape:
        out.append(f"misshapen {expected.name}: expected {list(expected.shape)}, got {list(shape)}")
    if obj.format != expected.format:
        out.append(f"misformatted {expected.name}: expected {expected.format}, got {obj.format}")
    elif getattr(obj, "layout", expected.layout) != expected.layout:
        out.append(f"misformatted {expected.name}: expected layout {expected.layout}, got {obj.layout}")
    return out


def _summary(artifact: Any, spec: ModelSpec, problems: list[str]) -> str:
    counts: dict[str, int] = {}
    for line in problems:
        word = line.split(" ", 1)[0].rstrip(":")
        word = {"wrong": "wrong kind", "model_id": "model_id mismatch", "order": "order"}.get(word, word)
        counts[word] = counts.get(word, 0) + 1
    detail = ", ".join(f"{n} {word}" for word, n in counts.items())
    where = spec.contract_path or f"contract {spec.model_id}"
    return (f"artifact {getattr(artifact, 'path', '?')} (model_id {artifact.model_id!r}) does not match "
            f"{where}: {len(problems)} problem(s): {detail}")


def check_artifact(artifact: Any, spec: ModelSpec) -> None:
    """Raise ContractError unless the artifact holds exactly the contract's objects. The message
    is a self-contained summary line followed by one line per problem."""
    problems = artifact_problems(artifact, spec)
    if problems:
        raise ContractError("\n".join([_summary(artifact, spec, problems), *("  " + p for p in problems)]))
