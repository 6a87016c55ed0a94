"""The tuner's entry for `l2_prefetch`: not measurable alone (a hint pays off only in the launches
after it), so it is never tuned; its rows come from end-to-end A/B runs (bench_e2e)."""

from ninfer_compile.kernels.tuning import TuneSpec

TUNE = (TuneSpec(family="l2_prefetch", order=5, builder=None,
                 doc="an L2 hint: its worth shows only end to end (bench_e2e A/B), not in isolation"),)
