"""A decode-time cost model measured on the running machine: what a round costs, to weigh drafting more.

``round_time(stages, verified)`` = ``draft_first + (stages - 1) · draft_next + verify(verified) + other``:

* ``verify(w)``: one target forward of w tokens on a KV cache (the anchor and w - 1 drafts): the target's
  verify-cost curve (:class:`~lit_domino.decoding.cost.VerifyCost`, measured by
  :func:`~lit_domino.decoding.cost.measure_verify_cost`, the one a tree round prices its nodes with) at
  ``w - 1`` nodes, so the two read one interpolation rule (:meth:`~lit_domino.decoding.cost.VerifyCost.seconds_at`:
  linear between the measured widths, from the last two beyond them);
* ``draft_first`` / ``draft_next``: a first stage (the committed tokens' features fused, the block drafted) and a
  DLoop stage (drafted on the previous stage's hidden states) of ``block_size - 1`` tokens, each with the gate's
  read of the acceptance predictor the gate is given (or the drafter's own head's; what a predictor gate pays at
  every stage);
* ``other``: the round's rollback and bookkeeping (the target cache's crop and the session's extend).

Measured once per target, dtype, device, drafter and predictor read (:func:`resolve`), cached under the artifact root
(``cost_models/``) as JSON with the key it was measured under, printed when measured. A cache whose key
differs from the running setup (another target, dtype, device, drafter, thread count) is re-measured; an
explicit file measured elsewhere is refused; a file of an older format is re-measured. Shared by every gate or
tree that needs to price a verify width: :attr:`CostModel.curve` is a tree round's ``TreeConfig(cost=...)``
(its ``draft_s`` the first stage's draft time) where a drafter is at hand.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from lit_domino.decoding.cost import VerifyCost, measure_verify_cost
from lit_domino.runtime import cache
from lit_domino.runtime.command import UsageError

COST_FORMAT = 7
"""7: the predictor's read timed alone besides (:attr:`CostModel.read_s`, what the cost gate weighs a read against);
6: the predictor read as the gate now reads it (``survival_reader``, a cheaper read a stage); 5: a DLoop stage
timed alone (4: as a difference from a first stage, which read well under a stage's cost); 4: the parts timed
interleaved, 15 repeats (3: one part after another, 7 repeats: a load spike skewed one part); 3: the stages timed
with the gate's predictor read, on a 96-token context (2: without it, on 48 tokens: a DLoop stage cost more in the
default decode than the model measured, and the cost gate drafted stages that did not pay); older formats are
re-measured."""


class CostModelError(UsageError):
    """A cost model that cannot be used here: missing with no way to measure it, or measured elsewhere."""


@dataclass
class CostModel:
    """Seconds per round part on one machine (see the module docstring)."""

    curve: VerifyCost
    """The target's verify cost C_v(n), n = verify tokens - 1 (its ``draft_s`` is set to :attr:`draft_first_s`)."""
    draft_first_s: float
    """Median seconds of a round's first stage (block_size - 1 tokens)."""
    draft_next_s: float
    """Median seconds of one more DLoop stage."""
    other_s: float = 0.0
    """Median seconds of a round's rollback (target cache crop, session crop and extend)."""
    key: dict = field(default_factory=dict)
    """What it was measured for (:func:`cost_key`)."""
    read_s: float = 0.0
    """Median seconds of the gate's read of the acceptance predictor at one stage (included in both draft times;
    0 without a predictor): what a read must earn for the cost gate to keep reading (:mod:`lit_domino.decoding.gates`)."""

    def __post_init__(self):
        if not isinstance(self.curve, VerifyCost):
            raise TypeError(f"CostModel.curve must be a VerifyCost, got {type(self.curve).__name__} "
                            "(CostModel.of_widths builds one from widths in tokens)")
        # one draft time: a tree round priced with this curve drafts what a first stage does
        self.curve = replace(self.curve, draft_s=float(self.draft_first_s))

    @classmethod
    def of_widths(cls, widths: list[int], verify_s: list[float], draft_first_s: float, draft_next_s: float,
                  other_s: float = 0.0, key: dict | None = None, read_s: float = 0.0) -> "CostModel":
        """A cost model from verify times by width in tokens (``widths[i] - 1`` nodes)."""
        curve = VerifyCost(tuple(int(w) - 1 for w in widths), tuple(float(v) for v in verify_s))
        return cls(curve, draft_first_s, draft_next_s, other_s, dict(key or {}), read_s)

    @property
    def widths(self) -> list[int]:
        """Verify widths measured (tokens per target forward), increasing."""
        return [n + 1 for n in self.curve.widths]

    @property
    def verify_s(self) -> list[float]:
        """Seconds of one target forward at each of :attr:`widths`."""
        return list(self.curve.seconds)

    def verify(self, width: int) -> float:
        """Seconds of a target forward of ``width`` tokens: C_v(width - 1)."""
        return self.curve.seconds_at(width - 1)

    def draft(self, stages: int) -> float:
        """Seconds of drafting ``stages`` stages (none: 0)."""
        return self.draft_first_s + (stages - 1) * self.draft_next_s if stages > 0 else 0.0

    def round_time(self, stages: int, verified: int) -> float:
        """Seconds of a round of ``stages`` stages whose verify forward sees ``verified`` tokens."""
        return self.draft(stages) + self.verify(verified) + self.other_s

    def describe(self) -> str:
        ver = ", ".join(f"{w}: {1e3 * s:.2f}" for w, s in zip(self.widths, self.verify_s))
        return (f"cost model ({self.key.get('target', '?')}, {self.key.get('dtype', '?')}, "
                f"{self.key.get('device_name', '?')}): draft {1e3 * self.draft_first_s:.2f} ms first stage, "
                f"{1e3 * self.draft_next_s:.2f} ms per further stage (each with a {1e3 * self.read_s:.3f} ms predictor "
                f"read); verify ms by width {{{ver}}}; other {1e3 * self.other_s:.2f} ms")

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": COST_FORMAT, "verify": {"nodes": list(self.curve.widths), "seconds": list(self.curve.seconds)},
                "draft_first_s": self.draft_first_s, "draft_next_s": self.draft_next_s, "other_s": self.other_s,
                "read_s": self.read_s, "key": self.key}
        cache.write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            if data.pop("format", None) != COST_FORMAT:
                raise ValueError(f"not format {COST_FORMAT}")
            verify = data.pop("verify")
            curve = VerifyCost(tuple(verify["nodes"]), tuple(verify["seconds"]))
            model = cls(curve, **data)
        except FileNotFoundError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, OSError) as err:
            raise CostModelError(f"the cost model {path} cannot be read ({err}); delete it to re-measure") from None
        return model


def device_name(device: torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}:{torch.get_num_threads()}threads"


def cost_key(target, drafter, block_size: int, predictor=None) -> dict:
    """What a cost model depends on: the target (fingerprint, dtype), the device (its name, the thread count on
    a CPU), the drafter (:func:`~lit_domino.decoding.acceptance.drafter_key`), the block size and the predictor a
    stage reads (none, the drafter's own head, or an add-on head and its inputs): ``predictor``, None for the
    drafter's own head's where it has one (:func:`~lit_domino.decoding.acceptance.predictor_of`, as ``generate``)."""
    from lit_domino.decoding.acceptance import drafter_key, predictor_of

    fp = target.fingerprint()
    pred = predictor_of(drafter, predictor)
    reads = "none" if pred is None else "own" if pred.head is None else f"addon:{pred.head.input_kind}"
    return {"target": str(getattr(target, "name", "?")), "target_fingerprint": cache.config_hash(fp),
            "dtype": str(target.model.dtype).replace("torch.", ""), "device": str(torch.device(target.device).type),
            "device_name": device_name(target.device), "drafter": drafter_key(drafter), "block_size": int(block_size),
            "predictor": reads}


def _interleaved(parts: dict, repeats: int, sync) -> dict[str, list[float]]:
    """Seconds of each of ``parts`` (name -> callable), every repeat timing each part once in turn (after one untimed
    warm-up of each): a load spike on a shared machine then lands on every part of a repeat alike, and a part's
    difference from another is taken repeat by repeat. A part that returns a number has timed itself (the part
    of it that counts, after an untimed set-up)."""
    for fn in parts.values():
        fn()
    times = {name: [] for name in parts}
    for _ in range(repeats):
        for name, fn in parts.items():
            sync()
            t = time.perf_counter()
            own = fn()
            sync()
            times[name].append(own if isinstance(own, float) else time.perf_counter() - t)
    return times


def _median_excess(times: dict[str, list[float]], part: str, base: str) -> float:
    """The median over repeats of ``part``'s time minus ``base``'s in the same repeat (at least 0)."""
    return max(0.0, statistics.median(a - b for a, b in zip(times[part], times[base])))


@torch.inference_mode()
def measure(target, drafter, block_size: int, max_stages: int = 4, repeats: int = 15, context: int = 96,
            seed: int = 0, predictor=None) -> CostModel:
    """Measure a :class:`CostModel` on this machine with the real target and drafter (eager, dynamic cache):
    a ``context``-token random prompt (about the embedded prompts' length plus half of a 128-token answer), the
    parts timed ``repeats`` times interleaved (:func:`_interleaved`; medians, a round's rollback as a paired
    difference, a DLoop stage timed alone after an untimed first stage); a stage includes the read of ``predictor``
    (None: the drafter's own head's where it has one, :func:`~lit_domino.decoding.acceptance.predictor_of`).
    Measured one part after another, a load spike during one part skewed it alone: a default-preset model read a
    rollback many times its quiet cost."""
    from lit_domino.decoding.acceptance import predictor_of
    from lit_domino.decoding.round import TargetRunner, feature_layers
    from lit_domino.target.load import select_features

    drafter.bind_target(target)
    dev = torch.device(target.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    K = block_size - 1
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, target.vocab_size, (context,), generator=g).to(dev)
    layers = feature_layers(drafter)
    # the verify part: the tree rounds' curve at n = tokens - 1 nodes (the anchor alone, one draft, each stage's)
    nodes = tuple(sorted({0, 1, *(s * K for s in range(1, max_stages + 1))}))
    curve = measure_verify_cost(target, nodes, context=context, repeats=repeats, verbose=False,
                                hidden=layers is not None)
    runner = TargetRunner(target, context + 2, False, False)
    out = runner.prefill(prompt, layers is not None)
    feats = select_features(out.hidden_states, layers)[0] if layers is not None else None
    was = drafter.training
    drafter.eval()
    try:
        session = drafter.new_session()
        session.extend(prompt[:-1], None if feats is None else feats[:-1])
        anchor = prompt[-1:]
        last = (prompt[-1:], None if feats is None else feats[-1:])
        predictor = predictor_of(drafter, predictor)
        read = None if predictor is None else predictor.survival_reader(drafter)

        def stage(stage_anchor, offset):  # one stage as a predictor gate drafts it: the block, then its survivals
            st = session.draft(stage_anchor, K)
            if read is not None:
                read(session.stages[-1].hidden, stage_anchor, st.tokens, offset)
            return st

        def first():
            session.crop(context - 2)
            session.extend(*last)  # a round's committed token, whose features the first stage fuses
            return stage(anchor, 0)

        def nxt() -> float:  # the same first stage (untimed), then one more: the DLoop stage alone
            after = first().tokens[-1:]
            sync()
            t = time.perf_counter()
            stage(after, K)
            sync()
            return time.perf_counter() - t

        def read_alone() -> float:  # the same first stage (untimed), then the predictor's read of it alone
            st = first()
            if read is None:
                return 0.0
            hidden = session.stages[-1].hidden
            sync()
            t = time.perf_counter()
            read(hidden, anchor, st.tokens, 0)
            sync()
            return time.perf_counter() - t

        def verify():  # a forward of 2 tokens, what other() runs besides the rollback
            runner.forward(prompt[:2], False)
            runner.crop(context)

        def other():
            verify()
            session.crop(context - 2)
            session.extend(*last)

        times = _interleaved({"first": first, "next": nxt, "read": read_alone, "verify": verify, "other": other},
                             repeats, sync)
    finally:
        drafter.train(was)
    return CostModel(curve, statistics.median(times["first"]), statistics.median(times["next"]),
                     _median_excess(times, "other", "verify"), cost_key(target, drafter, block_size, predictor),
                     statistics.median(times["read"]))


_MEMO: dict[str, CostModel] = {}


def cache_path(key: dict, root: Path | None = None) -> Path:
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in key["target"])
    return (root or cache.cache_root()) / "cost_models" / f"{name}-{cache.config_hash(key)}.json"


def resolve(target, drafter, block_size: int, source: str | None = None, max_stages: int = 4,
            root: Path | None = None, log=None, predictor=None) -> CostModel:
    """The cost model for this target, drafter (with the read of ``predictor``, :func:`cost_key`), dtype and device:
    ``source`` None = this process's, else the artifact cache's, else measured now (cached and printed);
    ``"cached"`` = the cache only; a path = that file, refused when measured for another setup
    (:class:`CostModelError`)."""
    key = cost_key(target, drafter, block_size, predictor)
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if source not in (None, "cached"):
        path = Path(source).expanduser()
        if not path.is_file():
            raise CostModelError(f"the cost model {path} does not exist (DLoopConfig.cost_model)")
        model = CostModel.load(path)
        diff = sorted(k for k in key if model.key.get(k) != key[k])
        if diff:
            raise CostModelError(f"the cost model {path} was measured for another setup ({', '.join(diff)} differ: "
                                 f"{ {k: model.key.get(k) for k in diff} } vs { {k: key[k] for k in diff} }); "
                                 "measure one here (DLoopConfig(gate='cost') without cost_model)")
        return model
    tag = cache.config_hash(key)
    if tag in _MEMO:
        return _MEMO[tag]
    path = cache_path(key, root)
    model = None
    if path.is_file():
        try:
            model = CostModel.load(path)
            if model.key != key:  # a cache from another target or device under a colliding name: re-measure
                log(f"cost model {path} was measured for another setup; re-measuring")
                model = None
        except CostModelError as err:
            log(f"{err}; re-measuring")
            model = None
    if model is None:
        if source == "cached":
            raise CostModelError(f"no cost model was measured for this setup ({key['target']}, {key['dtype']}, "
                                 f"{key['device_name']}, drafter {key['drafter']}, B = {block_size}) and "
                                 "cost_model='cached' forbids measuring one: run once without it")
        model = measure(target, drafter, block_size, max_stages=max_stages, predictor=predictor)
        model.save(path)
        log(f"measured {model.describe()} -> {path}")
    _MEMO[tag] = model
    return model
