"""lit_domino.training.configs + cli.check_config: configs compose from deltas; a mistyped key is a loud error."""

import dataclasses

import pytest

from lit_domino.training.cli import ConfigError, check_config
from lit_domino.training.configs import load_config
from lit_domino.training.experiment import drafter_artifact, train_variant, training_key


@pytest.mark.parametrize("override,message", [
    ({"model.rnak": 3}, "unknown config key model.rnak; did you mean model.head.rank?"),
    ({"model.rank": 3}, "model.rank moved to model.head.rank (the method's head section)"),
    ({"model.head.rnak": 3}, "unknown config key model.head.rnak; did you mean model.head.rank?"),
    ({"model.head.rank": 0}, "head.rank must be a positive integer (the Domino correction's rank r), got 0"),
    ({"model.head.rank": "abc"}, "model.head.rank: expected an integer, got 'abc'"),
    ({"trainer.max_step": 3}, "unknown config key trainer.max_step; did you mean trainer.max_steps"),
    ({"data.batch_sise": 3}, "unknown config key data.batch_sise; did you mean data.batch_size"),
    ({"model.curriculum.knd": "none"}, "unknown config key model.curriculum.knd; did you mean model.curriculum.kind?"),
    ({"nosuch.key": 1}, "unknown config section(s) 'nosuch'"),
    ({"data.batch_size": "x"}, "data.batch_size: expected an integer, got 'x'"),
    # a type error names the key and the type, not a dump of the model's section
    ({"model.lr": "abc"}, "model.lr: expected a float, got 'abc'"),
    ({"model.curriculum.start": "x"}, "model.curriculum.start: expected a float, got 'x'"),
    ({"trainer.max_epochs": "x"}, "trainer.max_epochs: expected an integer or null, got 'x'"),
    ({"model.causal_inputs": "foo"}, "model.causal_inputs: expected one of 'teacher_forced', 'training_time_test'"),
])
def test_mistyped_keys_are_errors_with_close_matches(override, message):
    with pytest.raises(ConfigError) as err:
        check_config(load_config("domino", "smoke", 0, override))
    assert message in str(err.value) and "\n" not in str(err.value) and "init_args" not in str(err.value)


def test_a_method_key_on_another_method_is_an_error():
    check_config(load_config("domino", "smoke", 0, {"model.head.rank": 16}))  # the Domino module takes it
    with pytest.raises(ConfigError, match="unknown config key model.head.rank; model takes activation"):
        check_config(load_config("backbone", "smoke", 0, {"model.head.rank": 16}))
    with pytest.raises(ConfigError, match="unknown config key model.head.gru_hidden; model.head takes confidence"):
        check_config(load_config("dspark", "smoke", 0, {"model.head.gru_hidden": 16}))  # Domino's field


def test_a_flat_head_key_names_its_new_place():
    """A head field spelled flat, as before the head section (``--set``, a preset's ``methods:`` section or a
    user's YAML), is one line naming the new key, from the modules' source (before Lightning) and the parser."""
    from lit_domino.training import configs

    for where in ({"model.rank": 8}, {"model.init_args.top_k": 8}):
        with pytest.raises(ConfigError, match=r"^model\.(rank|top_k) moved to model\.head\.(rank|top_k) "):
            configs.check_model_overrides("dflash2", "smoke", where)
    with pytest.raises(ConfigError, match=r"^methods\.dspark\.head_type moved to methods\.dspark\.head\.head_type"):
        load_config("dspark", "smoke", 0, {"methods.dspark.head_type": "rnn"})
    cfg = load_config("domino", "smoke", 0)
    cfg["model"]["init_args"]["gru_hidden"] = 16  # a YAML written for the flat keys
    with pytest.raises(ConfigError, match=r"^model\.gru_hidden moved to model\.head\.gru_hidden "):
        check_config(cfg)


def test_an_old_preset_with_flat_head_keys_is_refused(tmp_path):
    import shutil
    from lit_domino.training.configs import CONFIG_DIR, compose

    shutil.copytree(CONFIG_DIR, tmp_path / "configs")
    preset = tmp_path / "configs" / "presets" / "smoke.yaml"
    preset.write_text(preset.read_text().replace("domino: {head: {rank: 32, gru_hidden: 64}}",
                                                 "domino: {rank: 32, gru_hidden: 64}"))
    with pytest.raises(ConfigError, match=r"^methods\.domino\.rank moved to methods\.domino\.head\.rank"):
        compose("domino", "smoke", tmp_path / "configs")


def test_a_module_from_yaml_equals_the_module_built_in_python():
    """The variant's YAML (parsed and instantiated by the training parser) and the Python constructor with the
    same head config give the same hyper-parameters and the same drafter options."""
    from lit_domino.lit import DominoModule, DSparkModule
    from lit_domino.models import DominoHeadConfig, DSparkHeadConfig
    from lit_domino.training.cli import _ParseOnlyCLI, cli_args

    for variant, cls, head in (("domino", DominoModule, DominoHeadConfig(rank=32, gru_hidden=64)),
                               ("dspark", DSparkModule, DSparkHeadConfig(rank=12, head_type="gated"))):
        cfg = load_config(variant, "smoke", 0, {"methods.dspark.head.rank": 12, "model.head.head_type": "gated"}
                          if variant == "dspark" else None)
        from_yaml = _ParseOnlyCLI(args=cli_args(cfg), run=False).model
        init = {k: v for k, v in cfg["model"]["init_args"].items() if k != "head"}
        in_python = cls(**init, head=head, block_size=cfg["data"]["block_size"], target=cfg["data"]["target"])
        assert type(from_yaml) is cls and from_yaml.head_config == head
        assert from_yaml.drafter_options() == in_python.drafter_options()
        drop = ("_class_path", "_instantiator")
        assert {k: v for k, v in from_yaml.hparams.items() if k not in drop} == dict(in_python.hparams)


def test_a_typo_is_never_answered_from_the_cache(tmp_path):
    """``--set trainer.max_step=3`` must not report a cached drafter: the config is parsed before the cache."""
    cfg = load_config("backbone", "smoke", 0, {"trainer.max_step": 3})
    path = drafter_artifact(cfg, root=tmp_path)
    path.mkdir(parents=True)
    (path / ".complete").write_text("ok")  # a finished artifact under that key (an old-format marker)
    (path / "report.json").write_text("{}")
    with pytest.raises(ConfigError, match="trainer.max_step"):
        train_variant(cfg, root=tmp_path, progress=False)


def test_every_trainer_setting_that_can_change_a_drafter_is_in_its_cache_key():
    base = load_config("backbone", "smoke", 0)
    key = training_key(base)
    for setting in ({"trainer.val_check_interval": 0.5}, {"trainer.deterministic": True}, {"trainer.limit_train_batches": 3}):
        assert training_key(load_config("backbone", "smoke", 0, setting)) != key, setting
    for cosmetic in ({"trainer.enable_progress_bar": False}, {"trainer.log_every_n_steps": 7}):
        assert training_key(load_config("backbone", "smoke", 0, cosmetic)) == key, cosmetic


def test_the_cheap_target_check_knows_the_embedded_targets_and_their_recipe_specs():
    from lit_domino.training import configs
    from lit_domino.target import load as target

    assert configs.EMBEDDED_PREFIX == target.EMBEDDED_PREFIX
    configs.check_target_spec("embedded:large@recipe")
    with pytest.raises(ConfigError, match="unknown embedded target 'nosuch'"):
        configs.check_target_spec("embedded:nosuch@recipe")


def test_the_presets_method_sections_can_be_overridden():
    """``--set methods.domino.head.rank=8`` reaches the preset's per-method section (it was an unknown section)."""
    preset = load_config("domino_ttt", "smoke", 0)["model"]["init_args"]["head"]
    assert preset["rank"] != 8 and preset["gru_hidden"] != 2 * preset["rank"] + 1  # else the overrides would not show
    cfg = load_config("domino_ttt", "smoke", 0, {"methods.domino.head.rank": 8})
    assert cfg["model"]["init_args"]["head"] == {**preset, "rank": 8}
    assert "methods" not in cfg
    check_config(cfg)
    gru = 2 * preset["rank"] + 1
    merged = load_config("domino", "smoke", 0, {"methods.domino": {"head": {"gru_hidden": gru}}})["model"]["init_args"]
    assert merged["head"] == {**preset, "gru_hidden": gru}  # a mapping merges into the preset's section
    assert load_config("eagle3", "default", 0, {"methods.eagle3.ttt_steps": 2})["model"]["init_args"]["ttt_steps"] == 2
    with pytest.raises(ConfigError, match="variant backbone is a backbone drafter; methods.domino reaches only"):
        load_config("backbone", "smoke", 0, {"methods.domino.head.rank": 8})
    with pytest.raises(ConfigError, match=r"methods.domino.rnak: .*did you mean methods.domino.head.rank\?"):
        load_config("domino", "smoke", 0, {"methods.domino.rnak": 8})
    with pytest.raises(ConfigError, match=r"unknown config key methods.domino.head.rnak; did you mean "
                                          r"methods.domino.head.rank\?"):
        load_config("domino", "smoke", 0, {"methods.domino.head.rnak": 8})


STUDY = ["eagle3", "small_lm", "backbone", "domino", "domino_ttt", "domino_nocurriculum"]


def test_a_method_key_reaches_the_variants_that_take_it_and_names_those_it_skipped():
    from lit_domino.training.configs import study_overrides

    per_variant, notes = study_overrides(STUDY, "smoke", {"model.head.rank": 8, "data.batch_size": 2})
    assert notes == ["model.head.rank=8: applied to domino, domino_ttt, domino_nocurriculum; "
                     "not to eagle3, small_lm, backbone (no such key)"]
    assert {v: o.get("model.head.rank") for v, o in per_variant.items()} == {
        "eagle3": None, "small_lm": None, "backbone": None, "domino": 8, "domino_ttt": 8, "domino_nocurriculum": 8}
    assert all(o["data.batch_size"] == 2 for o in per_variant.values())  # other sections: every variant
    per_variant, notes = study_overrides(STUDY, "smoke", {"methods.eagle3.ttt_steps": 2})
    assert notes == ["methods.eagle3.ttt_steps=2: applied to eagle3; not to small_lm, backbone, domino, domino_ttt, "
                     "domino_nocurriculum (other methods)"]
    assert load_config("eagle3", "smoke", 0, per_variant["eagle3"])["model"]["init_args"]["ttt_steps"] == 2
    assert study_overrides(["domino", "domino_ttt"], "smoke", {"model.head.rank": 8})[1] == []  # none skipped
    # a head field reaches the variants whose head has it (DSpark's head has no GRU)
    assert study_overrides(["domino", "dspark"], "smoke", {"model.head.gru_hidden": 8})[1] == [
        "model.head.gru_hidden=8: applied to domino; not to dspark (no such key)"]


@pytest.mark.parametrize("variants,override,message", [
    (STUDY, {"model.rnak": 8}, "model.rnak: no variant of this run takes it (eagle3, small_lm, backbone, domino, "
                               "domino_ttt, domino_nocurriculum); did you mean model.head.rank (domino, "),
    (["backbone"], {"model.head.rank": 8}, "model.head.rank: no variant of this run takes it (backbone); did you "
                                           "mean model.head.rank (dflash2, domino, "),
    (["backbone"], {"model.rank": 8}, "model.rank moved to model.head.rank"),
    (STUDY, {"methods.domino.gru_hidden": 8}, "methods.domino.gru_hidden moved to methods.domino.head.gru_hidden"),
    (STUDY, {"methods.domnio.rank": 8}, "unknown method 'domnio' (did you mean domino?)"),
    (STUDY, {"methods.domino.rnak": 8}, "(did you mean methods.domino.head.rank?)"),
    (["eagle3"], {"methods.domino.head.rank": 8}, "methods.domino.head.rank=8: reaches none of this run's variants "
                                             "(eagle3 is a eagle3 drafter)"),
    (STUDY, {"methods": 3}, "name the method and its key"),
    (STUDY, {"tranier.max_epochs": 3}, "unknown config section 'tranier' (did you mean trainer?)"),
])
def test_an_override_that_reaches_no_variant_is_an_error_with_a_close_match(variants, override, message):
    from lit_domino.training.configs import study_overrides

    with pytest.raises(ConfigError) as err:
        study_overrides(variants, "smoke", override)
    assert message in str(err.value)


@pytest.mark.parametrize("spec,message", [
    ("embedded:nosuch", "unknown embedded target 'nosuch'; choose one of embedded:default, embedded:large, "
                        "embedded:rehearsal, embedded:rehearsal-large, embedded:smoke"),
    ("embedded:smok", "(did you mean embedded:smoke?)"),
    ("/nonexistent/model", "target directory '/nonexistent/model' does not exist"),
    ("not a hub id!", "is neither embedded:<name>, an existing directory nor a hub id"),
    (3, "expected a model directory, a hub id or embedded:<name>, got 3"),
])
def test_a_target_spec_is_checked_before_anything_is_built(spec, message):
    from lit_domino.training.configs import check_target_spec

    with pytest.raises(ConfigError) as err:
        check_target_spec(spec)
    assert message in str(err.value)


def test_a_plausible_target_spec_passes(tmp_path):
    from lit_domino.training.configs import check_target_spec

    for spec in ("embedded:smoke", "Qwen/Qwen3-8B", "gpt2"):
        check_target_spec(spec)
    with pytest.raises(ConfigError, match="no config.json"):
        check_target_spec(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    check_target_spec(str(tmp_path))


@pytest.mark.parametrize("argv,message", [
    (["--seeds", "abc"], "seeds are integers >= 0"),
    (["--seeds", "0,-1"], "got '-1'"),
    (["--preset", "smoke", "--variants", "domino", "--set", "model.rnak=3"],
     "model.rnak: no variant of this run takes it (domino); did you mean model.head.rank (domino, "),
    (["--preset", "smoke", "--variants", "domino", "--set", "model.head.rank=0"],
     "head.rank must be a positive integer (the Domino correction's rank r), got 0"),
    (["--preset", "smoke", "--variants", "domino", "--set", "model.rank=8"], "model.rank moved to model.head.rank"),
    (["--preset", "smoke", "--set", "model.rnak=8"],
     "did you mean model.head.rank (domino, dspark, dflash2, domino_ttt, domino_nocurriculum)?"),
    (["--preset", "smoke", "--set", "model.lr=abc"], "ablation: error: variant eagle3: model.lr: expected a float, "
                                                     "got 'abc'"),
    (["--preset", "smoke", "--set", "model.curriculum.knd=none"], "model.curriculum.knd: no variant of this run "
                                                                  "takes it (eagle3, small_lm, backbone, domino, "),
    (["--preset", "nosuch"], "ablation: error: unknown preset 'nosuch'; choose one of default, paper, rehearsal, smoke"),
    (["--preset", "smoke", "--variants", "domino,domnio"], "unknown variants 'domnio' (did you mean domino?)"),
    (["--preset", "smoke", "--set", "data.target=embedded:nosuch"], "data.target: unknown embedded target 'nosuch'"),
    (["--preset", "smoke", "--jobs", "0"], "--jobs is 'auto' or an integer >= 1"),
])
def test_the_ablation_command_line_fails_in_one_line(argv, message, capsys, monkeypatch):
    """Each bad argument is one line with rc 2, before any target is built or any drafter trained."""
    from lit_domino.training import experiment
    from lit_domino.target import load as target, recipe as tiny_target
    from lit_domino.studies.ablation import main

    def built(*args, **kwargs):
        raise AssertionError("a target was built or a drafter trained before the arguments were checked")

    for module, name in ((target, "load_target"), (tiny_target, "build_tiny_target"), (experiment, "train_variant")):
        monkeypatch.setattr(module, name, built)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err
    assert err.count("\n") == 1 and err.startswith("ablation: error: "), err


def test_static_model_keys_equal_the_module_signatures():
    """configs.static_module reads each variant's LightningModule from its source (so a command checks --set
    model keys without importing Lightning); its kind, keys and annotations must be what the import gives."""
    from lit_domino.training import configs

    for variant in configs.available_variants():
        cfg = configs.compose(variant, "smoke")
        cls = configs.module_class(cfg)
        static = configs.static_module(cfg["model"]["class_path"])
        assert static is not None, variant
        params = configs.model_parameters(cls)
        assert static == (cls.drafter_class.kind,
                          {n: None if p.annotation is p.empty else p.annotation for n, p in params.items()}), variant
        assert configs.model_keys(cfg) == static[1] and configs.method_kind(cfg) == cls.drafter_class.kind
        # the dataclass sections (head, curriculum) and their fields, as the import sees them
        imported = {n: [f.name for f in dataclasses.fields(p.default)] for n, p in params.items()
                    if dataclasses.is_dataclass(p.default)}
        assert configs.static_sections(cfg["model"]["class_path"]) == imported, variant
        assert ("head" in imported) == (cls.drafter_class.kind in ("domino", "dspark", "dflash2")), variant
    assert configs.static_module("lit_domino.lit.loop.LoopModule") is None  # drafter_class set at run time: import


@pytest.mark.parametrize("value, annotation, message", [
    ("abc", "float", "model.x: expected a float, got 'abc'"),
    ("x", "int | None", "model.x: expected an integer or null, got 'x'"),
    ("1.5", "int", "model.x: expected an integer, got '1.5'"),
])
def test_check_number_names_the_type(value, annotation, message):
    from lit_domino.training.configs import ConfigError as StaticError, check_number

    with pytest.raises(StaticError, match=message.replace("|", r"\|")):
        check_number("model.x", value, annotation)


@pytest.mark.parametrize("value, annotation", [("1e-3", "float"), (3, "float"), ("3", "int | None"), ("abc", "str"),
                                               ("abc", "LambdaSchedule"), ("abc", None), ("x", "tuple[float, float]"),
                                               ("None", "float | None")])
def test_check_number_leaves_the_rest_to_the_parser(value, annotation):
    from lit_domino.training.configs import check_number

    check_number("model.x", value, annotation)  # no error: a number's text, or a type the parser checks


def test_the_feature_rule_comes_from_the_drafter_method():
    from lit_domino.lit import DSparkModule, Eagle3Module, SmallLMModule
    from lit_domino.training.configs import ConfigError, resolve_feature_rule

    assert resolve_feature_rule({}, Eagle3Module)["feature_rule"] == "eagle3"
    assert resolve_feature_rule({"feature_rule": None}, DSparkModule)["feature_rule"] == "dspark"
    assert resolve_feature_rule({}, SmallLMModule)["feature_rule"] == "dflash"  # reads no features
    with pytest.raises(ConfigError, match="data.feature_rule: .*'eagle3' features"):
        resolve_feature_rule({"feature_rule": "dflash"}, Eagle3Module)
