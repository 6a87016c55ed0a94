"""Kernel emission: copy the route library code a plan launches into `PLAN/kernels/`.

The plan directory is the runtime's only interface with the compiler, so the runtime must be able
to run a plan without importing `ninfer_compile`. Emission makes the kernels self-contained:

- For every route the plan launches, the modules its launcher and kernels live in, plus every
  module they import inside `ninfer_compile.kernels` (transitively, found by reading the source's
  import statements, including ones inside functions), and the `__init__.py` of every package on
  the way, are copied to `PLAN/kernels/<same relative path>`.
- Imports are rewritten so the copy is a standalone package that works under any package name:
  `from ninfer_compile.kernels.linear.weights import X` becomes `from ..linear.weights import X`
  (relative imports inside the kernel tree are kept as written).
- The route library depends on exactly two leaf modules outside `kernels/`: the error types
  (`ninfer_compile.errors`) and the row-split geometry (`ninfer_compile.artifact.formats`); both
  import nothing else of the project. They are vendored into `kernels/_ext/` (`KERNEL_DEPENDENCIES`,
  the default `vendor=`). Any other import of `ninfer_compile` outside `kernels/` makes emission
  fail with an `EmitError` naming the module and the import: the route library stays
  self-contained, so a plan runs without the compiler installed.
- The emitted root `kernels/__init__.py` is generated (docstring only; the library's own imports the registry).
- `kernels/manifest.json`: format, Triton version at compile time, the files (path -> sha256),
  and per route: family, launcher `"family.module:function"`, kernels, declared T domain, the
  params used (defaults overlaid, one entry per distinct set), the sha256 of its modules, and
  `args`: its launcher's argument list from the family spec (`route_arguments`: name, binding
  kinds, optional, parts), which the runtime checks each launch's `bind` list against;
  `torch_launcher`: the family's CPU implementation `"family.torch_impl:function"` (its spec's
  `torch_impl`, copied with the modules it imports, which must not import triton: they run where
  Triton does not) or None when the family has none, and `torch_modules` (path -> sha256).

All output is deterministic: files sorted, JSON with sorted keys, no timestamps or absolute paths.
The manifest's `binaries` (None here) is filled by `aot.attach_binaries`: the kernels compiled ahead
of time for the plan's sm into `kernels/bin/` (aot.py), or why there are none.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import CompileError
from .column_specialization import unspecialize
from .source_scan import defines_name, parse, triton_import_line

__all__ = ["EmitError", "KERNELS_FORMAT", "KERNEL_DEPENDENCIES", "emit_kernels", "kernel_files",
           "launches_from_manifest", "route_arguments"]

KERNELS_FORMAT = "ninfer-kernels-v1"
ROOT = "ninfer_compile"
KROOT = "ninfer_compile.kernels"
EXT = "_ext"  # where vendored outside modules go inside the emitted package

# The leaf modules outside kernels/ that the route library may import; vendored into the plan.
KERNEL_DEPENDENCIES = ("ninfer_compile.errors", "ninfer_compile.artifact.formats")

_HEADER = "# Emitted by ninfer-compile from {src}; imports rewritten for a standalone package.\n"


class EmitError(CompileError):
    """Kernel emission failed (one line naming the module at fault)."""


# ----------------------------------------------------------------------------- module lookup


def _kernels_dir() -> Path:
    spec = importlib.util.find_spec(KROOT)
    if spec is None or not spec.submodule_search_locations:
        raise EmitError(f"cannot locate the {KROOT} package")
    return Path(list(spec.submodule_search_locations)[0])


def _pkg_root_dir() -> Path:
    return _kernels_dir().parent


def _module_file(mod: str) -> tuple[Path, bool]:
    """(source file, is_package) of a module under `ninfer_compile` (no import)."""
    if mod != ROOT and not mod.startswith(ROOT + "."):
        raise EmitError(f"{mod} is not a module of {ROOT}")
    rel = mod.split(".")[1:]
    base = _pkg_root_dir().joinpath(*rel) if rel else _pkg_root_dir()
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    f = base.with_suffix(".py")
    if f.is_file():
        return f, False
    raise EmitError(f"module {mod} has no source file ({base}.py)")


def _exists(mod: str) -> bool:
    try:
        _module_file(mod)
        return True
    except EmitError:
        return False


def _under(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


# ----------------------------------------------------------------------------- import analysis


class _Import:
    """One import statement of a module: its node and the absolute modules it names."""

    def __init__(self, node: ast.stmt, targets: list[str], ours: bool):
        self.node = node
        self.targets = targets  # absolute module names (for `from X import a`: X, and X.a if a module)
        self.ours = ours  # refers to ninfer_compile at all


def _resolve_from(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = mod.split(".")
    pkg_parts = parts if is_pkg else parts[:-1]
    if node.level - 1 > len(pkg_parts) - 1:
        raise EmitError(f"{mod}: relative import beyond the top-level package (line {node.lineno})")
    base = pkg_parts[: len(pkg_parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.lru_cache(maxsize=512)  # a compile renders the package twice (column_specialization.py)
def _imports(mod: str, source: str, is_pkg: bool) -> list[_Import]:
    try:
        tree = parse(source)
    except SyntaxError as exc:
        raise EmitError(f"{mod}: cannot parse: {exc}") from None
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
            ours = [n for n in names if _under(n, ROOT)]
            if ours:
                out.append(_Import(node, ours, True))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(mod, is_pkg, node)
            if not _under(base, ROOT):
                continue
            targets = [base]
            for a in node.names:
                sub = f"{base}.{a.name}"
                if a.name != "*" and _exists(sub):
                    targets.append(sub)
            out.append(_Import(node, targets, True))
    out.sort(key=lambda i: (i.node.lineno, i.node.col_offset))
    return out


def _emitted_name(mod: str, vendor: frozenset[str]) -> str:
    """The module's dotted path inside the emitted package ('' = the package root)."""
    if _under(mod, KROOT):
        return mod[len(KROOT) + 1:] if mod != KROOT else ""
    if mod in vendor or any(_under(mod, v) for v in vendor):
        return f"{EXT}." + mod[len(ROOT) + 1:]
    raise AssertionError(mod)


def _relative(from_mod_emitted: str, from_is_pkg: bool, target_emitted: str) -> tuple[int, str]:
    """(level, module) of a relative import of `target` from a module, both emitted paths."""
    cur = [p for p in from_mod_emitted.split(".") if p]
    pkg = cur if from_is_pkg else cur[:-1]
    tgt = [p for p in target_emitted.split(".") if p]
    common = 0
    while common < len(pkg) and common < len(tgt) and pkg[common] == tgt[common]:
        common += 1
    level = len(pkg) - common + 1
    return level, ".".join(tgt[common:])


def _rewrite(mod: str, is_pkg: bool, source: str, imports: list[_Import], vendor: frozenset[str]) -> str:
    """Replace every absolute `ninfer_compile...` import (and relative ones that leave the kernel
    tree) by a relative import valid inside the emitted package."""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))

    def pos(lineno: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets
        line = lines[lineno - 1]
        return offsets[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8"))

    here = _emitted_name(mod, vendor)
    edits: list[tuple[int, int, str]] = []
    for imp in imports:
        node = imp.node
        if isinstance(node, ast.ImportFrom):
            base = _resolve_from(mod, is_pkg, node)
            if node.level > 0 and _under(base, KROOT) and _under(mod, KROOT):
                continue  # relative inside the kernel tree: valid as written
            level, rel = _relative(here, is_pkg, _emitted_name(base, vendor))
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
            new = f"from {'.' * level}{rel} import {names}"
        else:
            parts = []
            for a in node.names:
                if not _under(a.name, ROOT):
                    parts.append(None)
                    continue
                if a.asname is None:
                    raise EmitError(f"{mod}: line {node.lineno}: `import {a.name}` cannot be rewritten for a "
                                    f"standalone package; use `from ... import ...` or an alias")
                target = _emitted_name(a.name, vendor)
                head, _, leaf = target.rpartition(".")
                level, rel = _relative(here, is_pkg, head)
                parts.append(f"from {'.' * level}{rel} import {leaf} as {a.asname}")
            if any(p is None for p in parts):
                raise EmitError(f"{mod}: line {node.lineno}: mixes {ROOT} and other modules in one import")
            new = "; ".join(parts)
        edits.append((pos(node.lineno, node.col_offset), pos(node.end_lineno, node.end_col_offset), new))
    out = source
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    return out


# ----------------------------------------------------------------------------- the closure


def _ref_module(ref: str) -> str:
    mod, _, _ = ref.partition(":")
    return mod


def _collect(roots: Iterable[str], vendor: frozenset[str]) -> dict[str, tuple[Path, bool, list[_Import]]]:
    """Every module reachable from `roots` inside the kernel tree (+ vendored outside modules)."""
    seen: dict[str, tuple[Path, bool, list[_Import]]] = {}
    todo = sorted(set(roots))
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        path, is_pkg = _module_file(mod)
        src = path.read_text(encoding="utf-8")
        imps = _imports(mod, src, is_pkg)
        seen[mod] = (path, is_pkg, imps)
        # parent packages' __init__ run on import: copy them (except the kernel root, generated)
        parts = mod.split(".")
        for i in range(len(parts) - 1, 1, -1):
            parent = ".".join(parts[:i])
            if parent not in seen and parent != KROOT and _under(parent, KROOT):
                todo.append(parent)
        for imp in imps:
            for t in imp.targets:
                if _under(t, KROOT):
                    if t != KROOT and t not in seen:
                        todo.append(t)
                elif t == ROOT:
                    raise EmitError(f"kernel module {mod} imports the {ROOT} package itself (line "
                                    f"{imp.node.lineno}); the route library must be self-contained")
                elif any(_under(t, v) for v in vendor):
                    if _exists(t) and t not in seen:
                        todo.append(t)
                else:
                    raise EmitError(
                        f"kernel module {mod} imports {t} (line {imp.node.lineno}), which is outside "
                        f"{KROOT}: the route library must be self-contained for plan emission")
        todo.sort()
    return seen


def _route_modules(route) -> list[str]:
    refs = [r for r in [route.launcher, *route.kernels] if r]
    if not route.launcher:
        raise EmitError(f"route {route.name} has no launcher: it cannot run from a plan")
    mods = []
    for r in refs:
        m = _ref_module(r)
        if not _under(m, KROOT) or m == KROOT:
            raise EmitError(f"route {route.name}: {r} is outside {KROOT}")
        mods.append(m)
    return mods


def _torch_ref(route) -> str | None:
    """The route family's torch implementation `"module:function"` (its spec's `torch_impl`), or None."""
    from ..kernels.family import family_specs

    spec = family_specs().get(route.family)
    ref = getattr(spec, "torch_impl", None) if spec is not None else None
    if ref is None:
        return None
    m = _ref_module(ref)
    if not _under(m, KROOT) or m == KROOT or ":" not in ref:
        raise EmitError(f"family {route.family}: torch_impl {ref!r} is not a \"module:function\" inside {KROOT}")
    return ref


def _emitted_ref(ref: str | None, vendor: frozenset[str]) -> str | None:
    if ref is None:
        return None
    mod, _, fn = ref.partition(":")
    return f"{_emitted_name(mod, vendor)}:{fn}"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _emitted_path(mod: str, is_pkg: bool, vendor: frozenset[str]) -> str:
    name = _emitted_name(mod, vendor)
    parts = name.split(".") if name else []
    return "/".join(["kernels", *parts, "__init__.py"]) if is_pkg else "/".join(["kernels", *parts]) + ".py"


def _operand_kinds(roles) -> list[str]:
    """The plan reference kinds an operand of these roles binds as (plan/manifest.py::_ref)."""
    return sorted({"weight" if r == "weight" else "state" if r == "state" else "buffer" for r in roles})


def route_arguments(route) -> list[dict[str, Any]] | None:
    """The launcher argument list of `route`, from its family spec: per operand (spec order)
    {name, kinds, optional, parts}, per launcher attribute {name, kinds: [scalar | group]}, per route param
    {name, kinds: [constexpr]} (sorted), then {name: workspace, kinds: [workspace]} when the route
    has a workspace hook. None: the family has no spec (its launches carry no `bind`)."""
    from ..kernels.family import family_specs

    spec = family_specs().get(route.family)
    if spec is None:
        return None
    out: list[dict[str, Any]] = [{"name": o.name, "kinds": _operand_kinds(o.roles), "optional": bool(o.optional),
                                  "parts": int(o.parts)} for o in spec.operands]
    out += [{"name": a.name, "kinds": [a.binding], "optional": bool(a.optional), "parts": False}
            for a in spec.attrs if a.to_launcher]
    out += [{"name": k, "kinds": ["constexpr"], "optional": False, "parts": False} for k in sorted(route.params)]
    if route.workspace is not None:
        out.append({"name": "workspace", "kinds": ["workspace"], "optional": False, "parts": False})
    return out


def kernel_files(launches: Iterable[tuple[Any, Mapping[str, Any] | None]], *,
                 vendor: Iterable[str] = KERNEL_DEPENDENCIES,
                 unspecialized: Mapping[str, list[str]] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
    """Render the emitted kernel package: ({relative path under the plan dir: text}, manifest).

    `launches`: (Route, params) pairs, one per launch (duplicates are fine). Pure: writes nothing.
    `unspecialized`: {"module:kernel" (emitted path): [parameters]} left unspecialised (column_specialization.py).
    """
    import triton

    vendor_set = frozenset(vendor)
    by_route: dict[str, Any] = {}
    params_by_route: dict[str, dict[str, dict]] = {}
    for route, params in launches:
        old = by_route.get(route.name)
        if old is not None and old is not route:
            raise EmitError(f"two different routes are named {route.name!r}")
        by_route[route.name] = route
        resolved = route.resolve_params(dict(params or {}))
        key = json.dumps(resolved, sort_keys=True, default=str)
        params_by_route.setdefault(route.name, {})[key] = resolved
    if not by_route:
        raise EmitError("the plan launches no routes: nothing to emit")

    route_roots = {name: _route_modules(r) for name, r in sorted(by_route.items())}
    torch_refs = {name: _torch_ref(r) for name, r in sorted(by_route.items())}
    torch_roots = sorted({_ref_module(ref) for ref in torch_refs.values() if ref})
    modules = _collect([m for ms in route_roots.values() for m in ms] + torch_roots, vendor_set)

    files: dict[str, str] = {}
    shas: dict[str, str] = {}
    for mod in sorted(modules):
        path, is_pkg, imps = modules[mod]
        src = path.read_text(encoding="utf-8")
        rel_src = path.relative_to(_pkg_root_dir().parent).as_posix()
        text = _HEADER.format(src=rel_src) + _rewrite(mod, is_pkg, src, imps, vendor_set)
        emitted = _emitted_name(mod, vendor_set)
        here = {k.partition(":")[2]: v for k, v in (unspecialized or {}).items() if k.partition(":")[0] == emitted}
        if here:
            text = unspecialize(text, here, emitted)
        out = _emitted_path(mod, is_pkg, vendor_set)
        files[out] = text
        shas[mod] = _sha(text)
    emitted_modules = {_emitted_name(m, vendor_set) for m in modules}
    lost = sorted(r for r in unspecialized or {} if r.partition(":")[0] not in emitted_modules)
    if lost:
        raise EmitError(f"no emitted module holds {lost[0]} (asked to leave its arguments unspecialised)")
    # packages without an __init__ in the tree (namespace-style) and the generated roots
    files["kernels/__init__.py"] = ('"""Kernels emitted by ninfer-compile for this plan (a standalone package; the\n'
                                    'runtime imports it under a unique name)."""\n')
    for p in sorted(list(files)):  # every directory on the way is a package
        cur = Path(p).parent
        while cur.as_posix() != "kernels" and cur.as_posix() != ".":
            files.setdefault(f"{cur.as_posix()}/__init__.py", "")
            cur = cur.parent

    def closure(mods: list[str]) -> list[str]:
        out, todo = set(), list(mods)
        while todo:
            m = todo.pop()
            if m in out or m not in modules:
                continue
            out.add(m)
            for imp in modules[m][2]:
                todo.extend(t for t in imp.targets if t in modules)
            parts = m.split(".")  # parent packages run on import
            todo.extend(".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in modules)
        # relative imports are resolved into targets too, so the closure is complete
        return sorted(out)

    torch_closure: dict[str, list[str]] = {}
    for root in torch_roots:  # the CPU path runs without Triton: its modules must not import it
        mods = torch_closure[root] = closure([root])
        for m in mods:
            line = triton_import_line(modules[m][0].read_text(encoding="utf-8"))
            if line is not None:
                raise EmitError(f"{m} (line {line}) imports triton, and {root} imports it: a torch implementation "
                                f"must run without Triton")
    for name, ref in sorted(torch_refs.items()):
        if ref and not defines_name(modules[_ref_module(ref)][0].read_text(encoding="utf-8"), ref.partition(":")[2]):
            raise EmitError(f"family {by_route[name].family}: torch_impl {ref} names no function of its module")

    routes_out: dict[str, Any] = {}
    for name, route in sorted(by_route.items()):
        launcher_mod, _, fn = route.launcher.partition(":")
        mods = closure(route_roots[name])
        dom = route.domain
        routes_out[name] = {
            "family": route.family,
            "launcher": f"{_emitted_name(launcher_mod, vendor_set)}:{fn}",
            "kernels": [f"{_emitted_name(_ref_module(k), vendor_set)}:{k.partition(':')[2]}" for k in route.kernels],
            "domain": {"min_t": dom.min_t, "max_t": dom.max_t,
                       # the phases the route serves, when it restricts them (the runtime refuses a
                       # launch of another phase: a route swapped by a plan edit)
                       **({"phase": list(dom.extra["phase"])} if "phase" in (dom.extra or {}) else {})},
            "params": [params_by_route[name][k] for k in sorted(params_by_route[name])],
            "args": route_arguments(route),
            "modules": {_emitted_path(m, modules[m][1], vendor_set): shas[m] for m in mods},
            "sha256": _sha("".join(f"{m}:{shas[m]}\n" for m in mods)),
            "torch_launcher": _emitted_ref(torch_refs[name], vendor_set),
            "torch_modules": ({_emitted_path(m, modules[m][1], vendor_set): shas[m]
                               for m in torch_closure[_ref_module(torch_refs[name])]} if torch_refs[name] else {}),
        }
    manifest = {
        "format": KERNELS_FORMAT,
        "triton": triton.__version__,
        "package": "kernels",
        "vendored": sorted(m for m in modules if not _under(m, KROOT)),
        "binaries": None,
        "files": {p: _sha(t) for p, t in sorted(files.items())},
        "routes": routes_out,
    }
    files["kernels/manifest.json"] = json.dumps(manifest, sort_keys=True, indent=1, default=str) + "\n"
    return dict(sorted(files.items())), manifest


def emit_kernels(plan_dir: Path, launches: Iterable[tuple[Any, Mapping[str, Any] | None]], *,
                 vendor: Iterable[str] = KERNEL_DEPENDENCIES) -> dict[str, Any]:
    """Write `plan_dir/kernels/` (replacing an existing one) and return the kernel manifest.

    Call it on the plan's temp directory before the atomic rename (or use `kernel_files` to add
    the files to the plan writer's file set)."""
    files, manifest = kernel_files(launches, vendor=vendor)
    plan_dir = Path(plan_dir)
    if not plan_dir.is_dir():
        raise EmitError(f"{plan_dir}: plan directory does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=".kernels.tmp-", dir=plan_dir))
    try:
        for rel, text in files.items():
            p = tmp / Path(rel).relative_to("kernels")
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(text)
        dest = plan_dir / "kernels"
        keep = {}
        if dest.exists():  # keep files other writers put there (e.g. routes.json)
            for f in dest.iterdir():
                if f.is_file() and not (tmp / f.name).exists():
                    keep[f.name] = f.read_bytes()
            shutil.rmtree(dest)
        os.rename(tmp, dest)
        for name, data in keep.items():
            (dest / name).write_bytes(data)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def launches_from_manifest(manifest: Mapping[str, Any], registry=None) -> list[tuple[Any, dict]]:
    """(Route, params) for every routed launch of a plan manifest (plan.json as a dict)."""
    if registry is None:
        from ..kernels.registry import default_registry as registry
    out = []
    for ext in manifest.get("extents", {}).values():
        for L in ext.get("launches", []):
            if L.get("route"):
                out.append((registry.get_route(L["route"]), dict(L.get("params") or {})))
    return out
