"""The column-count arguments of the kernels only prefill extents launch, compiled unspecialised:
`ninfer-compile`'s default when it builds binaries (`--column-specialization` keeps them
specialised; `--no-column-specialization` asks for it also with `--no-binaries`). It costs a compile
one more reproduction of the prefill extents' launches (aot.column_parameters; the decode and verify
extents' kernels keep their specialisation, so their launches are not reproduced), kept in the
binary cache (`columns-v1`) with the launch memo replaying: on the sparse 27B, 2 cores, a repeat
compile 3.15 s as before.

Triton specialises every integer argument of a kernel on `== 1` (the value becomes a constant) and
on divisibility by 16 (an alignment hint). A prefill extent runs its kernels at every column count
1..T (a prompt's last chunk), so an argument derived from the column count (`T`, a chunk count
`NT`) falls into all three classes and each kernel is compiled up to three times per other
variant: on the 27B, 70 binaries instead of 45, the extra 25 being the longest compiles (the
tensor-core prefill kernels), about half of a cold compile's CPU time. With the option, the
arguments whose class differs between the captured launches of one kernel are named in that
kernel's `@triton.jit(do_not_specialize=[...])` in the emitted source, so the compile and the
runtime (which imports that source) both treat them as plain integers: one binary per remaining
variant, and the tail chunk runs the general code (no `T == 1` constant, no `T % 16` hint). Kernels
a decode or verify extent also launches (the decode GEMVs run the prefill tails too) keep their
specialisation, so a decode step's code is the default plan's. Measured (H100, 2026-12-07,
bench/results/compile_load_h100_2026-12-07/): prefill 4096 8,288 tok/s against 8,317 for the
fully specialised plan in the same call (1024: 8,361); cold compile of the sparse 27B on 2 cores
19.3-20.5 s (45 binaries) against 30.0-30.5 s (70).

- `varying_parameters(captures, root, keep)`: {"module:kernel" (emitted package path): [parameter
  names]} for every kernel not in `keep` with an integer argument whose class (== 1 / divisible by 16
  / neither) varies across its captured specialisations (aot_capture.Capture); sorted,
  deterministic. `keep`: the kernels a decode or verify extent launches (`aot.steady_kernels`): a
  decode step's code is never changed by the option (the decode GEMVs also run the prefill tails,
  so their T varies too).
- `unspecialize(source, kernels)`: the module's source with each named kernel's bare `@triton.jit`
  decorator given `do_not_specialize=[...]` (any other decorator form is refused, one line).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping, Sequence

from ..errors import CompileError
from .source_scan import parse

OPTION = "--no-column-specialization"


def _spec_classes(jf, spec_text: str) -> dict[str, str]:
    """{integer parameter: "one" | "div16" | "any"} of one serialised specialisation."""
    declared = {p.name for p in jf.params if p.is_constexpr}
    spec = json.loads(spec_text)
    sig = spec["signature"]
    hinted = {k[0] for k, v in zip(spec["attrs_keys"], spec["attrs_vals"]) if len(k) == 1 and v}
    out = {}
    for i, (name, ty) in enumerate(sig.items()):
        if name in declared:
            continue
        if ty == "constexpr":  # a runtime argument Triton folded into a constant: an integer equal to 1 (or None)
            out[name] = "one"
        elif ty.startswith(("i", "u")) and ty[1:].isdigit():
            out[name] = "div16" if i in hinted else "any"
    return out


def varying_parameters(captures: Iterable, root: str, keep: Iterable[str] = ()) -> dict[str, list[str]]:
    from .aot_binaries import entry_kernel_ref

    keep = set(keep)
    seen: dict[str, dict[str, set[str]]] = {}
    for rec in captures:
        ref = entry_kernel_ref(rec.jf, root)
        if ref in keep:
            continue
        per = seen.setdefault(ref, {})
        for name, cls in _spec_classes(rec.jf, rec.spec).items():
            per.setdefault(name, set()).add(cls)
    out = {}
    for ref, per in sorted(seen.items()):
        names = sorted(n for n, classes in per.items() if len(classes) > 1)
        if names:
            out[ref] = names
    return out


def unspecialize(source: str, kernels: Mapping[str, Sequence[str]], module: str) -> str:
    """`source` with `@triton.jit` of each kernel in `kernels` (name -> parameters) made
    `@triton.jit(do_not_specialize=[...])`. `module`: named in errors."""
    lines = source.splitlines(keepends=True)
    edits = []
    found = set()
    for node in parse(source).body:
        if not isinstance(node, ast.FunctionDef) or node.name not in kernels:
            continue
        decs = node.decorator_list
        if len(decs) != 1 or ast.unparse(decs[0]) != "triton.jit" or decs[0].lineno != decs[0].end_lineno:
            raise CompileError(f"{OPTION}: {module}:{node.name} is not decorated with a bare @triton.jit (line "
                               f"{node.lineno}); cannot add do_not_specialize")
        params = {a.arg for a in node.args.args}
        missing = sorted(set(kernels[node.name]) - params)
        if missing:
            raise CompileError(f"{OPTION}: {module}:{node.name} has no parameter {missing[0]!r}")
        edits.append((decs[0], sorted(kernels[node.name])))
        found.add(node.name)
    absent = sorted(set(kernels) - found)
    if absent:
        raise CompileError(f"{OPTION}: {module} defines no kernel {absent[0]!r}")
    for dec, names in edits:
        row = dec.lineno - 1
        text = lines[row]
        lines[row] = text[:dec.col_offset] + f"triton.jit(do_not_specialize={names!r})" + text[dec.end_col_offset:]
    return "".join(lines)
