"""Hugging Face checkpoint → `.ninfer` conversion, and synthetic artifacts.

- `mapping.py`: config geometry and source → NInfer logical tensors (`ninfer_tensors`,
  `convert_state_dict`, per-object `ObjectRecipe`s);
- `checkpoint.py`: lazy checkpoint reading (`HFCheckpoint`), tokenizer ids, the draft-head id map;
- `hf.py`: contracts for new checkpoints (`build_contract`) and the streaming packer (`pack_hf`);
  it re-exports the public names of mapping.py and checkpoint.py.
- `synthetic.py`: a contract's exact inventory with random valid payloads (`pack_synthetic`).
- `cli.py`: the `pack` subcommand.
"""

from .hf import HFCheckpoint, convert_state_dict, ninfer_tensors, pack_hf
from .synthetic import pack_synthetic

__all__ = ["HFCheckpoint", "convert_state_dict", "ninfer_tensors", "pack_hf", "pack_synthetic"]
