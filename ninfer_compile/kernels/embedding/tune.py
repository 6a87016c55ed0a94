"""The embedding family is not tuned (no builder); its entry places its rows in a written route table
(`kernels/tuning.py`)."""

from ninfer_compile.kernels.tuning import TuneSpec

TUNE = (TuneSpec(family="embedding", order=20),)
