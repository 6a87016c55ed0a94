"""Hugging Face checkpoint → `.ninfer` conversion, and synthetic artifacts.

- `hf.py`: source → NInfer logical tensors (`ninfer_tensors`, `convert_state_dict`, per-object
  `ObjectRecipe`s), lazy checkpoint reading (`HFCheckpoint`), contracts for new checkpoints
  (`build_contract`) and the streaming packer (`pack_hf`).
- `synthetic.py`: a contract's exact inventory with random valid payloads (`pack_synthetic`).
- `cli.py`: the `pack` subcommand.
"""

from .hf import HFCheckpoint, convert_state_dict, ninfer_tensors, pack_hf
from .synthetic import pack_synthetic

__all__ = ["HFCheckpoint", "convert_state_dict", "ninfer_tensors", "pack_hf", "pack_synthetic"]
