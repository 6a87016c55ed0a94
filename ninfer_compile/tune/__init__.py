"""Route tuner: `ninfer-compile tune --sm N` measures route crossovers on the local GPU and writes
`routes/smN.yaml` (DESIGN §5, §10).

- `shapes.py`    the match set: every (family, match) `compile` presents, from a contract/artifact,
                 at every KV format and (verify extents) draft window; `--families` names and groups
- `plan.py`      what to time: T points (a verify case's round sizes C x W), contexts, candidates,
                 `--untimed-in`
- `measure.py`   the shared bench machinery (Bench, cold CUDA-graph timing, copies, reference checks,
                 random valid weights) and the param-candidate filter
- `crossover.py` crossover picking (hysteresis, route domains), table rendering + atomic write
- `picking.py`   row groups from the records, the markdown report, `--replay` merging
- `cli.py`       the subcommand
What is family-specific — the bench builder, the param candidates, the tolerance, whether a context
depth matters, the `--families` group, the table order — is each family's `TuneSpec` in
`kernels/<folder>/tune.py` (`kernels/tuning.py`); nothing here names a family.
Only `measure.py` and the builders need CUDA; the rest runs on the CPU (tests/tune/).
"""
