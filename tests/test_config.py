import re
from dataclasses import dataclass, field

import pytest

from labkit.config import ConfigError, apply_overrides, from_dict, load_yaml, to_dict
from labkit.credit.reshaping import ReshapeConfig
from labkit.env.feedback import FeedbackConfig


@dataclass
class Inner:
    lr: float = 1e-3
    mode: str = "a"


@dataclass
class Outer:
    steps: int = 10
    names: tuple[str, ...] = ("x",)
    inner: Inner = field(default_factory=Inner)
    flag: bool = False


def test_roundtrip_and_overrides():
    cfg = from_dict(Outer, {"steps": 5, "inner": {"lr": "0.1"}})
    assert cfg.steps == 5 and cfg.inner.lr == 0.1
    cfg2 = apply_overrides(cfg, ["inner.mode=b", "flag=true", "names=a,b"])
    assert cfg2.inner.mode == "b" and cfg2.flag is True and cfg2.names == ("a", "b")
    assert from_dict(Outer, to_dict(cfg2)) == cfg2


@pytest.mark.parametrize("data,msg", [
    ({"stepz": 1}, "unknown key(s) ['stepz']"),
    ({"steps": "many"}, "steps: expected an integer"),
    ({"steps": 1.5}, "steps: expected an integer"),
    ({"inner": {"lr": "fast"}}, "inner.lr: expected a number"),
    ({"flag": "maybe"}, "flag: expected true/false"),
])
def test_bad_values_name_the_key(data, msg):
    with pytest.raises(ConfigError, match=re.escape(msg)):
        from_dict(Outer, data)


def test_bad_override():
    with pytest.raises(ConfigError, match="unknown key 'inner.nope'"):
        apply_overrides(Outer(), ["inner.nope=1"])
    with pytest.raises(ConfigError, match="not of the form key=value"):
        apply_overrides(Outer(), ["steps"])


def test_validate_hook_and_yaml(tmp_path):
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        from_dict(FeedbackConfig, {"repeats": 0})
    p = tmp_path / "c.yaml"
    p.write_text("precision_lambda: 3\nprecision_distance: token\n")
    cfg = load_yaml(FeedbackConfig, p, ["repeats=2"])
    assert cfg.precision_lambda == 3.0 and cfg.precision_distance == "token" and cfg.repeats == 2
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(FeedbackConfig, tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="is not one of"):
        from_dict(FeedbackConfig, {"precision_distance": "graph"})


def test_a_section_merges_onto_the_fields_default_by_every_route(tmp_path):
    """TrainConfig.reshape defaults to the raw recipe: a YAML section and a --set override of
    the same key must give the same config (the YAML route used to start from the blog
    recipe, ReshapeConfig()'s class defaults)."""
    from labkit.credit.reshaping import ReshapeConfig
    from labkit.loops.trainer import TrainConfig, load_config

    p = tmp_path / "c.yaml"
    p.write_text("reshape:\n  normalise: batch\nloss:\n  kl_coef: 0.02\n")
    by_yaml = load_config(p)
    by_set = load_config(None, ["reshape.normalise=batch", "loss.kl_coef=0.02"])
    assert by_yaml == by_set
    assert by_yaml.reshape == ReshapeConfig(**{**vars(ReshapeConfig.raw()), "normalise": "batch"})
    assert from_dict(TrainConfig, {"reshape": {}}).reshape == ReshapeConfig.raw()


def test_nested_sections_merge_deeply():
    @dataclass
    class Top:
        outer: Outer = field(default_factory=lambda: Outer(steps=3, inner=Inner(mode="z")))

    cfg = from_dict(Top, {"outer": {"inner": {"lr": 0.5}}})
    assert cfg.outer == Outer(steps=3, inner=Inner(lr=0.5, mode="z"))


def test_a_yaml_syntax_error_names_the_file_and_line_in_one_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("steps: 3\nloss:\n  kl_coef: [0.1\n")
    with pytest.raises(ConfigError) as e:
        load_yaml(FeedbackConfig, p)
    msg = str(e.value)
    assert "\n" not in msg and f"{p}:4:" in msg and "not valid YAML" in msg
    assert "unicode string" not in msg


def test_overrides_name_a_section_set_a_mapping_and_explain_a_bad_path():
    from labkit.credit.reshaping import recipe
    from labkit.loops.config import TrainConfig

    cfg = apply_overrides(TrainConfig(), ["reshape=reshaped_grpo", "reshape.w_style=0.3",
                                          "estimator=didpo", "estimator_options.lam=0.5",
                                          "estimator_options.eta=0.7"])
    assert cfg.reshape == ReshapeConfig(**{**vars(recipe("reshaped_grpo")), "w_style": 0.3})
    assert cfg.estimator_options == {"lam": 0.5, "eta": 0.7}
    flow = apply_overrides(TrainConfig(), ["estimator=didpo", "estimator_options={lam: 0.5, eta: 0.7}"])
    assert flow.estimator_options == cfg.estimator_options
    assert from_dict(TrainConfig, {"reshape": "reshaped_grpo"}).reshape == recipe("reshaped_grpo")
    for item, says in [("loss..kl_coef=1", "has an empty part"), (".steps=1", "has an empty part"),
                       ("steps.x=1", "'steps' is a value, not a section"),
                       ("lossx.kl_coef=1", "unknown key 'lossx' (did you mean 'loss'?)"),
                       ("loss.kl_cof=1", "unknown key 'loss.kl_cof' (did you mean 'kl_coef'?)"),
                       ("reshape=nope", "unknown reshaping recipe 'nope'")]:
        with pytest.raises(ConfigError, match=re.escape(says)):
            apply_overrides(TrainConfig(), [item])


def test_estimator_options_are_checked_when_the_config_is_built():
    from labkit.credit.advantages import estimator_options
    from labkit.loops.config import TrainConfig

    assert set(estimator_options("didpo_no_ae")) >= {"lam", "eta", "whole_diff"}
    assert "no_episode" not in estimator_options("didpo_no_ae")  # the ablation sets it itself
    assert estimator_options("didpo_fork_no_ae")["normalise"].__args__ == ("rms", "meanstd", "none")
    for options, says in [({"lamda": 1.0}, "didpo takes no option 'lamda' (did you mean 'lam'?)"),
                          ({"lam": "high"}, "estimator_options.lam: expected a number"),
                          ({"eta": 1.5}, "eta must be in (0, 1]"),
                          ({"gs_form": "mult"}, "'mult' is not one of")]:
        with pytest.raises(ValueError, match=re.escape(says)):
            from_dict(TrainConfig, {"estimator": "didpo", "estimator_options": options})
    with pytest.raises(ValueError, match="optim.lr must be > 0"):
        from_dict(TrainConfig, {"optim": {"lr": -1e-3}})
