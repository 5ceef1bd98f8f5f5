"""Behaviour snapshots before/after a refactor (``lit_domino.studies.parity``)::

    python experiments/parity.py capture before.json [--preset smoke]
    python experiments/parity.py compare before.json after.json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_domino.studies.parity import main  # noqa: E402  (imports no torch: main parses first)

if __name__ == "__main__":
    main()
