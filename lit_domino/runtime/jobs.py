"""A job runner: jobs in spawned worker processes, a few at a time, that an interrupt stops as a whole.

:func:`run_in_workers` submits the jobs in order, ``workers`` at once, reports each one's start and end through
:class:`JobEvents` and, at a ``KeyboardInterrupt`` (here or in a worker), passes the stop signal on to every worker,
waits for the started jobs to stop (:data:`STOP_TIMEOUT` at most, or until a second Ctrl-C), kills what is left and
raises one ``KeyboardInterrupt``. What a job is, how a worker stops it and what a killed job leaves behind are the
caller's (the ablation's trainings: :mod:`lit_domino.studies.ablation_train`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a job (the workers' handlers are the caller's ``setup``)."""

STOP_TIMEOUT = 30.0
"""Seconds an interrupted runner waits for its started jobs to stop (a training stops at its next batch) before it
kills the workers."""

_STARTED = None
"""A worker's view of its parent's shared flags: ``_STARTED[i]`` = 1 once job ``i`` runs."""


class JobEvents:
    """What the caller does as the jobs start, end and stop (each method gets the job's index); the default is
    nothing. ``interrupted`` may raise to end the run (a job stopped alone stops the whole run)."""

    def start(self, i: int) -> None:
        """Job ``i`` is about to be submitted."""

    def done(self, i: int, result) -> None:
        """Job ``i`` returned ``result``."""

    def failed(self, i: int, err: BaseException) -> None:
        """Job ``i`` raised ``err`` (re-raised once the running jobs end)."""

    def interrupted(self, i: int, err: KeyboardInterrupt) -> None:
        """Job ``i`` stopped at an interrupt (while running, or while the runner stopped it)."""

    def finished_while_stopping(self, i: int) -> None:
        """Job ``i`` ended normally while the runner stopped it."""

    def failed_while_stopping(self, i: int, err: BaseException) -> None:
        """Job ``i`` raised ``err`` while the runner stopped it."""

    def killed(self, i: int) -> None:
        """Job ``i`` had started and did not stop in time: its worker was killed."""

    def never_started(self, i: int) -> None:
        """Job ``i`` was submitted but its worker was still starting when the runner stopped."""


def _worker_init(threads: int, started, setup: Callable[[], None] | None) -> None:
    """A worker: the caller's ``setup`` (its stop handlers, its logging), then the stop signals unblocked and
    ``threads`` torch threads."""
    import torch

    global _STARTED
    _STARTED = started
    if setup is not None:
        setup()
    # tqdm's default lock is a named semaphore: a worker killed at the end of an interrupted run (stop_workers)
    # left it to the resource tracker's "leaked semaphore" warning; a thread lock serves one process as well
    with contextlib.suppress(ImportError):
        import tqdm

        tqdm.tqdm.set_lock(threading.RLock())
    if hasattr(signal, "pthread_sigmask"):  # blocked by the parent while it started this process (signals_blocked)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    torch.set_num_threads(threads)


def _run_job(fn: Callable, index: int, args: tuple):
    _STARTED[index] = 1  # an interrupted parent waits for this job to stop (one not started it need not)
    return fn(*args)


@contextlib.contextmanager
def signals_blocked():
    """SIGINT and SIGTERM held back while the pool starts a worker: the worker inherits the blocked mask and lifts
    it once its handlers are in place (a Ctrl-C during its imports printed a traceback per worker); here they are
    delivered when the block ends."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_in_workers(fn: Callable, args: dict[int, tuple], order: list[int], workers: int, threads: int,
                   events: JobEvents, setup: Callable[[], None] | None = None,
                   stop_signal: Callable[[], int | None] = lambda: None, results: dict | None = None) -> dict:
    """``fn(*args[i])`` for every ``i`` in ``order``, ``workers`` at once in spawned processes of ``threads`` torch
    threads each (``setup``: run first in each worker; a module-level function, as ``fn``), into ``results``
    (returned). A job that fails lets the running ones finish, then its error is raised; no new job starts after
    it. An interrupt stops every job (:func:`stop_workers`, with the signal ``stop_signal()`` names, else SIGINT)
    and raises ``KeyboardInterrupt``."""
    results = {} if results is None else results
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch thread pools or locks
    started = ctx.RawArray("b", max(args, default=-1) + 1)  # set by the workers: which jobs are underway
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(threads, started, setup))
    running, error = {}, None
    try:
        pending = list(order)
        while pending or running:
            while pending and len(running) < workers and error is None:
                i = pending.pop(0)
                events.start(i)
                with signals_blocked():  # the worker this may start inherits the mask (see _worker_init)
                    running[pool.submit(_run_job, fn, i, args[i])] = i
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                try:
                    results[i] = future.result()
                except KeyboardInterrupt as err:  # a worker was interrupted alone: the run stops as a whole
                    events.interrupted(i, err)
                    raise
                except BaseException as err:  # noqa: BLE001 (re-raised once the running ones finish)
                    error = error or err
                    events.failed(i, err)
                    continue
                events.done(i, results[i])
        if error is not None:
            raise error
    except KeyboardInterrupt:
        stop_workers(pool, running, started, stop_signal() or signal.SIGINT, events)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return results


def stop_workers(pool: ProcessPoolExecutor, running: dict, started, signum: int, events: JobEvents,
                 timeout: float | None = None) -> None:
    """The run was interrupted: pass ``signum`` to every worker (a signal sent to this process alone does not reach
    them; one already stopping ignores the repeat) and wait for each started job to end; past ``timeout``
    (:data:`STOP_TIMEOUT`) or at a second Ctrl-C kill what is left. A worker still starting
    (importing torch) has nothing to save and is not waited for."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError):
            if proc.is_alive():
                os.kill(proc.pid, signum)
    pending = dict(running)
    deadline = time.monotonic() + (STOP_TIMEOUT if timeout is None else timeout)
    try:
        while time.monotonic() < deadline:
            waited = {f: i for f, i in pending.items() if started[i]}
            if not waited:
                break
            done, _ = wait(waited, timeout=min(0.5, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
            for future in done:
                i = pending.pop(future)
                try:
                    future.result()
                    events.finished_while_stopping(i)
                except KeyboardInterrupt as err:
                    events.interrupted(i, err)
                except BaseException as err:  # noqa: BLE001 (the interrupt is what the run ends with)
                    events.failed_while_stopping(i, err)
    except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
        pass
    # the workers are idle now (or stuck): end them at once rather than wait for their interpreters to wind down
    # (torch, Lightning and MLflow are slow to unload)
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError):
            proc.kill()
    for i in pending.values():
        if started[i]:
            events.killed(i)
        else:
            events.never_started(i)
