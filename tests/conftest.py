"""Shared fixtures: an isolated artifact cache, offline hubs, and tiny models built once per session."""

from __future__ import annotations

import os
import sys

# Tests never touch the network or the user's ./artifacts and mlflow.db.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Under pytest-xdist (the README's `-n auto`) each worker holds one core: one intra-op thread per worker, and
# the same for the processes the tests start (DDP, the parallel ablation), so workers never fight for cores.
# Inductor compiles in one process too: by default it starts a pool of compile workers, one per core, whose start
# and parallel C++ builds fight the other worker for the cores (on a fresh inductor cache, a compiled decode is
# slower with the pool than without it); read when torch._inductor.config is first imported (not yet: torch's
# import leaves it out), and passed on to the processes the tests start.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """One artifact cache + MLflow store for the whole test session, outside the project."""
    root = tmp_path_factory.mktemp("artifacts")
    old = {k: os.environ.get(k) for k in ("LIT_DOMINO_CACHE", "MLFLOW_TRACKING_URI")}
    os.environ["LIT_DOMINO_CACHE"] = str(root)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    yield root
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _fresh_tree_observations():
    """Every test's cost-aware trees start from no observations (they outlive a decode: ``tree.observed``), so no
    test's node counts depend on which tests ran before it in the worker."""
    yield
    tree = sys.modules.get("lit_domino.decoding.tree")  # a test that decoded no tree imported none: nothing to drop
    if tree is not None:
        tree.forget_observed()


@pytest.fixture(scope="session")
def smoke_ablation(tmp_path_factory, smoke_data):
    """The smoke ablation, run once per session into the session's cache and store: ``--train-only`` first (every
    drafter trained), then the full run (decode, tables, MLflow). ``{"first", "out", "results"}``: the two runs'
    returns and the results folder. The end-to-end test and the browser check share it. Its regenerated sets and
    feature caches are the session's ``smoke_data`` (its stages find them cached, as a rerun does: the ablation's
    own regeneration is what ``smoke_data`` runs, the same ``data_modules`` calls)."""
    from lit_domino.studies.ablation import run_ablation

    results = tmp_path_factory.mktemp("smoke-ablation") / "results"
    first = run_ablation("smoke", out_dir=results, progress=False, train_only=True)
    out = run_ablation("smoke", out_dir=results, progress=False)
    return {"first": first, "out": out, "results": results}


def copy_artifacts(paths, from_root, to_root) -> None:
    """Artifact folders of the cache ``from_root`` copied into the cache ``to_root`` at the same relative paths
    (what is there already is kept; build locks are not copied)."""
    import shutil
    from pathlib import Path

    for src in map(Path, paths):
        dst = Path(to_root) / src.relative_to(from_root)
        if not dst.exists():
            shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("*.lock"))


SMOKE_DATA_KINDS = ("regen", "features")
"""The cache folders of the smoke study's data (regenerated sets, feature caches): what ``smoke_data`` shares."""


def build_smoke_data() -> None:
    """The smoke ablation's regenerated sets and its feature caches (every feature rule of its variants) in the
    current artifact cache, found there or built, as the ablation's first stage builds them."""
    from lit_domino.studies.ablation import study_configs, study_plan
    from lit_domino.studies.ablation_train import data_modules

    configs, _ = study_configs("smoke", study_plan("smoke"), {})
    modules = data_modules(configs)
    modules[0][1].regenerate(progress=False)
    for _, dm in modules:
        dm.prepare_data()


def copy_smoke_data_into(from_root, to_root) -> None:
    """Every regenerated set and feature cache of the cache ``from_root`` copied into ``to_root``."""
    from pathlib import Path

    copy_artifacts([p for kind in SMOKE_DATA_KINDS if (Path(from_root) / kind).is_dir()
                    for p in (Path(from_root) / kind).iterdir() if p.is_dir()], from_root, to_root)


@pytest.fixture(scope="session")
def smoke_data(_isolated_cache, tmp_path_factory):
    """The smoke study's regenerated sets and feature caches (of the shipped smoke target) in the session's cache,
    built once per test run: under xdist in the cache the workers share (the first to ask builds, the others wait on
    its build locks), then copied into each worker's cache. The smoke ablation, the GPU check's dry run and the
    interrupted smoke ablations read them instead of each regenerating the same answers (the same sets: their
    cache keys are the target's fingerprint and the data settings, which those runs share). Returns the cache."""
    from lit_domino.runtime import cache

    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "shared-cache"
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("LIT_DOMINO_CACHE", str(shared))
            build_smoke_data()
        copy_smoke_data_into(shared, cache.cache_root())
    else:
        build_smoke_data()
    return cache.cache_root()


@pytest.fixture(scope="session")
def copy_smoke_data(smoke_data):
    """``copy_smoke_data(root)``: the session's regenerated sets and feature caches copied into the artifact cache
    ``root``: a fresh cache whose smoke runs train from scratch on data already made."""
    return lambda root: copy_smoke_data_into(smoke_data, root)


@pytest.fixture(scope="session")
def corpus_tokenizer():
    """A small BPE tokenizer trained on a sample of every embedded corpus (vocab 512)."""
    from lit_domino.data.corpora import build_corpus
    from lit_domino.target.recipe import render
    from lit_domino.target.tokenizer import train_tokenizer

    texts = [render(e) for d in ("math", "code", "chat") for e in build_corpus(d, "train", 150)]
    return train_tokenizer(texts, vocab_size=512)


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, corpus_tokenizer):
    """A random 4-layer Qwen3 with the corpus tokenizer, saved as a model directory."""
    from lit_domino.testing import random_target

    target = random_target(vocab_size=len(corpus_tokenizer), hidden_size=32, num_layers=4, num_heads=2,
                           num_kv_heads=1, intermediate_size=64, tokenizer=corpus_tokenizer, seed=0)
    cfg = target.model.config
    cfg.eos_token_id, cfg.pad_token_id = corpus_tokenizer.eos_token_id, corpus_tokenizer.pad_token_id
    target.model.generation_config.eos_token_id = corpus_tokenizer.eos_token_id
    target.model.generation_config.pad_token_id = corpus_tokenizer.pad_token_id
    path = tmp_path_factory.mktemp("target")
    target.model.save_pretrained(path)
    corpus_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir):
    from lit_domino.target.load import load_target

    return load_target(tiny_target_dir)


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module of tiny-model tests: on 2 shared cores, one intra-op
    thread is ~5x faster than two (no spin-waiting)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Under xdist: the slow tests first, and the tests that share the session's smoke ablation run on one worker
    (``--dist loadgroup``), so the ablation is built once, not once per worker.

    The marks go on before every other implementation runs (xdist's worker reads them in its own
    ``pytest_collection_modifyitems``). After them, the group suffix ``@smoke_ablation`` that loadgroup schedules by
    is checked: xdist 3.8 writes it to ``item._nodeid``, which pytest 9.2's structured node ids no longer read
    (pytest-xdist#1386), so the group was silently ignored and every worker built the ablation (3-6 min each)."""
    grouped = config.pluginmanager.hasplugin("xdist") and bool(os.environ.get("PYTEST_XDIST_WORKER"))
    if grouped:
        # the slow tests first (a stable sort: otherwise in collection order), so that no minute-long end-to-end
        # check starts last and leaves the other workers idle while it runs (xdist hands out work in this order;
        # without xdist the order stays pytest's, which keeps a module's tests and its fixtures together)
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
        for item in items:
            if "smoke_ablation" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group("smoke_ablation"))
    result = yield
    if grouped and config.getvalue("loadgroup"):
        for item in items:
            if item.get_closest_marker("xdist_group") is not None:
                _ensure_group_suffix(item)
    return result


def _ensure_group_suffix(item) -> None:
    """``nodeid@group`` as xdist's loadgroup expects it, where xdist's own rename did not take effect."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    suffix = "@" + "_".join(names)
    nodeid = item.nodeid
    if nodeid.endswith(suffix):
        return  # xdist's rename worked (pytest < 9.2, or a fixed xdist)
    try:  # pytest's private node id (9.2: a structured NodeId; before: the string): should a later pytest change
        # it, the group is lost again (the ablation built once per worker, slower), never a failing suite
        if hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(nodeid + suffix)
        else:
            item._nodeid = nodeid + suffix
    except (ImportError, AttributeError, TypeError, ValueError):
        pass
