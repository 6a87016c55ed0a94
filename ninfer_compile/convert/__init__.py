"""Hugging Face checkpoint → `.ninfer` conversion, and synthetic artifacts.

- `hf.py`: source → NInfer logical tensors (`ninfer_tensors`, `convert_state_dict`), checkpoint
  reading (`HFCheckpoint`) and the streaming packer (`pack_hf`).
- `synthetic.py`: a contract's exact inventory with random valid payloads (`pack_synthetic`).
- `cli.py`: the `pack` subcommand.
"""

from .hf import convert_state_dict, ninfer_tensors

__all__ = ["convert_state_dict", "ninfer_tensors"]
