"""The studies: what the commands in ``experiments/`` and ``sweeps/`` run. The ablation (``ablation``, its
tables ``tables``, the notebook's reader ``analysis``), the DLoop study (``dloop``), the Optuna sweep
(``sweep/``), the benchmark command (``bench``), the head-cost and memory benchmarks (``head_cost``,
``memory``), the serving benchmark (``serve_bench``), the official-loop parity check (``parity``) and what
they share (``common``). Each module imports torch only where it measures, so a command parses first."""
