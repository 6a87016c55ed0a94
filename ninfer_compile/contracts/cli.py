"""`ninfer-compile check ARTIFACT [--contract FILE]`: check an artifact against its contract.

The contract is `--contract FILE`, else `graphs/<model_id>.yaml`, else `ARTIFACT.contract.yaml`.
Prints `ok: <model_id>: N tensors, M resources match <contract>` and exits 0; any mismatch is a
ContractError listing every problem (the CLI prints it and exits 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .check import check_artifact
from .loader import find_contract


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", type=Path, help="the .ninfer file to check")
    parser.add_argument("--contract", type=Path, default=None,
                        help="contract YAML (default: graphs/<model_id>.yaml, then ARTIFACT.contract.yaml)")


def open_artifact(path: Path) -> Any:
    """Open an artifact with the project reader (imported here: only `check` needs it)."""
    from ..artifact.reader import Artifact

    return Artifact.open(path)


def run(args: argparse.Namespace) -> int:
    artifact = open_artifact(args.artifact)
    try:
        contract = find_contract(args.artifact, artifact.model_id, args.contract)
        spec = contract.resolve_for(artifact)
        check_artifact(artifact, spec)
    finally:
        close = getattr(artifact, "close", None)
        if close is not None:
            close()
    print(f"ok: {spec.model_id}: {spec.tensor_count} tensors, {spec.resource_count} resources match "
          f"{contract.source}")
    return 0
