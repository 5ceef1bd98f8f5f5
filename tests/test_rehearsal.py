"""The paper preset's rehearsal (docs/paper-rehearsal.md): the preset is paper's but for its listed sizes, counts,
device and threads; its target has Qwen3-8B's layout; bad input fails as paper's would; and every defect the
rehearsal found on the way stays fixed (one test each, fast). The end-to-end run is the slow test at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from lit_domino.runtime.tracking import flatten_config
from lit_domino.training.configs import CONFIG_DIR, ConfigError, available_variants, load_config, method_kind

ROOT = Path(__file__).resolve().parents[1]
REHEARSAL = CONFIG_DIR / "presets" / "rehearsal.yaml"


def rehearsal_keys(variant: str) -> set[str]:
    """The flattened keys the rehearsal preset's own file sets for ``variant`` (its methods section mapped onto the
    model, as composition does), plus the label ``tracking.preset`` that every preset sets."""
    own = yaml.safe_load(REHEARSAL.read_text())
    methods = own.pop("methods", {}) or {}
    own.pop("extends")
    mine = dict(methods.get(method_kind(load_config(variant, "rehearsal"))) or {})
    data = mine.pop("data", None) or {}
    own.setdefault("model", {}).setdefault("init_args", {}).update(mine)
    own.setdefault("data", {}).update(data)
    return set(flatten_config(own)) | {"tracking.preset"}


def test_presets_extend_presets_and_refuse_loops(tmp_path):
    from lit_domino.training.configs import compose, preset_delta

    (tmp_path / "presets").mkdir()
    for name in ("base.yaml", "backbone.yaml"):
        (tmp_path / name).write_text((CONFIG_DIR / name).read_text())
    (tmp_path / "presets" / "a.yaml").write_text("data: {batch_size: 3, num_anchors: 5}\nmethods: {domino: {head: {rank: 8}}}\n")
    (tmp_path / "presets" / "b.yaml").write_text("extends: a\ndata: {batch_size: 7}\n")
    assert preset_delta("b", tmp_path) == {"data": {"batch_size": 7, "num_anchors": 5}, "methods": {"domino": {"head": {"rank": 8}}}}
    (tmp_path / "presets" / "c.yaml").write_text("extends: d\n")
    (tmp_path / "presets" / "d.yaml").write_text("extends: c\n")
    with pytest.raises(ConfigError, match="loops through"):
        preset_delta("c", tmp_path)
    (tmp_path / "presets" / "e.yaml").write_text("extends: nosuch\n")
    with pytest.raises(ConfigError, match="extends 'nosuch', which has no"):
        preset_delta("e", tmp_path)
    import lit_domino.training.configs as configs

    configs.PRESETS = (*configs.PRESETS, "b")  # the module lists the shipped presets; this folder's for the test
    try:
        assert compose("backbone", "b", tmp_path)["data"]["num_anchors"] == 5
    finally:
        configs.PRESETS = tuple(p for p in configs.PRESETS if p != "b")


@pytest.mark.parametrize("variant", available_variants())
def test_rehearsal_resolves_to_paper_but_for_its_listed_keys(variant):
    """The resolved configs of --preset rehearsal and --preset paper differ only in the keys rehearsal.yaml lists."""
    paper, rehearsal = flatten_config(load_config(variant, "paper")), flatten_config(load_config(variant, "rehearsal"))
    differ = {k for k in set(paper) | set(rehearsal) if paper.get(k) != rehearsal.get(k)}
    listed = rehearsal_keys(variant)
    unlisted = {k for k in differ if k not in listed and not any(k.startswith(x + ".") or x.startswith(k + ".")
                                                                  for x in listed)}
    assert not unlisted, f"{variant}: rehearsal differs from paper in keys it does not list: {sorted(unlisted)}"
    for key in ("trainer.precision", "data.features", "data.regen_missing", "data.block_size", "model.num_layers",
                "model.activation_checkpointing", "data.num_feature_layers", "data.target_dtype", "model.lr",
                "trainer.gradient_clip_val"):
        assert rehearsal[key] == paper[key], key  # the settings the rehearsal is for
    assert paper["data.target"] == "Qwen/Qwen3-8B" and rehearsal["data.target"] == "embedded:rehearsal"


def preset_keys(path: Path) -> list[str]:
    """A preset file's keys as the doc names them: ``section.key`` (``model.<init arg>``, ``methods.<kind>``)."""
    data = yaml.safe_load(path.read_text())
    keys = []
    for section, body in data.items():
        if section == "extends":
            continue
        body = (body or {}).get("init_args", body) if section == "model" else body
        keys += [f"{section}.{key}" for key in body or {}]
    return keys


def test_every_key_the_rehearsal_changes_says_why_and_every_paper_key_is_documented():
    doc = (ROOT / "docs" / "paper-rehearsal.md").read_text()
    for line in REHEARSAL.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip().startswith("#") or not value.split("#")[0].strip() or line.startswith(" " * 4):
            continue  # a comment, a section header, or an entry nested in a key's value
        assert "#" in value, f"rehearsal.yaml: {key.strip()} has no comment saying why"
    for key in preset_keys(CONFIG_DIR / "presets" / "paper.yaml") + preset_keys(REHEARSAL):
        assert f"`{key}`" in doc, f"docs/paper-rehearsal.md does not say how the rehearsal ran {key}"


def test_the_rehearsal_target_has_qwen3_8b_tokens_template_and_layers():
    from lit_domino.target import rehearsal as r
    from lit_domino.target.load import dflash_layer_ids

    tok = r.shaped_tokenizer()
    assert len(tok) == 256 + len(r.QWEN3_SPECIAL_TOKENS) and tok.convert_ids_to_tokens(256) == "<|endoftext|>"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
            {"role": "assistant", "content": "<think>\nr\n</think>\n\nb"}, {"role": "user", "content": "c"}]
    off = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert off == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
                   "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True).endswith("assistant\n")
    text = "Hi <think>\n\n</think>\n\n ok 12"  # byte tokens round-trip exactly: served text re-tokenizes to its ids
    assert tok.decode(tok(text)["input_ids"]) == text
    cfg = r.SHAPED_TARGETS["rehearsal"]
    assert (cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.rope_theta) == (151936, 32, 8, 1e6)
    assert r.SHAPED_TARGETS["rehearsal-large"].head_dim == r.QWEN3_8B["head_dim"] == 128
    assert dflash_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # paper's rule on Qwen3-8B ...
    assert dflash_layer_ids(cfg.num_layers, 5) == [1, 2, 3, 4, 5]  # ... distinct layers on the rehearsal's depth
    assert len(set(dflash_layer_ids(cfg.num_layers - 1, 5))) < 5  # a shallower target would repeat a layer


# --------------------------------------------------------------------------- bad input, with paper's semantics


def test_a_server_that_does_not_answer_is_one_line_naming_the_url(capsys):
    from lit_domino.runtime.serving import free_port
    from lit_domino.training.regen_step import main

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SystemExit) as done:
        main(["--preset", "rehearsal", "--server", url, "--shard", "0/2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1 and url in err[0], err


def test_a_missing_regenerated_set_stops_fit_with_the_rehearsals_regeneration_command(tiny_target_dir, tmp_path,
                                                                                      capsys):
    from lit_domino.training import train

    with pytest.raises(SystemExit) as done:
        train.main(["fit", "--variant", "backbone", "--preset", "rehearsal", "--set", f"data.target={tiny_target_dir}",
                    "--set", "trainer.devices=1", "--set", "trainer.strategy=auto", "--set", "tracking.enabled=false",
                    "--trainer.default_root_dir", str(tmp_path)])
    err = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]  # (weight-loading bars aside)
    assert done.value.code == 2 and len(err) == 1 and err[0].startswith("train: error: "), err
    assert "not in the cache" in err[0] and "python experiments/regenerate.py --variant backbone --preset rehearsal" in err[0]
    assert not list(tmp_path.rglob("*.ckpt"))  # nothing trained


def test_a_target_without_a_mask_row_is_refused_before_anything_trains(tmp_path, capsys):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from lit_domino.runtime import cache
    from lit_domino.studies import rehearsal
    from lit_domino.target.rehearsal import shaped_tokenizer

    tok = shaped_tokenizer()  # no mask token; an embedding exactly as long as the tokenizer: no row to add one at
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=8,
                                         num_attention_heads=4, num_key_value_heads=1, head_dim=4))
    model.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    with pytest.raises(SystemExit) as done:
        rehearsal.main(["--set", f"data.target={tmp_path / 'target'}", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and "MASK token id" in err[-1] and "has no row" in err[-1], err
    assert not (cache.cache_root() / "drafters").exists() or not any(
        "rehearsal" in p.name for p in (cache.cache_root() / "drafters").iterdir())


# --------------------------------------------------------------------------- defects the rehearsal found


def test_decode_summaries_never_gather_across_ranks(monkeypatch, tiny_target):
    """Under DDP the eval callback decodes on rank 0 alone while the other ranks wait in its broadcast; the decode
    summary's torchmetrics gathered their state across ranks at compute(), so rank 0 waited forever (the first
    DDP training of the rehearsal hung there)."""
    import torchmetrics.metric as tm

    from lit_domino.decoding import generate
    from lit_domino.decoding.metrics import summarize

    def gather(*args, **kwargs):
        raise AssertionError("a decode summary gathered its state across ranks")

    monkeypatch.setattr(tm, "jit_distributed_available", lambda: True)  # as inside a DDP process group
    monkeypatch.setattr(tm, "gather_all_tensors", gather)
    res = generate(tiny_target, None, torch.tensor([[5, 6, 7]]), max_new_tokens=3)
    assert summarize([res], [res])["num_prompts"] == 1


def test_domino_training_time_test_runs_under_bf16_autocast():
    """bf16-mixed made the rollout's gates bf16 while the GRU state stayed fp32, and ``torch.lerp`` refused the mix:
    the paper preset could not train ``domino_ttt`` (on a GPU either: no test there covered the rollout)."""
    from lit_domino.models.domino import gru_gates

    d = 8
    h = torch.randn(3, d)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gi, gh = torch.randn(3, 3 * d) @ torch.eye(3 * d), torch.randn(3, 3 * d) @ torch.eye(3 * d)
        out = gru_gates(gi, gh, h)
    assert gi.dtype == torch.bfloat16 and out.dtype == torch.float32 and out.shape == (3, d)
    ref = gru_gates(gi.float(), gh.float(), h)  # the same gates in fp32: bf16's 8-bit mantissa over ~4 ops
    assert torch.allclose(out, ref, atol=2e-2)


def test_a_server_on_an_embedded_targets_folder_serves_that_target():
    """The server lists the folder it serves; an embedded target is named ``embedded:<folder name>``: the check
    warned that the rehearsal's server served another model."""
    from lit_domino.data.regenerate import serves_target

    assert serves_target("/cache/target/rehearsal-d7816c774803", "embedded:rehearsal-d7816c774803")
    assert serves_target("/models/qwen", "/models/qwen") and serves_target("Qwen/Qwen3-8B", "Qwen/Qwen3-8B")
    assert not serves_target("/cache/target/rehearsal-0000", "embedded:rehearsal-d7816c774803")


def test_the_ablation_trains_ddp_configs_in_one_launch_of_their_own(monkeypatch):
    """Lightning's DDP launcher re-runs the calling script for each extra rank: the ablation's own command (its
    regeneration, study run, decode and tables) ran again in every rank. Its DDP trainings now go to one launch of
    ``lit_domino.training.distributed``."""
    from lit_domino.runtime.jobclock import JobClock
    from lit_domino.studies import ablation
    from lit_domino.training import distributed, experiment

    configs = [load_config(v, "rehearsal") for v in ("backbone", "domino")]
    assert all(distributed.is_distributed(c) for c in configs)
    assert not distributed.is_distributed(load_config("backbone", "paper"))
    seen = {}

    def launch(cfgs, name, **kwargs):
        seen.update(configs=cfgs, experiment=name, **kwargs)
        return [experiment.TrainedDrafter(c["tracking"]["variant"], "rehearsal", 0, Path("d"), from_cache=False)
                for c in cfgs]

    monkeypatch.setattr(distributed, "train_distributed", launch)
    monkeypatch.setattr(experiment, "train_variant", lambda *a, **k: pytest.fail("trained in the study's process"))
    done = ablation.train_all(configs, "ablation-rehearsal", JobClock(), {}, False, parent_run_id="study")
    assert [t.variant for t in done] == ["backbone", "domino"] and seen["parent_run_id"] == "study"
    assert seen["configs"] == configs and seen["experiment"] == "ablation-rehearsal"


def test_the_regenerated_set_is_chunked_so_that_every_shard_answers():
    """A paper-sized chunk (256 prompts) left the second --shard worker of a small set with nothing to answer;
    ``data.regen_shard_size`` (the rehearsal's 8) cuts it so that both answer."""
    from lit_domino.training.regen_step import datamodule

    dm = datamodule("domino", "rehearsal")
    assert dm.regen_config("train").shard_size == 8
    assert datamodule("domino", "paper").regen_config("train").shard_size == 256  # paper's key: unchanged


def test_the_ablation_decodes_where_its_target_is(monkeypatch, tiny_target):
    """The ablation loaded the target on the CPU and the drafters without a device: on a GPU machine a paper run
    decoded Qwen3-8B on the host. The drafters now go where the target is (the target to ``data.target_device``)."""
    import lit_domino.decoding.harness as harness
    import lit_domino.interop as interop
    from lit_domino.studies import ablation
    from lit_domino.training.experiment import TrainedDrafter

    seen = []

    class Loaded:
        def base_view(self):
            return None

        def hf_model(self):
            return None

    monkeypatch.setattr(interop, "load_drafter", lambda path, target=None, map_location="cpu": seen.append(
        map_location) or Loaded())
    monkeypatch.setattr(harness, "benchmark", lambda *a, **k: [])
    monkeypatch.setattr(ablation, "load_prompts", lambda plan: {})
    trained = [TrainedDrafter("backbone", "rehearsal", 0, Path("d"))]
    plan = ablation.AblationPlan(seeds=[0], prompts={}, max_new_tokens=4)
    assert ablation.evaluate(tiny_target, trained, plan) == []
    assert seen == [tiny_target.device]
    source = Path(ablation.__file__).read_text()
    assert 'load_target(spec, device=configs[0]["data"].get("target_device", "auto"))' in source


def test_a_presets_relative_prompt_files_are_found_from_any_directory(monkeypatch, tmp_path):
    """The rehearsal's prompt and benchmark files are named relative to the checkout; from another cwd they were
    taken for hub ids (offline: an error)."""
    from lit_domino.data.hub_prompts import build_prompts
    from lit_domino.runtime.paths import project_path

    monkeypatch.chdir(tmp_path)
    rel = "tests/data/fixtures/rehearsal/codealpaca_20k.json"
    assert project_path(rel) == ROOT / rel and project_path(tmp_path / "x") == tmp_path / "x"
    assert len(build_prompts(f"codealpaca@{rel}", "train")) == 15


# --------------------------------------------------------------------------- end to end (slow)

GROUP = pytest.mark.xdist_group("rehearsal")  # one worker, in this order: the GPU check's dry run reuses the cache


def gpu_check():
    """``experiments/gpu/check.py`` as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "experiments" / "gpu" / "check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    return check


@pytest.fixture(scope="module")
def rehearsal_report(tmp_path_factory):
    """``python experiments/rehearsal.py`` as a user runs it (the session's cache and MLflow store), and its report,
    at the GPU check's dry-run counts (``DRY_RUN``: fewer prompts and anchors, 6 steps a drafter, where the preset
    trains 9): every stage, setting and defect the test reads runs as at the preset's, and the dry run below
    reuses its cache."""
    import subprocess
    import sys
    import time

    out = tmp_path_factory.mktemp("rehearsal")
    sets = [a for key, value in gpu_check().DRY_RUN.items() for a in ("--set", f"{key}={json.dumps(value)}")]
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "rehearsal.py"), "--out", str(out),
                           "--no-progress", *sets], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    report["wall_seconds"] = time.time() - t0
    return report


@pytest.mark.slow
@GROUP
def test_the_rehearsal_runs_every_stage_with_papers_settings(rehearsal_report):
    from mlflow.tracking import MlflowClient

    st = rehearsal_report["stages"]
    print(f"rehearsal: {rehearsal_report['wall_seconds']:.0f} s wall; stages "
          f"{ {k: v['seconds'] for k, v in st.items()} }")
    # the target: Qwen3-8B's vocabulary, heads, RoPE and template; MASK in the padding rows; 5 distinct layers
    target = st["target"]
    assert target["config"]["vocab_size"] == 151936 and target["dtype"] == "bfloat16"
    assert (target["config"]["num_attention_heads"], target["config"]["num_key_value_heads"]) == (32, 8)
    assert target["rope"]["rope_theta"] == 1e6 and target["rope"].get("rope_type", "default") == "default"
    assert target["mask_token_id"] == target["tokenizer_size"] - 1 < target["config"]["vocab_size"]
    assert target["feature_layers"]["dflash"] == [1, 2, 3, 4, 5] and target["chat_prompt"].endswith("</think>\n\n")
    # regeneration as its own step: a real server, two shard workers that both answered, then the merge
    regen = st["regenerate"]
    assert not regen["cached"] and regen["server"]["command"] == "transformers serve"
    assert [w["summary"]["train"]["shard"] for w in regen["workers"]] == ["0/2", "1/2"]
    assert all(w["summary"]["train"]["answered"] >= 1 for w in regen["workers"])
    for split, s in regen["sets"].items():
        assert s["sequences"] > 0 and s["inconsistent_answers"] == 0 and s["backends"][0].startswith("server ")
        assert s["over_max_length"] == 0 and s["labels_cut_by_max_length"] == 0, split
    assert regen["sets"]["train"]["sequences"] > regen["sets"]["train"]["prompts"]  # the second turns too
    # the trainings: DDP over 2 processes, losses finite and falling, the eval callback's decode logged
    train = st["train"]
    assert train["strategy"] == "ddp" and train["devices"] == 2
    assert {t["variant"] for t in train["trainings"]} == set(rehearsal_report["variants"])
    for t in train["trainings"]:
        losses, third = t["losses"], max(1, len(t["losses"]) // 3)
        assert t["world_size"] == 2 and t["optimizer_steps"] == len(losses) > 3, t["variant"]
        assert all(l == l and abs(l) < 1e6 for l in losses), t["variant"]  # finite
        assert sum(losses[-third:]) / third < sum(losses[:third]) / third, (t["variant"], losses)
        assert {"tau", "math/tau", "code/tau", "chat/tau"} <= set(t["eval_callback"]), t["variant"]
    # paper's settings, read back from each run's MLflow params and resolved config.yaml
    for run, rows in rehearsal_report["settings"].items():
        for key, row in rows.items():
            assert row["mlflow"] == row["config_yaml"], (run, key, row)
            assert row["status"] == "same" or row["listed"], (run, key, row)
        for key, value in {"trainer.precision": "bf16-mixed", "data.features": "online", "data.regen_missing": "error",
                           "model.activation_checkpointing": "True", "data.num_feature_layers": "5",
                           "data.target_dtype": "bfloat16", "model.num_layers": "5" if "eagle" not in run else None,
                           "data.block_size": "8" if run.startswith(("dspark", "dflash2")) else "16"}.items():
            assert value is None or rows[key]["mlflow"] == value, (run, key, rows[key])
        client = MlflowClient()
        params = client.get_run(next(t["run_id"] for t in train["trainings"] if run.startswith(t["variant"] + "-s")))
        assert params.data.params["trainer.strategy"] == "ddp" and params.data.params["trainer.devices"] == "2"
    assert rehearsal_report["settings"]["dspark-s0"]["model.sample_from_anchor"]["mlflow"] == "True"
    assert rehearsal_report["settings"]["dflash2-s0"]["model.head.top_k"]["mlflow"] == "16"
    # the ablation on those drafters: lossless decodes, the tables, the study's MLflow run over every training
    ab = st["ablation"]
    assert ab["trainings_cached"] and ab["lossless"] and ab["rows"] > 0
    assert {"main.md", "ablations.md", "peers.md"} <= set(ab["tables"])
    assert ab["study_run"]["status"] == "FINISHED" and "backbone/tau" in ab["study_run"]["metrics"]
    client = MlflowClient()
    for t in train["trainings"]:
        assert client.get_run(t["run_id"]).data.tags.get("mlflow.parentRunId") == ab["study_run"]["id"]
    # the exports: every drafter in its field format, reloaded, token-identical to greedy decoding
    ex = st["export"]
    formats = {d["variant"]: d["format"] for d in ex["drafters"]}
    assert formats == {"eagle3": "eagle3", "small_lm": "hf", "backbone": "dflash", "domino": "specforge-domino",
                       "dspark": "dspark", "dflash2": "dflash2", "domino_ttt": "specforge-domino",
                       "domino_nocurriculum": "specforge-domino"}
    assert ex["lossless"] and all({"config.json", "model.safetensors"} <= set(d["files"]) for d in ex["drafters"])
    exported = {d["variant"]: json.loads((Path(d["dir"]) / "config.json").read_text()) for d in ex["drafters"]}
    assert exported["backbone"]["dflash_config"]["target_layer_ids"] == [1, 2, 3, 4, 5]  # paper's rule, 0-based
    assert exported["backbone"]["dflash_config"]["mask_token_id"] == target["mask_token_id"]
    assert exported["eagle3"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # hidden_states indices: ours + 1
    assert (exported["dspark"]["block_size"], exported["dspark"]["sample_from_anchor"]) == (7, True)  # DeepSpec's 7
    assert exported["dflash2"]["aux_hidden_state_layer_ids"] == [2, 3, 4, 5, 6]


@pytest.mark.slow
@GROUP
def test_the_gpu_check_dry_run_on_cpu(rehearsal_report, smoke_data, tmp_path):
    """``experiments/gpu/check.py --device cpu``: every part of the GPU check at CPU sizes, so the first GPU run is
    not spent finding the script's own bugs. Its rehearsal reuses the one above (same cache); its decode part is
    ``decode_check.py``'s dry run: the smoke target, one-epoch drafters, eager and compiled (inductor on the CPU),
    the official loop on the same backbone. Its drafters train on the session's ``smoke_data`` (the smoke preset's
    regenerated set, made once per test run) instead of regenerating it here: the check's trainings, decodes and
    comparisons are unchanged."""
    import importlib.util

    from lit_domino.decoding.engine import cpp_compiler

    if cpp_compiler() is None:
        pytest.skip("inductor needs a C++ compiler on a CPU")
    out = gpu_check().main(["--device", "cpu", "--out", str(tmp_path)])
    parts = out["parts"]
    assert out["ok"], {n: {k: v for k, v in p.items() if k in ("ok", "error", "summary", "output_tail")}
                       | ({"not lossless": [(r["benchmark"], r["method"], r["match_baseline"]) for r in
                                             p["report"].get("rows", []) if r.get("match_baseline", 1.0) != 1.0]}
                          if isinstance(p.get("report"), dict) else {})
                       | ({"stages": {k: v.get("lossless") for k, v in p["report"]["stages"].items()}}
                          if isinstance((p.get("report") or {}).get("stages"), dict) else {})
                       for n, p in parts.items()}
    assert [p.name for p in tmp_path.glob("check-*.json")] and out["device"] == "cpu (dry run)"
    rehearsal = parts["rehearsal"]["report"]["stages"]
    assert rehearsal["regenerate"]["cached"] and all(t["from_cache"] for t in rehearsal["train"]["trainings"])
    assert rehearsal["export"]["lossless"] and rehearsal["ablation"]["lossless"]
    assert "skipped" in parts["cuda_tests"]["summary"]  # no GPU here: every CUDA test skips, none errors
    decode = parts["decode"]["report"]
    assert decode["device"] == "cpu (dry run)" and decode["lossless"]
    methods = {(r["benchmark"], r["method"]) for r in decode["rows"]}
    assert methods == {(f"embedded-{d}", m) for d in ("math", "code", "chat") for m in ("ar", "backbone", "domino")}
    assert all(r["compiled_over_eager"] > 0 and r["match_baseline"] == 1.0 for r in decode["rows"])
    assert set(decode["draft_ratios"]) == {"eager", "compiled"} and decode["draft_ratios"]["eager"]["domino"] > 0
    official = decode["official_loop"]
    if importlib.util.find_spec("dflash") is None:  # requirements-peers.txt; without it the check says so
        assert "dflash is not importable" in official["skipped"]
    else:
        assert official["lossless"] and set(official["ours_over_official"]) == {"embedded-math", "embedded-code",
                                                                                 "embedded-chat"}
    step = parts["paper_step"]["report"]
    assert [r["method"] for r in step["rows"]] == ["backbone", "domino"] and step["shape"]["vocab_size"] == 151936
    assert all(r["peak_bytes"] > 0 and r["loss"][-1] == r["loss"][-1] for r in step["rows"])
