"""The converter's settings are flags with `RELAYGR_…` twins, like every service's."""

from __future__ import annotations

import pytest

from services.ranker import convert


def test_its_help_names_every_environment_twin(capsys):
    with pytest.raises(SystemExit) as done:
        convert.main(["--help"], {})
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    for name in ("SOURCE_FORMAT", "SOURCE", "SOURCE_CONFIG", "MODEL_DIR"):
        assert f"[env RELAYGR_{name}]" in out


def test_the_environment_sets_what_a_flag_does_not(tmp_path, capsys):
    # A config that cannot be read: the conversion is refused, naming the file the variable gave.
    environ = {"RELAYGR_SOURCE": str(tmp_path / "ckpt"), "RELAYGR_SOURCE_CONFIG": str(tmp_path / "none.json")}
    assert convert.main(["--model-dir", str(tmp_path / "model")], environ) == 2
    assert f"convert: {tmp_path / 'none.json'}: cannot read the config" in capsys.readouterr().err
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("missing", ["--source", "--source-config", "--model-dir"])
def test_each_path_is_required_by_name(missing, capsys):
    given = {"--source": "ckpt", "--source-config": "cfg.json", "--model-dir": "out"}
    argv = [part for flag, value in given.items() if flag != missing for part in (flag, value)]
    with pytest.raises(SystemExit):
        convert.main(argv, {})
    assert f"{missing} is required" in capsys.readouterr().err


def test_an_unknown_source_format_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        convert.main(
            ["--source-format", "dlrmv3", "--source", "a", "--source-config", "b", "--model-dir", "c"], {}
        )
    assert "--source-format" in capsys.readouterr().err
