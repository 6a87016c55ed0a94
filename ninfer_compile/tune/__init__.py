"""Route tuner: `ninfer-compile tune --sm N` measures route crossovers on the local GPU and writes
`routes/smN.yaml` (DESIGN §5, §10).

- `shapes.py`    the match set: every (family, match) `compile` presents, from a contract/artifact
- `measure.py`   GPU operands (random valid weights), cold CUDA-graph timing, reference checks
- `crossover.py` crossover picking (hysteresis, route domains), table rendering + atomic write
- `cli.py`       the subcommand
Only `measure.py` needs CUDA; the rest runs on the CPU (tests/tune/).
"""
