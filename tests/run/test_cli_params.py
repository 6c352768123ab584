"""run.py flags, their runconfig overrides, the path rule and every params error (parse only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from csrun.errors import UsageError
from csrun.run.cli_args import RunPath, apply_overrides, check_system_rules, choose_path, load_params, parse_args
from csrun.run.params import params_from_dict
from csrun.typed_config import ConfigError
from tests.run.conftest import DEBUG_YAML, fc_mnist_model_module

BASE = yaml.safe_load(DEBUG_YAML.read_text())
M = fc_mnist_model_module()
CONFIGS = {"model_config": M.FcMnistConfig, "input_config": M.FcMnistInputConfig}


def params_for(argv: list[str], env: dict[str, str] | None = None, default_model_dir: str = "/md"):
    args = parse_args(["-p", str(DEBUG_YAML), *argv], environ=env or {})
    return load_params(args, default_model_dir=default_model_dir, **CONFIGS)


@pytest.mark.parametrize("argv,key,value", [
    (["-m", "eval"], "mode", "eval"),
    (["--mode", "train_and_eval"], "mode", "train_and_eval"),
    (["-m", "train", "-cs", "10.0.0.5"], "cs_ip", "10.0.0.5:9000"),
    (["-m", "train", "--cs_ip", "h:1234"], "cs_ip", "h:1234"),
    (["-m", "train", "--cs_ip", "embedded"], "cs_ip", "embedded"),
    (["-m", "train", "-cpu"], "cpu", True),
    (["-m", "train", "--compile_only"], "compile_only", True),
    (["-m", "train", "--validate_only"], "validate_only", True),
    (["-m", "train", "-o", "/x/out"], "model_dir", "/x/out"),
    (["-m", "train", "--model_dir", "/y"], "model_dir", "/y"),
    (["-m", "train", "--checkpoint_path", "c.mdl"], "checkpoint_path", "c.mdl"),
    (["-m", "train", "--checkpoint_path", "c.mdl", "--is_pretrained_checkpoint"], "is_pretrained_checkpoint", True),
    (["-m", "train", "--logging", "debug"], "logging", "debug"),
    (["-m", "train", "-c", "/cd"], "compile_dir", "/cd"),
    (["-m", "train", "--execution_strategy", "pipeline"], "execution_strategy", "pipeline"),
    (["-m", "train", "--resume"], "resume", True),
    (["-m", "train"], "model_dir", "/md"),
])
def test_each_flag_overrides_its_runconfig_key(argv: list[str], key: str, value: object) -> None:
    assert getattr(params_for(argv).runconfig, key) == value


def test_cs_ip_defaults_to_the_environment() -> None:
    assert params_for(["-m", "train"], env={"CS_IP": "1.2.3.4"}).runconfig.cs_ip == "1.2.3.4:9000"
    assert params_for(["-m", "train", "--cs_ip", "h:1"], env={"CS_IP": "1.2.3.4"}).runconfig.cs_ip == "h:1"


def test_flag_beats_yaml_model_dir_and_yaml_beats_default(tmp_path: Path) -> None:
    data = {**BASE, "runconfig": {**BASE["runconfig"], "model_dir": "from_yaml"}}
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    assert load_params(parse_args(["-p", str(p), "-m", "train"], environ={}), default_model_dir="/d", **CONFIGS).runconfig.model_dir == "from_yaml"
    assert load_params(parse_args(["-p", str(p), "-m", "train", "-o", "cli"], environ={}),
                       default_model_dir="/d", **CONFIGS).runconfig.model_dir == "cli"


def test_config_picks_a_top_level_key(tmp_path: Path) -> None:
    p = tmp_path / "many.yaml"
    p.write_text(yaml.safe_dump({"small": BASE, "other": BASE}))
    assert load_params(parse_args(["-p", str(p), "-m", "train", "--config", "small"], environ={}), **CONFIGS).runconfig.max_steps == 200
    with pytest.raises(ConfigError, match="--config 'nope': not a top-level key"):
        load_params(parse_args(["-p", str(p), "-m", "train", "--config", "nope"], environ={}), **CONFIGS)


@pytest.mark.parametrize("argv", [[], ["-m", "train"], ["-p", "x.yaml"], ["-p", "x", "-m", "fly"],
                                  ["-p", "x", "-m", "train", "--execution_strategy", "weight_stream"]])
def test_bad_command_lines_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError) as exc:  # run.py prints it as one 'run.py: error: ...' line, exit 2
        parse_args(argv, environ={})
    assert exc.value.exit_code == 2 and "(see run.py --help)" in str(exc.value)


@pytest.mark.parametrize("argv,env,kind,cs_ip", [
    (["-m", "train"], {}, "cpu", None),
    (["-m", "train", "--cs_ip", "h"], {}, "system", "h:9000"),
    (["-m", "train", "--cs_ip", "h", "--cpu"], {}, "cpu", None),
    (["-m", "train", "--compile_only"], {}, "system", None),
    (["-m", "train", "--validate_only", "--cpu"], {}, "system", None),
    (["-m", "train"], {"CSRUN_LAUNCHER": "csrun_wse"}, "system", None),
    (["-m", "train", "--cpu"], {"CSRUN_LAUNCHER": "csrun_wse"}, "cpu", None),
    (["-m", "train"], {"CSRUN_LAUNCHER": "csrun_cpu"}, "cpu", None),
])
def test_path_rule(argv: list[str], env: dict[str, str], kind: str, cs_ip: str | None) -> None:
    path = choose_path(params_for(argv), environ=env)
    assert (path.kind, path.cs_ip) == (kind, cs_ip)


def test_system_refusals() -> None:
    system = RunPath(kind="system", cs_ip="h:9000", reason="test")
    with pytest.raises(ConfigError, match=r"^Training with Eval on CS is not currently supported\.$"):
        check_system_rules(params_for(["-m", "train_and_eval"]), system)
    data = {**BASE, "optimizer": {**BASE["optimizer"], "grad_accum_steps": 2}}
    accum = params_from_dict(apply_overrides(data, parse_args(["-p", "x", "-m", "train"], environ={}), default_model_dir="d"), **CONFIGS)
    with pytest.raises(ConfigError, match=r"^Gradient Accumulation not supported on CS workflow\.\nFix: .*weight_streaming"):
        check_system_rules(accum, system)
    check_system_rules(accum, RunPath(kind="cpu", cs_ip=None, reason="test"))  # fine on the CPU


def bad(**sections: dict) -> dict:
    data = {k: dict(v) for k, v in BASE.items()}
    for name, changes in sections.items():
        data[name] = {**data.get(name, {}), **changes}
    return data


@pytest.mark.parametrize("data,message", [
    (bad(runconfig={"max_stepz": 3}), r"runconfig\.max_stepz: unknown key\. Did you mean 'max_steps'\?\nvalid keys:\n  mode"),
    (bad(optimizer={"momentun": 0.9}), r"optimizer\.momentun: unknown key.*\n.*valid keys:(.|\n)*  momentum"),
    (bad(model={"depht": 3}), r"model\.depht: unknown key(.|\n)*valid keys"),
    (bad(runconfig={"num_steps": 5, "num_epochs": 2}), r"runconfig: give one of num_steps and num_epochs, not both"),
    (bad(runconfig={"checkpoint_path": None, "is_pretrained_checkpoint": True}),
     r"runconfig\.is_pretrained_checkpoint: needs runconfig\.checkpoint_path"),
    (bad(runconfig={"compile_only": True, "validate_only": True}), r"^Please set one of compile_only and validate_only$"),
    (bad(optimizer={"learning_rate": [{"scheduler": "Linear", "initial_learning_rate": 0.1, "end_learning_rate": 0.0},
                                      {"scheduler": "Constant", "learning_rate": 0.0}]}),
     r"optimizer\.learning_rate: .*Linear.*steps"),
    (bad(optimizer={"optimizer_type": "lbfgs"}), r"optimizer\.optimizer_type: 'lbfgs' is not one of"),
    (bad(runconfig={"log_steps": 0}), r"runconfig\.log_steps: 0 must be at least 1"),
    (bad(train_input={"batch_size": "big"}), r"train_input\.batch_size: 'big' must be a whole number"),
    ({**BASE, "extra": {}}, r"extra: unknown section; valid sections"),
])
def test_params_errors_name_the_yaml_path(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        params_from_dict(data, **CONFIGS)


def test_max_steps_required_without_steps_or_epochs() -> None:
    data = bad()
    del data["runconfig"]["max_steps"]
    with pytest.raises(ConfigError, match=r"runconfig\.max_steps: required"):
        params_from_dict(data, **CONFIGS)
