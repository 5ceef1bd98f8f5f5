"""Regeneration and serve_bench against a real local ``transformers serve`` (one server per module, CPU).

The served model is a tiny random Qwen3 with a byte-level tokenizer without merges (every text has one
tokenization), whose greedy answers are printable ASCII or EOS: so the text that ``transformers serve``
returns (it has no token-id output) re-tokenizes to exactly the tokens it generated, as a trained target's
natural answers do, and the server backend can be checked token for token against HF ``generate``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lit_domino.runtime import cache
from lit_domino.data.regenerate import (
    RegenConfig,
    ServerBackend,
    missing_chunks,
    regen_dir,
    regen_report,
    regenerate,
    regenerate_part,
)
from lit_domino.runtime.serving import ServerClient, ServerError, free_port, start_transformers_serve

ROOT = Path(__file__).resolve().parents[2]
# ~2 min on 2 busy cores, most of it starting the server (imports) once for the module
# one worker runs the module (under xdist): its server (and the served model) start once, not once per worker
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow, pytest.mark.xdist_group("serving")]

CFG = RegenConfig(domains=(("math", 6), ("chat", 3)), max_new_tokens=16, batch_size=4, shard_size=3)


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from lit_domino.data.corpora import build_corpus
    from lit_domino.target.recipe import render
    from lit_domino.target.tokenizer import SPECIAL_TOKENS, train_tokenizer

    texts = [render(e) for d in ("math", "code", "chat") for e in build_corpus(d, "train", 10)]
    tok = train_tokenizer(texts, vocab_size=len(SPECIAL_TOKENS) + 256)  # the byte alphabet: no merges
    V = len(tok)
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=False,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.model.layers.parameters():  # varied greedy answers (the default init repeats a token)
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        W = model.lm_head.weight
        W.copy_(torch.randn(W.shape, generator=g))
        printable = [i for i in range(V) if len(s := tok.decode([i])) == 1 and s.isascii() and (s.isprintable() or s == "\n")]
        never = [i for i in range(V) if i not in printable and i != tok.eos_token_id]
        W[never] = W[printable].mean(0)  # a row equal to the mean of the others is never the strict argmax
        W[tok.eos_token_id] *= 3.0  # some answers end on EOS, most run to max_new_tokens
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    path = tmp_path_factory.mktemp("served")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(served_dir):
    with start_transformers_serve(served_dir, threads=1, timeout_s=240) as srv:
        yield srv


@pytest.fixture(scope="module")
def target(served_dir):
    from lit_domino.target.load import load_target

    return load_target(served_dir)


class FlakyClient(ServerClient):
    """A real client that is pointed at a dead port after ``ok`` completions (a server that went away)."""

    def __init__(self, url, ok: int, **kw):
        super().__init__(url, **kw)
        self.ok, self.calls = ok, 0

    def complete(self, *a, **kw):
        self.calls += 1
        if self.calls > self.ok:
            self.url = f"http://127.0.0.1:{free_port()}/v1"
        return super().complete(*a, **kw)


def test_server_regeneration_equals_hf_generate(target, server, tmp_path):
    hf = regenerate(target, CFG, root=tmp_path / "hf", progress=False)
    srv = regenerate(target, CFG, root=tmp_path / "srv", progress=False,
                     backend=ServerBackend(server.client(), concurrency=4))
    assert srv["uid"] == hf["uid"] and len(hf) >= 9
    assert srv["input_ids"] == hf["input_ids"] and srv["loss_mask"] == hf["loss_mask"]
    eos = target.eos_token_ids[0]
    answers = [ids[p:] for ids, p in zip(hf["input_ids"], hf["prompt_len"])]
    assert any(a[-1] == eos for a in answers) and any(a[-1] != eos for a in answers)  # both endings checked
    assert len({tuple(a) for a in answers}) > 5
    report = regen_report(target, CFG, root=tmp_path / "srv")
    assert report["inconsistent_answers"] == 0 and report["backends"][0].startswith("server http://127.0.0.1")
    # same cache key as the HF backend: prepare_data finds a server-regenerated set
    assert regen_dir(target, CFG, tmp_path / "srv").name == regen_dir(target, CFG, tmp_path / "hf").name


def test_failed_server_keeps_finished_chunks_and_a_rerun_resumes(target, server, tmp_path):
    cfg = replace(CFG, domains=(("math", 9),))  # 3 chunks of 3 single-turn prompts
    full = regenerate(target, cfg, root=tmp_path / "ref", progress=False)
    root = tmp_path / "run"
    flaky = FlakyClient(server.url, ok=4, model=server.model, retries=1, backoff_s=0.01)
    with pytest.raises(ServerError, match=r"did not answer[\s\S]*1 of 3 chunks .* are finished and kept"):
        regenerate(target, cfg, root=root, progress=False, backend=ServerBackend(flaky, concurrency=1))
    assert missing_chunks(target, cfg, root) == [1, 2]
    client = server.client()
    resumed = regenerate(target, cfg, root=root, progress=False, backend=ServerBackend(client, concurrency=2))
    assert resumed["input_ids"] == full["input_ids"] and cache.is_complete(regen_dir(target, cfg, root))


def test_shards_from_two_backends_merge_to_the_unsharded_set(target, server, tmp_path):
    cfg = replace(CFG, domains=(("math", 7), ("chat", 2)), shard_size=2)
    full = regenerate(target, cfg, root=tmp_path / "ref", progress=False)
    root = tmp_path / "sharded"
    with pytest.raises(ValueError, match=r"cannot merge .*5 of 5 chunks are not regenerated"):
        regenerate(target, cfg, root=root, progress=False, merge_only=True)
    a = regenerate_part(target, cfg, "0/2", root=root, progress=False,
                        backend=ServerBackend(server.client(), concurrency=2))
    assert a["chunks"] == 3 and a["answered"] == 3 and missing_chunks(target, cfg, root) == [1, 3]
    b = regenerate_part(target, cfg, (1, 2), root=root, progress=False)  # HF generate
    assert b["answered"] == 2 and missing_chunks(target, cfg, root) == []
    merged = regenerate(target, cfg, root=root, progress=False, merge_only=True)
    assert merged["input_ids"] == full["input_ids"] and merged["uid"] == full["uid"]
    assert len(regen_report(target, cfg, root)["backends"]) == 2
    assert regenerate_part(target, cfg, "1/2", root=root, progress=False)["merged"]


def test_regenerate_command_then_prepare_data_only_reads(served_dir, server, tmp_path, monkeypatch):
    from lit_domino.training.datamodule import DrafterDataModule
    from lit_domino.training.regen_step import target_without_weights
    from lit_domino.target.load import load_target

    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path / "cache"))
    spec = importlib.util.spec_from_file_location("regen_cli", ROOT / "experiments" / "regenerate.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    sets = ["--set", f"data.target={served_dir}", "--set", "data.train_examples={math: 3, chat: 1}",
            "--set", "data.val_examples={math: 2}", "--set", "data.max_new_tokens=8"]
    out = cli.main(["--preset", "smoke", *sets, "--server", server.url, "--concurrency", "2", "--no-progress"])
    assert set(out) == {"train", "eval"} and out["train"]["sequences"] >= 4
    meta = target_without_weights(str(served_dir))
    assert meta.fingerprint() == load_target(served_dir).fingerprint() and meta.model.device.type == "meta"
    dm = DrafterDataModule(target=str(served_dir), train_examples={"math": 3, "chat": 1}, val_examples={"math": 2},
                           max_new_tokens=8, regen_missing="error", features="online")
    dm.prepare_data()  # found in the cache: nothing to regenerate, no error
    dm2 = DrafterDataModule(target=str(served_dir), train_examples={"math": 5}, regen_missing="error", features="online")
    with pytest.raises(FileNotFoundError, match=r"not in the cache[\s\S]*experiments/regenerate.py"):
        dm2.prepare_data()


def test_serve_bench_writes_its_table_json_and_mlflow_run(server, tmp_path):
    from mlflow.tracking import MlflowClient

    spec = importlib.util.spec_from_file_location("serve_bench_cli", ROOT / "experiments" / "serve_bench.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out = tmp_path / "results"
    rows = cli.main(["--url", server.url, "--baseline", server.url, "--benchmarks", "embedded-math:3",
                     "--concurrency", "1,2", "--max-tokens", "8", "--out", str(out), "--no-progress",
                     "--experiment", "serve-bench-test"])
    assert [(r["server"], r["concurrency"]) for r in rows] == [("speculative", 1), ("baseline", 1),
                                                               ("speculative", 2), ("baseline", 2)]
    assert all(r["tokens_per_s"] > 0 and r["latency_p50_s"] <= r["latency_p90_s"] for r in rows)
    assert all(r["match_baseline"] == 1.0 for r in rows)  # greedy, the same server
    assert rows[2]["requests"] == 3 and rows[0]["output_tokens"] <= 3 * 8
    md, js = list(out.glob("serve_bench-*.md")), list(out.glob("serve_bench-*.json"))
    assert len(md) == 1 and len(js) == 1 and "tokens_per_s" in md[0].read_text()
    assert len(json.loads(js[0].read_text())["rows"]) == 4
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.search_runs([client.get_experiment_by_name("serve-bench-test").experiment_id])[0]
    assert run.info.status == "FINISHED" and "speculative/c2/tokens_per_s" in run.data.metrics


def test_unreachable_url_is_a_clear_error_after_retries(target, tmp_path):
    from lit_domino.studies.serve_bench import run_serve_bench

    url = f"http://127.0.0.1:{free_port()}"
    client = ServerClient(url, retries=2, backoff_s=0.01)
    with pytest.raises(ServerError, match=rf"server at {url}/v1 did not answer GET /models after 3 attempt"):
        client.models()
    with pytest.raises(ServerError, match=url):
        regenerate(target, CFG, root=tmp_path / "regen", progress=False, backend=ServerBackend(client))
    out = tmp_path / "results"
    with pytest.raises(ServerError, match=url):
        run_serve_bench({"url": url, "benchmarks": "embedded-math:2", "concurrency": "1", "max_tokens": 4,
                         "retries": 1, "out": str(out), "experiment": "x", "no_progress": True})
    assert not out.exists()  # nothing half-written


def test_refused_request_fails_at_once_with_the_servers_reason(server):
    client = server.client(retries=3, backoff_s=5.0, extra_body={"no_such_field": 1})
    with pytest.raises(ServerError, match=r"refused the request: HTTP 422: .*no_such_field"):
        client.complete("hi", max_tokens=2)  # not retried: a 4xx is the request's fault (no 15 s of backoff)
