"""The shared study layer: strict JSON, cached rows, benchmark rows → metrics, thread pinning."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_domino.runtime import cache
from lit_domino.studies.common import cached_rows, decode_code_version, log_metrics, rows_key
from lit_domino.decoding.metric_names import drafter_metrics, row_metrics
from lit_domino.runtime.threads import pinned_threads
from lit_domino.runtime.jsonio import to_json, write_json

NAN, INF = float("nan"), float("inf")


def strict_loads(text: str):
    """json.loads that refuses NaN / Infinity (which Python's json accepts by default)."""
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# --------------------------------------------------------------------------- JSON


def test_to_json_is_strict_and_converts_numbers_and_paths(tmp_path):
    obj = {"tau": NAN, "inf": INF, "ninf": -INF, "ok": 1.5, "n": 3, "flag": True, "none": None,
           "np32": np.float32(0.25), "np_nan": np.float64(NAN), "np_int": np.int64(7), "arr": np.array([1.0, NAN]),
           "t": torch.tensor(2.5), "t_nan": torch.tensor(NAN), "path": Path("/a/b"), "pair": (1.0, NAN),
           "nested": [{"x": (NAN,)}], 3: "int key"}
    out = to_json(obj)
    assert out == {"tau": None, "inf": None, "ninf": None, "ok": 1.5, "n": 3, "flag": True, "none": None,
                   "np32": 0.25, "np_nan": None, "np_int": 7, "arr": [1.0, None], "t": 2.5, "t_nan": None,
                   "path": "/a/b", "pair": [1.0, None], "nested": [{"x": [None]}], "3": "int key"}
    assert type(out["np_int"]) is int and type(out["np32"]) is float
    json.dumps(out, allow_nan=False)  # strict: raises on any NaN left
    path = write_json(obj, tmp_path / "sub" / "x.json")
    back = strict_loads(path.read_text())
    assert back == out
    with pytest.raises(ValueError):
        strict_loads(json.dumps({"tau": NAN}))  # the checker itself catches bare NaN


def test_to_json_convert_hook():
    cell = lambda x: {"mean": x[0], "spread": x[1]} if isinstance(x, tuple) and len(x) == 2 else x  # noqa: E731
    assert to_json({"a": (1.0, NAN), "b": [(2.0, 0.0)]}, convert=cell) == {
        "a": {"mean": 1.0, "spread": None}, "b": [{"mean": 2.0, "spread": 0.0}]}


def test_table_json_is_strict(tmp_path):
    from lit_domino.studies.tables import main_table, write_table

    records = [{"variant": "domino", "seed": 0, "domain": "math", "tau": 3.0, "speedup": NAN}]
    table = main_table(records, ["math"])
    _, js = write_table(table, tmp_path, "main")
    row = strict_loads(js.read_text())["rows"][0]
    assert row["math/tau"] == {"mean": 3.0, "spread": 0.0}
    assert row["math/speedup"] == {"mean": None, "spread": None}


# --------------------------------------------------------------------------- cached rows


@pytest.fixture
def evals_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


ROWS = [{"benchmark": "math", "drafter": None, "tau": 2.5, "speedup": NAN, "hist": [0, 3, 1]},
        {"benchmark": "code", "drafter": "d/s0", "tau": INF, "speedup": 1.25, "x": {"y": -INF}}]


def same_rows(a, b) -> bool:
    """Equal, NaN included (json.dumps writes NaN as NaN and None as null, so they stay apart)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_cached_rows_reuses_then_recomputes_on_another_key(evals_cache):
    calls, reused = [], []

    def compute():
        calls.append(1)
        return [dict(r) for r in ROWS]

    first = cached_rows({"plan": 1}, "study-test", compute, on_reuse=lambda: reused.append(1))
    assert len(calls) == 1 and not reused and same_rows(first, ROWS)
    directory = cache.artifact_dir("evals", rows_key({"plan": 1}), name="study-test")
    assert cache.is_complete(directory) and directory.parent.name == "evals"
    on_disk = strict_loads((directory / "rows.json").read_text())  # strict JSON: NaN/inf written as null
    assert on_disk[0]["speedup"] is None and on_disk[1]["tau"] is None and on_disk[0]["drafter"] is None

    again = cached_rows({"plan": 1}, "study-test", compute, on_reuse=lambda: reused.append(1))
    assert len(calls) == 1 and reused == [1]
    assert same_rows(again, ROWS)  # NaN and ±inf come back as computed, the real None stays None
    assert math.isnan(again[0]["speedup"]) and again[1]["tau"] == INF and again[1]["x"]["y"] == -INF
    assert again[0]["drafter"] is None

    cached_rows({"plan": 2}, "study-test", compute)
    assert len(calls) == 2


def test_cached_rows_are_measured_again_when_the_decoding_code_changes(evals_cache, monkeypatch):
    """A warm cache never serves rows that other decoding code measured (the source of the decoding, models and target
    packages is in the key)."""
    from lit_domino.studies import common

    calls = []
    compute = lambda: calls.append(1) or [dict(r) for r in ROWS]  # noqa: E731
    cached_rows({"plan": 1}, "study-code", compute)
    cached_rows({"plan": 1}, "study-code", compute)
    assert len(calls) == 1
    monkeypatch.setattr(common, "decode_code_version", lambda: "another-engine")
    cached_rows({"plan": 1}, "study-code", compute)
    assert len(calls) == 2
    assert len(common.DECODE_PACKAGES) == 3 and len(decode_code_version()) == 16


def test_cached_rows_reads_files_written_before_strict_json(evals_cache):
    key = {"plan": "old"}
    directory = cache.artifact_dir("evals", rows_key(key), name="old")
    directory.mkdir(parents=True)
    (directory / "rows.json").write_text(json.dumps(ROWS, indent=1))  # bare NaN / Infinity, no nonfinite.json
    cache.mark_complete(directory, rows_key(key))
    rows = cached_rows(key, "old", lambda: pytest.fail("complete rows must be reused"))
    assert same_rows(rows, ROWS) and math.isnan(rows[0]["speedup"])


# --------------------------------------------------------------------------- metrics


def hand_rows():
    return [
        {"benchmark": "math", "kind": "drafter", "tau": 3.0, "speedup": 2.0, "speedup_vs_hf_generate": NAN,
         "tpot_ms": 10.0, "accepted_per_round": 2.0, "backbone_tau": 2.5, "acc_rate_pos_01": 0.8,
         "acc_rate_pos_02": 0.5, "match_baseline": 1.0, "rounds": 7},
        {"benchmark": "code", "kind": "drafter", "tau": 5.0, "speedup": INF, "speedup_vs_hf_generate": 3.0,
         "tpot_ms": 20.0, "accepted_per_round": 4.0, "backbone_tau": None, "acc_rate_pos_01": 0.6},
    ]


def test_drafter_metrics_exact_values_skip_non_finite():
    metrics = drafter_metrics(hand_rows())
    assert metrics == {
        "math/tau": 3.0, "math/speedup": 2.0, "math/tpot_ms": 10.0, "math/accepted_per_round": 2.0,
        "math/backbone_tau": 2.5, "math/acc_rate_pos_01": 0.8, "math/acc_rate_pos_02": 0.5,
        "code/tau": 5.0, "code/speedup_vs_hf_generate": 3.0, "code/tpot_ms": 20.0,
        "code/accepted_per_round": 4.0, "code/acc_rate_pos_01": 0.6,
        # means over benchmarks of the finite values; backbone_tau only per benchmark
        "tau": 4.0, "speedup": 2.0, "speedup_vs_hf_generate": 3.0, "tpot_ms": 15.0, "accepted_per_round": 3.0,
        "acc_rate_pos_01": 0.7, "acc_rate_pos_02": 0.5,
    }
    assert all(type(v) is float for v in metrics.values())


def test_drafter_metrics_with_a_pooled_overall_row_and_own_keys():
    overall = {"tau": 3.5, "speedup": NAN, "tpot_ms": 99.0}
    metrics = drafter_metrics(hand_rows(), keys=("tau", "speedup"), mean_keys=("tau", "speedup"), overall=overall)
    assert metrics == {"math/tau": 3.0, "math/speedup": 2.0, "code/tau": 5.0, "tau": 3.5}


def test_row_metrics_names_by_parts():
    rows = [{"benchmark": "b:2", "method": "ar", "temperature": 0.0, "tau": NAN, "speedup": 1.0},
            {"benchmark": "b:2", "method": "x+dloop(-0.5:2)", "temperature": 1.0, "tau": 2.0, "speedup": 1.5}]
    out = row_metrics(rows, ("tau", "speedup"), by=lambda r: (r["benchmark"], r["method"], f"T{r['temperature']:g}"))
    assert out == {"b:2/ar/T0/speedup": 1.0, "b:2/x+dloop(-0.5:2)/T1/tau": 2.0, "b:2/x+dloop(-0.5:2)/T1/speedup": 1.5}
    assert row_metrics(rows[1:], ("tau",), by=lambda r: ("grid", r["method"]), sep=".") == {
        "grid.x+dloop(-0.5:2).tau": 2.0}


def test_log_metrics_batches_and_skips_non_finite():
    class Client:
        def __init__(self):
            self.batches = []

        def log_batch(self, run_id, metrics):
            self.batches.append((run_id, metrics))

    client = Client()
    metrics = {f"m{i}": float(i) for i in range(2500)} | {"nan": NAN, "inf": INF}
    assert log_metrics(client, "run", metrics) == 2500
    assert [len(m) for _, m in client.batches] == [1000, 1000, 500]
    logged = {m.key: m.value for _, batch in client.batches for m in batch}
    assert logged == {f"m{i}": float(i) for i in range(2500)} and {r for r, _ in client.batches} == {"run"}
    assert all(m.step == 0 for _, batch in client.batches for m in batch)


# --------------------------------------------------------------------------- threads


def test_pinned_threads_sets_and_restores():
    before = torch.get_num_threads()
    n = 1 if before != 1 else 2
    with pinned_threads(n):
        assert torch.get_num_threads() == n
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError):
        with pinned_threads(n):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with pinned_threads(None):
        assert torch.get_num_threads() == before
