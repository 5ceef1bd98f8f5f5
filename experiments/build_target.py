"""Build an embedded target from its recipe (cached, resumable), and optionally ship it with the package.

    python experiments/build_target.py --preset large              # build (or reuse) embedded:large@recipe
    python experiments/build_target.py --preset large --ship       # ... and write lit_domino/assets/targets/large

The shipped copy is what ``load_target("embedded:large")`` loads; see lit_domino/target/embedded.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.target.build_target import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
