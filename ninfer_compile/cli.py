"""`ninfer-compile` command line.

Subcommands live beside the code they drive; each module exposes `configure(parser)` and
`run(args) -> int`. A bare `ninfer-compile ARTIFACT --sm N` means `compile`.
Every `NinferError` is printed as one line (`error: ...`) with exit status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .errors import NinferError

# name -> (module, one-line help). Imported lazily so `inspect` never pays for torch/triton.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("ninfer_compile.artifact.inspect", "print an artifact's directory; dump one tensor"),
    "check": ("ninfer_compile.contracts.cli", "check an artifact against its model contract"),
    "pack": ("ninfer_compile.convert.cli", "convert a Hugging Face checkpoint (or synthesize) to .ninfer"),
    "reference": ("ninfer_compile.reference.cli", "run the float32 reference model, write logits"),
    "compile": ("ninfer_compile.compile_cli", "compile an artifact into a plan for one GPU architecture"),
    "routes": ("ninfer_compile.routes.cli", "validate, show and diff route tables"),
    "tune": ("ninfer_compile.tune.cli", "measure route crossovers on the local GPU, write a table"),
}


def _available() -> dict[str, tuple[str, str]]:
    """Subcommands whose module file exists. Checked on disk, not with find_spec, because
    find_spec imports parent packages (and with them torch) — `inspect` must stay light."""
    root = Path(__file__).resolve().parent.parent
    out = {}
    for name, (mod, help_) in SUBCOMMANDS.items():
        if (root / (mod.replace(".", "/") + ".py")).is_file():
            out[name] = (mod, help_)
    return out


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """All subcommands are listed; only `command`'s module is imported and configured."""
    parser = argparse.ArgumentParser(prog="ninfer-compile", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (mod, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            module = importlib.import_module(mod)
            module.configure(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    available = _available()
    # `ninfer-compile ARTIFACT --sm N` is `compile`.
    if argv and not argv[0].startswith("-") and argv[0] not in available and "compile" in available:
        argv = ["compile", *argv]
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args._module.run(args) or 0)
    except NinferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early: not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
