"""Config loading: defaults, overrides, and errors that name the file and the field."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from evotrainer.cli.main import app
from evotrainer.config import ConfigError, load_config
from evotrainer.paths import CONFIGS_DIR


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_shipped_configs_load():
    for path in sorted(CONFIGS_DIR.glob("math*.yaml")):
        cfg = load_config(path)
        assert cfg.domain.name == "math"


def test_override_sets_nested_value_with_yaml_types():
    cfg = load_config(CONFIGS_DIR / "math.yaml", ["train.seed=7", "eval.seeds=[1,2]", "domain.levels=[2]"])
    assert cfg.train.seed == 7
    assert cfg.eval.seeds == [1, 2]
    assert cfg.domain.levels == [2]


def test_unknown_key_names_file_and_field(tmp_path):
    p = write(tmp_path, "train:\n  stepz: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(p) in str(e.value) and "train.stepz" in str(e.value) and "unknown key" in str(e.value)


def test_unknown_override_key_is_rejected():
    with pytest.raises(ConfigError, match="train.nope: unknown key"):
        load_config(CONFIGS_DIR / "math.yaml", ["train.nope=1"])


def test_wrong_type_names_field(tmp_path):
    p = write(tmp_path, "train:\n  steps_per_round: many\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "train.steps_per_round" in str(e.value) and str(p) in str(e.value)


def test_missing_model_path(tmp_path):
    p = write(tmp_path, f"policy:\n  model: {tmp_path}/no-such-model\n")
    with pytest.raises(ConfigError, match="policy.*model path does not exist"):
        load_config(p)


def test_missing_harness_folder(tmp_path):
    p = write(tmp_path, f"harness: {tmp_path}/nowhere\n")
    with pytest.raises(ConfigError, match="harness: folder does not exist"):
        load_config(p)


def test_invalid_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path, "train: [1,\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


def test_domain_flag_must_match_file(tmp_path):
    p = write(tmp_path, "domain:\n  name: math\n")
    with pytest.raises(ConfigError):
        load_config(p, domain="swe")


def test_cli_bad_config_fails_before_work(tmp_path):
    p = write(tmp_path, "train:\n  stepz: 3\n")
    result = CliRunner().invoke(app, ["train", "--config", str(p), "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 2
    assert "train.stepz" in result.output
    assert not (tmp_path / "w").exists()  # nothing was started
