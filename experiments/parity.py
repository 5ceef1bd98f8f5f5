"""Behaviour snapshots before/after a refactor (``lit_domino.studies.parity``)::

    python experiments/parity.py capture before.json [--preset smoke]
    python experiments/parity.py compare before.json after.json
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from lit_domino.studies.parity import main  # noqa: E402

if __name__ == "__main__":
    main()
