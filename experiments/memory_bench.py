"""Peak memory of one training step per drafter method, old (full logits, dense masks) vs new (lean) path.

Shapes: the paper's vocabulary and blocks (V = 151,936, B = 16) with a narrow width (d = 64, one draft
layer, a 4-layer target) so it runs on a CPU; A anchors per sequence (default 128: at A = 512 the old
Domino step needs ~30 GB, more than this 23 GB machine; ``--anchors 512`` runs it where it fits).

Method: every (method, path) case runs in a fresh subprocess (``python -m lit_domino.studies.memory``) that builds
the random target, the drafter and the batch, then runs one step (online target features without the
LM head, forward, loss, backward, AdamW step). The figure is the process's peak resident set
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, which covers every allocation since the process started,
so setup is included; setup is ~0.3 GB here and far below either step's peak); ``step Δ`` subtracts the
RSS just before the step. Large tensors are mmap'ed by the allocator and returned to the OS when freed,
so the peak RSS tracks the peak of live tensors. Cases run one after another (each alone in its process).

    python experiments/memory_bench.py                       # table + results/memory_bench.json
    python experiments/memory_bench.py --anchors 64 --methods backbone,domino
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.memory_bench import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
