"""What a benchmark row is and what it is called, torch-free (the commands and the eval callback import it).

:class:`MethodKey`: the typed key of a decoded method (drafter, seed, view, pool, DLoop gate, tree), carried
by every row (``row["key"]``) and rendered into the one label tables and MLflow show (:meth:`MethodKey.label`);
nothing parses a label back.

:func:`drafter_metrics`: the documented names ``{benchmark}/tau``, ``{benchmark}/speedup``, ...,
``acc_rate_pos_{k:02d}``, and their means over benchmarks under the bare names; :func:`row_metrics`: one
metric per row and key, any naming.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from lit_domino.runtime.jsonio import finite

@dataclass(frozen=True)
class MethodKey:
    """Which method a benchmark row measured. The study that decodes names its drafters with keys; the harness
    adds the decode settings (``pool``, ``gate``) and writes :meth:`as_dict` into each row."""

    drafter: str
    """The drafter's name: a study variant (``domino``) or a ``--drafters`` name."""
    seed: int | None = None
    """The training seed of a study's drafter (None: not a seeded study drafter)."""
    view: str | None = None
    """A view of the drafter decoded instead of the whole (``"backbone"``: Domino without its head)."""
    pool: int | None = None
    """The candidate pool P the head decoded with (None: the full vocabulary, the exact head)."""
    gate: str | None = None
    """The DLoop gate (``dloop_label``; None: no loop)."""
    tree: str | None = None
    """The tree verification setting (None: a chain)."""

    def label(self) -> str:
        """The one rendering tables, MLflow names and progress bars use: ``domino/s0/backbone+pool(64)+dloop(...)``."""
        out = self.drafter + (f"/s{self.seed}" if self.seed is not None else "") + (f"/{self.view}" if self.view else "")
        out += f"+pool({self.pool})" if self.pool is not None else ""
        out += f"+dloop({self.gate})" if self.gate is not None else ""
        return out + (f"+tree({self.tree})" if self.tree is not None else "")

    def base(self) -> "MethodKey":
        """The drafter itself: this key without its decode settings (pool, gate, tree)."""
        return replace(self, pool=None, gate=None, tree=None)

    def whole(self) -> "MethodKey":
        """The whole drafter this key views (``view`` dropped)."""
        return replace(self, view=None)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, key: "MethodKey | str | Mapping") -> "MethodKey":
        """A key from a key, a bare drafter name, or :meth:`as_dict`'s dict (a row's ``key``)."""
        if isinstance(key, MethodKey):
            return key
        if isinstance(key, str):
            return cls(key)
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in key.items() if k in names})


COMPILED_AR = "ar_compiled"
"""The compiled plain decoder's benchmark row (``benchmark(compiled_baseline=True)``): the baseline of
``speedup_vs_compiled_ar``, where ``speedup`` is over the eager plain decoder (row ``ar``)."""
POSITIONS = "acc_rate_pos_*"
"""Every per-position acceptance rate of a row (``acc_rate_pos_01``, ``acc_rate_pos_02``, ...)."""
DECODE_KEYS = ("tau", "speedup", "speedup_vs_compiled_ar", "speedup_vs_hf_generate", "tpot_ms", "accepted_per_round",
               "backbone_tau", POSITIONS)
"""Keys logged per benchmark (``{benchmark}/{key}``). ``speedup`` is over the eager plain decoder,
``speedup_vs_compiled_ar`` over the compiled one (where the study ran it)."""
MEAN_KEYS = ("tau", "speedup", "speedup_vs_compiled_ar", "speedup_vs_hf_generate", "tpot_ms", "accepted_per_round",
             POSITIONS)
"""Keys logged as their mean over benchmarks under the bare name (``backbone_tau`` only per benchmark)."""


def _expand(keys: Iterable[str], rows: Iterable[Mapping]) -> list[str]:
    """``keys`` with each ``prefix*`` replaced by the rows' keys of that prefix (sorted)."""
    rows = list(rows)
    out = []
    for key in keys:
        if key.endswith("*"):
            out += sorted({k for r in rows for k in r if k.startswith(key[:-1])})
        else:
            out.append(key)
    return out


def row_metrics(rows: Iterable[Mapping], keys: Sequence[str], by: str | Callable[[Mapping], Any] = "benchmark",
                sep: str = "/") -> dict[str, float]:
    """One metric per row and key: ``sep.join(by(row) parts + [key])`` → float, non-finite values skipped.

    ``by``: a row key (``"benchmark"``) or a function of the row giving a name part or a tuple of parts;
    a key ending in ``*`` stands for every key of the row with that prefix. Rows that share a name: last wins.
    """
    out: dict[str, float] = {}
    for r in rows:
        parts = r[by] if isinstance(by, str) else by(r)
        parts = tuple(parts) if isinstance(parts, (tuple, list)) else (parts,)
        for key in _expand(keys, [r]):
            if finite(r.get(key)):
                out[sep.join(str(p) for p in (*parts, key))] = float(r[key])
    return out


def drafter_metrics(rows: Iterable[Mapping], *, keys: Sequence[str] = DECODE_KEYS,
                    mean_keys: Sequence[str] = MEAN_KEYS, overall: Mapping | None = None,
                    by: str | Callable[[Mapping], Any] = "benchmark") -> dict[str, float]:
    """One drafter's benchmark rows → its MLflow metrics, non-finite values skipped.

    ``{benchmark}/{key}`` for ``keys`` (per-position rates included), then the bare ``mean_keys``: the mean
    over the rows (one per benchmark) of the finite values, or, with ``overall`` (a summary pooled over all
    prompts), that row's values. Pass only the drafter's rows (one temperature, one row per benchmark).
    """
    rows = list(rows)
    metrics = row_metrics(rows, keys, by)
    source = rows if overall is None else [overall]
    for key in _expand(mean_keys, source):
        values = [float(r[key]) for r in source if finite(r.get(key))]
        if values:
            metrics[key] = sum(values) / len(values)
    return metrics
