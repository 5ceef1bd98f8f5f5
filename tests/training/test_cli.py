"""experiments/train.py (lit_domino.training.cli): every variant x preset composes and parses, the paper preset builds,
a CLI fit logs, exports and resumes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "experiments" / "configs"
VARIANTS = sorted(p.stem for p in CONFIGS.glob("*.yaml") if p.stem != "base")
PRESETS = ["smoke", "default", "paper"]


def _train_module():
    spec = importlib.util.spec_from_file_location("lit_domino_train_cli", ROOT / "experiments" / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def train():
    return _train_module()


def _args(variant: str, preset: str, target_dir, tmp_path, *extra, tracking=False) -> list[str]:
    return ["--variant", variant, "--preset", preset, "--data.target", str(target_dir), "--trainer.accelerator", "cpu",
                   "--trainer.default_root_dir", str(tmp_path), "--tracking.enabled", str(tracking).lower(), *extra]


def test_every_method_has_a_variant_and_every_preset_a_file():
    """Behaviour, not a pinned list: each registered drafter method is trainable from some variant file, and
    the presets the commands offer are exactly the preset files."""
    from lit_domino.models.registry import drafter_class, kinds
    from lit_domino.training.configs import PRESETS, compose, module_class

    trained = {module_class(compose(v, "smoke")).drafter_class for v in VARIANTS}
    assert {drafter_class(k) for k in kinds()} <= trained
    assert set(PRESETS) == {p.stem for p in (CONFIGS / "presets").glob("*.yaml")} >= {"smoke", "default", "paper"}


def test_variant_files_hold_only_their_deltas():
    """Configs as deltas: a variant file is its module and what differs; the ablations a few lines."""
    import yaml

    for v in VARIANTS:
        data = yaml.safe_load((CONFIGS / f"{v}.yaml").read_text())
        assert set(data) <= {"extends", "model", "data", "tracking", "trainer"}, v
        # a method may have its own training length (EAGLE-3: 1 epoch on the default preset); every other
        # trainer and checkpoint setting is the base's or a preset's
        assert set(data.get("trainer", {})) <= {"max_epochs"} and "checkpoint" not in data, v
    lines = [l for l in (CONFIGS / "domino_ttt.yaml").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert len(lines) <= 8 and "extends: domino" in lines


def test_preset_method_sections_reach_only_their_method():
    """Each key of a preset's ``methods.<kind>`` section lands in the model of that method's variants and changes
    no other variant (read from the preset file: the tuned values may change, the routing may not)."""
    import yaml

    from lit_domino.training.configs import load_config, method_kind

    def holds(value, section):  # a preset's section merges into the variant's: its keys (nested too) hold its values
        if isinstance(section, dict):
            return isinstance(value, dict) and all(holds(value.get(k), v) for k, v in section.items())
        return value == section

    sections = yaml.safe_load((CONFIGS / "presets" / "smoke.yaml").read_text())["methods"]
    reached = set()
    for v in VARIANTS:
        cfg = load_config(v, "smoke")
        kind, init = method_kind(cfg), cfg["model"]["init_args"]
        mine = sections.get(kind, {})
        assert holds(init, mine), v
        reached |= {kind} if mine else set()
        without = load_config(v, "default")["model"]["init_args"]  # the default preset has no methods section
        foreign = {k for other, sec in sections.items() if other != kind for k in sec} - set(mine)
        assert {k: init.get(k) for k in foreign} == {k: without.get(k) for k in foreign}, v
    assert reached == set(sections) and len(sections) >= 2  # every section reached a variant of its own


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_config_parses(train, tiny_target_dir, tmp_path, variant, preset):
    cli = train.main(_args(variant, preset, tiny_target_dir, tmp_path), run=False)
    model, data = cli.model, cli.datamodule
    assert model.hparams.target == str(tiny_target_dir) == data.hparams.target  # linked
    assert model.hparams.block_size == data.hparams.block_size
    assert data.hparams.seed == 0
    if "domino" in variant:
        kind = "none" if "nocurriculum" in variant else "linear"
        assert model.curriculum.kind == kind
        assert model.hparams.causal_inputs == ("training_time_test" if "ttt" in variant else "teacher_forced")
    if variant == "eagle3":
        assert data.hparams.feature_rule == "eagle3"
    cb = cli.trainer.checkpoint_callback
    assert cb.save_last and Path(cb.dirpath) == tmp_path / "checkpoints"


@pytest.mark.parametrize("variant", VARIANTS)
def test_paper_preset_builds_with_a_tiny_stand_in(train, tiny_target_dir, tmp_path, variant):
    cli = train.main(_args(variant, "paper", tiny_target_dir, tmp_path), run=False)
    model, data = cli.model, cli.datamodule
    assert data.hparams.num_anchors == 512 and data.hparams.features == "online"
    assert cli.trainer.max_epochs == 6 and cli.trainer.precision == "bf16-mixed"
    assert cli.trainer.gradient_clip_val == 1.0
    drafter = model.build_drafter(data.feature_layers)
    cfg = drafter.config
    if variant in ("dspark", "dflash2"):  # DeepSpec's / speculators' recipes: 7 drafts a block, gamma 4, 5 layers
        assert model.hparams.lr == 6e-4 and model.hparams.gamma == 4.0
        assert (cfg.block_size, cfg.num_layers) == (8, 5)
        return
    assert model.hparams.lr == 6e-4 and model.hparams.gamma == 7.0
    assert cfg.block_size == 16
    if "domino" in variant:
        assert (cfg.head.rank, cfg.head.gru_hidden) == (256, 1024)
    if variant != "eagle3":
        assert cfg.num_layers == 5
    assert model.target is data.load_target()  # one memoised target
    assert model.position_weights[1] == 1.0 and torch.isclose(model.position_weights[8], torch.tensor(1 / torch.e))


def test_cli_fit_logs_exports_and_resumes(train, tiny_target_dir, tmp_path):
    from mlflow.tracking import MlflowClient

    from lit_domino.interop import load_drafter
    from lit_domino.runtime.tracking import default_tracking_uri
    from lit_domino.training.configs import load_config

    uri = default_tracking_uri()  # $MLFLOW_TRACKING_URI: the tests' session store (conftest)
    assert uri.startswith("sqlite:///") and str(ROOT) not in uri
    common = ["--data.train_examples", "{math: 6, code: 2}", "--data.val_examples", "{math: 2}",
              "--data.max_new_tokens", "12", "--data.batch_size", "4", "--data.num_anchors", "3",
              "--data.feature_layers", "[1, 3]", "--trainer.log_every_n_steps", "1",
              "--trainer.enable_progress_bar", "false", "--tracking.experiment", "cli-test"]
    args = _args("domino", "smoke", tiny_target_dir, tmp_path / "run", *common, tracking=True)
    cli = train.main(["fit", *args, "--trainer.max_epochs", "1"])
    run_id = cli.trainer.logger.run_id
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["variant"] == "domino" and run.data.tags["preset"] == "smoke"
    assert run.data.tags["seed"] == "0" and run.data.tags["mlflow.runName"] == "domino-smoke-s0"
    composed = load_config("domino", "smoke")  # the preset's values, as the run logs them
    assert run.data.params["model.head.rank"] == str(composed["model"]["init_args"]["head"]["rank"])
    assert run.data.params["data.block_size"] == str(composed["data"]["block_size"])
    # one name per setting (not Lightning's hparams beside them: head/rank, curriculum/kind), no output folder
    assert "rank" not in run.data.params and not [k for k in run.data.params if "/" in k]
    assert "checkpoint.dirpath" not in run.data.params and "trainer.default_root_dir" not in run.data.params
    assert "config.yaml" in {a.path for a in client.list_artifacts(run_id)}
    assert "train/loss_final" in run.data.metrics and "val/tau_sim" in run.data.metrics
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    drafter = load_drafter(tmp_path / "run" / "drafter", target=cli.model.target)
    for k, v in cli.model.drafter.state_dict().items():
        assert torch.equal(v, drafter.state_dict()[k])
    # load_from_checkpoint rebuilds the module without Lightning's trainer (target from the recorded spec)
    from lit_domino.lit import load_module

    restored = load_module(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert type(restored).__name__ == "DominoModule" and restored.hparams.feature_layers == [1, 3]
    for k, v in cli.model.drafter.state_dict().items():
        assert torch.equal(v, restored.drafter.state_dict()[k])
    # continue the finished training for another epoch: it resumes at the saved step, in a new run that
    # supersedes the finished one (a completed run is never reopened; its history stays as it was)
    from lit_domino.runtime.tracking import SUPERSEDED_BY_TAG, SUPERSEDES_TAG

    steps = cli.trainer.global_step
    history = [m.step for m in client.get_metric_history(run_id, "train/loss")]
    cli2 = train.main(["fit", *args, "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    new_id = cli2.trainer.logger.run_id
    assert new_id != run_id and cli2.trainer.global_step == 2 * steps
    assert client.get_run(run_id).data.tags[SUPERSEDED_BY_TAG] == new_id
    assert client.get_run(new_id).data.tags[SUPERSEDES_TAG] == run_id
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == history
    assert min(m.step for m in client.get_metric_history(new_id, "train/loss")) >= steps - 1
    assert client.get_run(new_id).info.status == "FINISHED"


def test_cli_crash_before_training_is_recorded_failed(train, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from lit_domino.target.load import TargetError
    from lit_domino.runtime.tracking import default_tracking_uri

    args = _args("backbone", "smoke", tmp_path / "no-such-target", tmp_path / "run", "--tracking.experiment",
                 "cli-crash", "--tracking.run_name", "crash", tracking=True)
    with pytest.raises(SystemExit) as exit_:  # one line, rc 2 (a TargetError: the user can fix it)
        train.main(["fit", *args])
    assert exit_.value.code == 2 and "train: error: target directory" in capsys.readouterr().err
    with pytest.raises(TargetError, match="does not exist"):  # --debug keeps the error itself
        train.main(["fit", *args, "--tracking.run_name", "crash-debug", "--debug"])
    client = MlflowClient(default_tracking_uri())
    runs = client.search_runs([client.get_experiment_by_name("cli-crash").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED", "FAILED"] and runs[0].data.tags["variant"] == "backbone"


@pytest.mark.parametrize("extra,message", [
    (["--set", "model.rnak=8"], "train: error: unknown config key model.rnak; did you mean model.head.rank?"),
    (["--set", "model.rank=8"], "train: error: model.rank moved to model.head.rank (the method's head section)"),
    (["--set", "model.head.rank=0"], "train: error: head.rank must be a positive integer (the Domino correction's "
                                     "rank r), got 0"),
    (["--set", "model.lr=abc"], "train: error: model.lr: expected a float, got 'abc'"),
    (["--set", "methods.domino.rnak=8"], "train: error: methods.domino.rnak: variant domino (domino) has no model key "
                                         "'rnak' (did you mean methods.domino.head.rank?)"),
    (["--set", "data.target=embedded:nosuch"], "train: error: data.target: unknown embedded target 'nosuch'"),
    (["--preset", "nosuch"], "train: error: unknown preset 'nosuch'"),
])
def test_a_bad_set_is_one_line(train, tmp_path, capsys, extra, message):
    """``train.py fit ... --set model.rnak=8`` printed 105 lines (the parser's usage), the one that mattered at 103."""
    with pytest.raises(SystemExit) as exit_:
        train.main(["fit", "--variant", "domino", "--preset", "smoke", "--trainer.default_root_dir", str(tmp_path),
                    *extra], run=False)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith(message), err


@pytest.mark.parametrize("with_variant", [False, True])
def test_a_users_yaml_with_a_flat_head_key_is_one_line(train, tmp_path, capsys, with_variant):
    """A config written for the flat keys (``model.init_args.rank``), given with ``--config``, alone or over a
    variant: one line naming the new key, not the parser's usage."""
    model = {"init_args": {"rank": 8}}
    if not with_variant:
        model["class_path"] = "lit_domino.lit.DominoModule"
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"model": model}))
    argv = ["fit", *(["--variant", "domino", "--preset", "smoke"] if with_variant else []), "--config", str(path)]
    with pytest.raises(SystemExit) as exit_:
        train.main(argv, run=False)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err == "train: error: model.rank moved to model.head.rank (the method's head " \
                                           "section)\n", err


def test_set_reaches_the_presets_method_section_and_checks_keys_without_building_the_trainer(train, tiny_target_dir,
                                                                                            tmp_path):
    from lit_domino.training.configs import load_config

    preset = load_config("domino", "smoke")["model"]["init_args"]["head"]
    cli = train.main(_args("domino", "smoke", tiny_target_dir, tmp_path, "--set", "methods.domino.head.rank=8"),
                     run=False)
    assert preset["rank"] != 8  # else the override would not show
    assert cli.model.hparams.head == {**preset, "rank": 8}  # the rest of the preset's head kept
    # the paper preset's Trainer wants a GPU: the --set check parses it but leaves it to --trainer.accelerator cpu
    cli = train.main(_args("domino", "paper", tiny_target_dir, tmp_path, "--set", "model.head.rank=16"), run=False)
    assert cli.model.hparams.head["rank"] == 16 and cli.trainer.accelerator.__class__.__name__ == "CPUAccelerator"
