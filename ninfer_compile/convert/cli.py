"""`ninfer-compile pack`: a Hugging Face checkpoint (or a synthetic inventory) → `.ninfer`.

    ninfer-compile pack HF_DIR -o model.ninfer [--recipe default|bf16] [--model-id ID] [--contract FILE]
                       [--draft-ranking FILE.i64 [--draft-rows N]] [--dflash DIR]
    ninfer-compile pack --synthetic MODEL_ID -o model.ninfer [--seed N] [--contract FILE] [--sparse]

A model id registered in graphs/ uses its contract (default recipe only). Any other id gets a
contract generated from the checkpoint's config with the recipe's formats, written beside the
artifact as `<out>.contract.yaml`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from ..artifact.formats import MAGIC
from ..errors import ConvertError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("hf_dir", nargs="?", metavar="HF_DIR", help="Hugging Face checkpoint directory")
    parser.add_argument("-o", "--output", required=True, metavar="OUT",
                        help="output .ninfer path (written to OUT.tmp, then renamed); an existing file is "
                             "replaced only if it is a .ninfer artifact, a directory is refused")
    parser.add_argument("--recipe", choices=("default", "bf16"), default=None,
                        help="numeric formats: default = the qwen3.6-27b table (qwen3.6-35b-a3b for "
                             "sparse MoE; Q4/Q5/Q6/W8), bf16 = every matrix BF16 (default: default)")
    parser.add_argument("--model-id", default=None,
                        help="artifact model id (default: hf-qwen3_5-<hidden>x<layers>, "
                             "hf-qwen3_5_moe-... for sparse MoE)")
    parser.add_argument("--contract", default=None, metavar="FILE", help="use this contract YAML")
    parser.add_argument("--draft-ranking", default=None, metavar="FILE.i64",
                        help="token-frequency counts (LE I64, row width = vocab rows; row 0 used) "
                             "for the optimized MTP draft head")
    parser.add_argument("--draft-rows", type=int, default=None, metavar="N",
                        help="draft-head rows for a generated contract (default 131072, capped)")
    parser.add_argument("--dflash", default=None, metavar="DIR",
                        help="the DFlash drafter's safetensors directory, for a contract with the "
                             "dflash part (e.g. qwen3.6-35b-a3b)")
    parser.add_argument("--synthetic", default=None, metavar="MODEL_ID",
                        help="write MODEL_ID's exact inventory with random valid payloads")
    parser.add_argument("--seed", type=int, default=0, help="synthetic: random seed (default 0)")
    parser.add_argument("--sparse", action="store_true",
                        help="synthetic: header only, payloads as a file hole (for compile tests)")
    parser.add_argument("-q", "--quiet", "--no-progress", dest="quiet", action="store_true",
                        help="no progress bar (--no-progress is the old name)")


def check_output(out: str) -> None:
    """Refuse, before any work, an -o that pack must not overwrite: a directory, a symbolic link to
    one, an existing file that is not a .ninfer artifact, a missing or unwritable parent."""
    from ..contracts import CONTRACT_SUFFIX

    path = Path(out)
    if path.is_dir():
        raise ConvertError(f"-o {out}: is a directory; give the .ninfer file to write")
    if path.exists():
        try:
            with open(path, "rb") as fh:
                head = fh.read(len(MAGIC))
        except OSError as exc:
            raise ConvertError(f"-o {out}: cannot read the existing file: {exc.strerror or exc}") from None
        if head != MAGIC:
            raise ConvertError(f"-o {out}: exists and is not a .ninfer artifact; refusing to overwrite it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConvertError(f"-o {out}: parent directory {parent} does not exist or is not a directory")
    for side in (Path(str(path) + ".tmp"), Path(str(path) + CONTRACT_SUFFIX)):
        if side.is_dir():
            raise ConvertError(f"-o {out}: {side} is a directory; pack writes a file there")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConvertError(f"-o {out}: cannot write in {parent}: {exc.strerror or exc}") from None


def run(args) -> int:
    progress = not args.quiet
    check_output(args.output)
    if args.synthetic is not None:
        if args.hf_dir is not None:
            raise ConvertError("pack: give either HF_DIR or --synthetic MODEL_ID, not both")
        if args.recipe or args.draft_ranking or args.model_id or args.dflash:
            raise ConvertError("pack --synthetic: --recipe/--model-id/--draft-ranking/--dflash do not apply "
                               "(formats and ids come from the contract)")
        from .synthetic import pack_synthetic
        res = pack_synthetic(args.synthetic, args.output, seed=args.seed, contract_file=args.contract,
                             sparse=args.sparse, progress=progress)
        kind = "sparse header" if res.sparse else f"seed {args.seed}"
    else:
        if args.hf_dir is None:
            raise ConvertError("pack: HF_DIR or --synthetic MODEL_ID is required")
        if args.sparse:
            raise ConvertError("pack: --sparse applies to --synthetic only")
        from .hf import pack_hf
        res = pack_hf(args.hf_dir, args.output, recipe=args.recipe, model_id=args.model_id,
                      contract_file=args.contract, draft_ranking=args.draft_ranking,
                      draft_rows=args.draft_rows, dflash_dir=args.dflash, progress=progress)
        kind = f"from {args.hf_dir}"
    extra = f", contract {res.contract_path}" if res.contract_path else ""
    print(f"wrote {res.path}: {res.model_id}, {res.objects} objects, {res.file_size} bytes ({kind}){extra}",
          file=sys.stderr)
    return 0
