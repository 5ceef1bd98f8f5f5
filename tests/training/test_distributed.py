"""The launch of distributed trainings (``lit_domino.training.distributed``): every rank of a node starts at once,
with the variables Lightning's own launcher gives its ranks, and one failed rank stops the others. The trainings
themselves run end to end in tests/test_rehearsal.py (DDP, two processes)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lit_domino.training import distributed


def ddp(devices, **trainer) -> dict:
    return {"trainer": {"strategy": "ddp", "devices": devices, **trainer}}


def test_every_rank_of_one_node_starts_with_lightnings_variables():
    envs = distributed._rank_envs([ddp(2), ddp("2")], {"PATH": "p"})
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert all(e["WORLD_SIZE"] == "2" and e["NODE_RANK"] == "0" and e["PATH"] == "p" for e in envs)
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"] and envs[0]["MASTER_ADDR"] == "127.0.0.1"
    assert len(distributed._rank_envs([ddp([0, 1, 2])], {})) == 3


@pytest.mark.parametrize("configs", [[ddp("auto")], [ddp(-1)], [ddp(2, num_nodes=2)], [ddp(2), ddp(4)]])
def test_what_lightning_must_count_or_spread_is_one_process_it_launches_from(configs):
    """Devices it counts itself, several nodes, or ranks that differ between the configs: one process, no rank
    variables (Lightning's launcher starts the other ranks, as before)."""
    assert distributed._rank_envs(configs, {"PATH": "p"}) == [{"PATH": "p"}]


def test_a_failed_rank_stops_the_others_at_once():
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    t0 = time.monotonic()
    assert distributed._wait_all([waiting, failing], timeout=50) == 3
    assert time.monotonic() - t0 < 30 and waiting.poll() is not None  # stopped, not waited out


def test_ranks_that_all_finish_are_a_success_and_a_hung_one_times_out():
    done = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    assert distributed._wait_all(done, timeout=50) == 0
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            distributed._wait_all([hung], timeout=0.5)
    finally:
        distributed._stop([hung])
    assert hung.poll() is not None
