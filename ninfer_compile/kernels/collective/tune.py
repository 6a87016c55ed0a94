"""The collectives are not measured by `ninfer-compile tune` (one GPU has no peer to reduce with):
their entries only place their hand-written rows in a written table (after every tunable family)."""

from ninfer_compile.kernels.tuning import TuneSpec

TUNE = (
    TuneSpec(family="all_reduce", order=200, builder=None,
             doc="torch.distributed all_reduce: needs several GPUs; multi-GPU figures are not taken yet"),
    TuneSpec(family="all_gather", order=201, builder=None,
             doc="torch.distributed all_gather of the vocabulary-parallel head's logits; as all_reduce"),
    TuneSpec(family="all_argmax", order=202, builder=None,
             doc="the distributed greedy pick (an all_gather of 2 values per row); as all_reduce"),
)
