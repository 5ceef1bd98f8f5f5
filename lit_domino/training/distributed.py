"""Trainings under a multi-process strategy (``trainer.strategy: ddp`` with several devices), in a script of their own.

Lightning's DDP launcher starts each extra rank by running the calling script again (``sys.argv``) with
``LOCAL_RANK`` set. A study that trains inside its own command (the ablation) would have every extra rank re-run
the whole study: regenerate, open a second study run, decode and write the tables twice, or start the study's
training workers again. So a distributed training runs here instead: :func:`train_distributed` starts every rank
of this node at once, each ``python -m lit_domino.training.distributed SPEC OUT`` with the variables Lightning's
launcher gives a rank (``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``), so Lightning starts none (its
launcher started them inside rank 0's first fit: their imports ran while rank 0 waited). Every rank trains the
configs one after another (:func:`lit_domino.training.experiment.train_variant`: rank 0 builds and writes each
artifact and owns its MLflow run, the other ranks join each fit and write nothing); the launch returns what rank 0
trained; a failed rank stops the others. Optionally the fits decode held-out prompts at every validation epoch
and at fit end (:class:`~lit_domino.training.callbacks.SpeculativeEvalCallback`: rank 0 decodes, every rank logs
its result).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lit_domino.runtime.paths import PACKAGE_DIR

MULTI_PROCESS = ("ddp", "fsdp", "deepspeed")
"""Strategy names (prefixes: ``ddp_find_unused_parameters_true`` too) that start one process per device."""


def is_distributed(cfg: dict) -> bool:
    """Whether a training config starts several processes (a DDP-family strategy on more than one device)."""
    trainer = cfg.get("trainer") or {}
    strategy = str(trainer.get("strategy") or "auto")
    devices, nodes = trainer.get("devices", 1), int(trainer.get("num_nodes") or 1)
    many = nodes > 1 or devices in (-1, "auto") or (isinstance(devices, (list, tuple)) and len(devices) > 1) or (
        isinstance(devices, int) and devices > 1) or (isinstance(devices, str) and devices.isdigit() and int(devices) > 1)
    return many and strategy.startswith(MULTI_PROCESS)


def _devices(cfg: dict):
    """``trainer.devices`` of ``cfg`` (1 when unset)."""
    return (cfg.get("trainer") or {}).get("devices", 1)


def counted_devices(cfg: dict) -> bool:
    """Whether ``cfg``'s ``trainer.devices`` is a number or a list (``auto`` and ``-1`` are Lightning's to count)."""
    devices = _devices(cfg)
    return isinstance(devices, (list, tuple)) or str(devices).isdigit()


def world_size(cfg: dict) -> int:
    """Processes one node starts for ``cfg`` (its ``trainer.devices`` when a number, else 1)."""
    devices = _devices(cfg)
    if isinstance(devices, (list, tuple)):
        return len(devices)
    return int(devices) if counted_devices(cfg) else 1


def train_distributed(configs: list[dict], experiment: str, *, parent_run_id: str | None = None,
                      eval_prompts: dict[str, list[list[int]]] | None = None, eval_max_new_tokens: int = 16,
                      progress: bool = False, threads: int | None = None, timeout: float | None = None) -> list:
    """Train (or find cached) every config under its multi-process strategy, in one launch of this module; returns
    the :class:`~lit_domino.training.experiment.TrainedDrafter` list in config order (rank 0's results).

    ``eval_prompts``: ``{domain: [token ids, ...]}`` decoded by the eval callback (``eval_max_new_tokens`` each);
    None: no eval callback. ``threads``: torch threads per rank (default: the usable CPUs over the ranks).
    A failed launch raises ``RuntimeError`` naming the log; the cached artifacts of the trainings that finished
    are kept (a rerun reuses them)."""
    from lit_domino.runtime.threads import usable_cpus
    from lit_domino.runtime import cache
    from lit_domino.training.experiment import TrainedDrafter

    if not configs:
        return []
    from lit_domino.training.experiment import _cached, drafter_artifact

    paths = [drafter_artifact(c) for c in configs]
    if all(cache.is_complete(p, warn=False) for p in paths):  # nothing to train: no launch (its ranks import for seconds)
        return [_cached(p, c["tracking"]["variant"], c["tracking"].get("preset"), int(c["seed_everything"]))
                for p, c in zip(paths, configs)]
    ranks = max(world_size(c) for c in configs)
    threads = threads or max(1, usable_cpus() // ranks)
    work = Path(tempfile.mkdtemp(prefix="ddp-", dir=cache.cache_root()))
    spec = {"configs": configs, "experiment": experiment, "parent_run_id": parent_run_id, "progress": progress,
            "threads": threads, "eval": {"prompts": eval_prompts, "max_new_tokens": eval_max_new_tokens}}
    (work / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(p for p in (str(PACKAGE_DIR.parent), os.environ.get("PYTHONPATH")) if p)}
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a launch of its own, whatever launched this process
    log = work / "launch.log"
    cmd = [sys.executable, "-m", __name__, str(work / "spec.json"), str(work / "out.json")]
    with open(log, "wb") as out:
        procs = [subprocess.Popen(cmd, env=rank_env, stdout=None if progress else out, stderr=subprocess.STDOUT if
                                  not progress else None, start_new_session=False)
                 for rank_env in _rank_envs(configs, env)]
        try:
            rc = _wait_all(procs, timeout)
        except BaseException:  # Ctrl-C reached the launch too (same process group): let it stop, then go
            _stop(procs)
            raise
    result = work / "out.json"
    if rc != 0 or not result.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:]) if log.is_file() else ""
        raise RuntimeError(f"the {ranks}-process training launch failed (rc {rc}; log {log}):\n{tail}")
    done = json.loads(result.read_text())
    return [TrainedDrafter(d["variant"], d["preset"], d["seed"], Path(d["drafter_dir"]), d["report"], d["run_id"],
                           d["from_cache"]) for d in done]


def _rank_envs(configs: list[dict], env: dict) -> list[dict]:
    """The environment of each process to start: one per rank of this node when every config runs the same number
    of processes on one node (the variables of Lightning's own launcher), else one process whose Lightning
    starts the others (several nodes, ``devices: auto``: what it counts, this module does not)."""
    from lit_domino.runtime.serving import free_port

    sizes = {world_size(c) for c in configs}
    one_node = all(int((c.get("trainer") or {}).get("num_nodes") or 1) == 1 for c in configs)
    if len(sizes) != 1 or not one_node or not all(map(counted_devices, configs)) or sizes == {1}:
        return [env]
    ranks = sizes.pop()
    common = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NODE_RANK": "0",
              "WORLD_SIZE": str(ranks)}
    return [{**common, "LOCAL_RANK": str(rank)} for rank in range(ranks)]


def _wait_all(procs: list, timeout: float | None) -> int:
    """Wait for every rank; the first that fails stops the others (they would wait for it in a collective).
    Returns 0, or the failed rank's exit status; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:
            _stop(procs)
            return failed
        if all(c == 0 for c in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(procs[0].args, timeout)
        time.sleep(0.2)


def _stop(procs: list) -> None:
    """Terminate the ranks still running and wait for each."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        p.wait()


def eval_callbacks(spec: dict) -> list:
    """The eval callback of a launch spec (``spec["eval"]``: prompts, max_new_tokens); none without prompts."""
    prompts = (spec.get("eval") or {}).get("prompts")
    if not prompts:
        return []
    from lit_domino.training.callbacks import SpeculativeEvalCallback

    first = next(iter(prompts.values()))
    return [SpeculativeEvalCallback(prompts, num_prompts=len(first), max_new_tokens=int(spec["eval"]["max_new_tokens"]),
                                    plots=True)]


def _run(spec_path: str, out_path: str) -> None:
    """Every rank: train each config of the spec in order; rank 0 writes the results."""
    import torch

    from lit_domino.training.experiment import is_rank_zero, train_variant

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec["threads"]))
    done = []
    for cfg in spec["configs"]:
        # a fresh callback per fit: its last results belong to one drafter
        t = train_variant(cfg, experiment=spec["experiment"], parent_run_id=spec.get("parent_run_id"),
                          progress=bool(spec.get("progress")), callbacks=eval_callbacks(spec))
        done.append({"variant": t.variant, "preset": t.preset, "seed": t.seed, "drafter_dir": str(t.drafter_dir),
                     "report": t.report, "run_id": t.run_id, "from_cache": t.from_cache})
    if is_rank_zero():
        tmp = Path(out_path).with_suffix(".tmp")
        tmp.write_text(json.dumps(done))
        tmp.replace(out_path)


if __name__ == "__main__":
    _run(*sys.argv[1:3])
