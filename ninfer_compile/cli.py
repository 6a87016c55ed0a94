"""`ninfer-compile` command line.

Subcommands live beside the code they drive; each module exposes `configure(parser)` and
`run(args) -> int`. A bare `ninfer-compile ARTIFACT --sm N` means `compile`.
Every `NinferError` is printed as one line (`error: ...`) with exit status 2 — never a traceback.
SIGINT and SIGTERM unwind the command (workers killed, temp files removed, no half-written output)
and exit 130 / 143 after one line `error: interrupted (SIGINT|SIGTERM)`.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from pathlib import Path

from . import __version__, interrupts
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


USAGE = "ninfer-compile [-h] [--version] COMMAND ...\n       ninfer-compile ARTIFACT --sm N [options]"
DESCRIPTION = "Compile .ninfer model artifacts into Triton execution plans (and the tools around it)."
USAGE_EPILOG = """forms:
  ninfer-compile ARTIFACT --sm N [options]    compile (the same as `ninfer-compile compile ARTIFACT --sm N`)
  ninfer-compile COMMAND --help               the options of one command"""


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes are one line too: `error: PROG: MESSAGE (see PROG --help)`, exit 2."""

    def error(self, message):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """All subcommands are listed; only `command`'s module is imported and configured."""
    parser = OneLineParser(prog="ninfer-compile", usage=USAGE, description=DESCRIPTION, epilog=USAGE_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ninfer-compile {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", prog="ninfer-compile")
    for name, (mod, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            module = importlib.import_module(mod)
            module.configure(p)
            p.set_defaults(_module=module)
    return parser


def _install_signal_handlers():
    """SIGINT/SIGTERM -> interrupts.handler (the first raises Interrupted in the main thread; later
    ones are ignored so the bounded unwinding is not cut short). Returns the previous handlers
    (None when not on the main thread, where handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    interrupts.reset()
    previous = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    for s in interrupts.SIGNALS:
        signal.signal(s, interrupts.handler)
    return previous


def _restore_signal_handlers(previous) -> None:
    if previous:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    available = _available()
    # `ninfer-compile ARTIFACT --sm N` is `compile`.
    if argv and not argv[0].startswith("-") and argv[0] not in available and "compile" in available:
        argv = ["compile", *argv]
    previous = _install_signal_handlers()
    try:
        with interrupts.unblocked():  # an inherited mask blocking them would hold a signal back to the end
            return _run(argv)
    finally:
        _restore_signal_handlers(previous)


def _run(argv: list[str]) -> int:
    """Parse and run one command; errors and interrupts become one line and an exit code."""
    try:
        parser = build_parser(argv[0] if argv else None)
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help()
            return 2
        return int(args._module.run(args) or 0)
    except NinferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"error: interrupted ({signal.Signals(signum).name})", file=sys.stderr, flush=True)
        return 128 + int(signum)
    except BrokenPipeError:  # output piped into `head` and closed early: not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def entry() -> None:
    """The `ninfer-compile` command (and `python -m ninfer_compile.cli`): `main`, then an exit
    without the interpreter's teardown, which destroyed torch's modules and objects for ~0.8 s of a
    6-7 s compile (2 cores, 2026-12-07): the atexit handlers run and the standard streams are
    flushed as at a normal exit, then the process ends with main's exit code (an uncaught
    exception ends it the usual way)."""
    import atexit
    import os

    code = main()  # an exception goes on as usual (traceback, teardown)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
