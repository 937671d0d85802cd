"""`python -m bench`: one front door. Its help lists every command with a line each, every command's own
`--help` answers with its flags, and flags without a command run the benchmark itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench import __main__ as front_door
from bench.commands import BY_NAME, COMMANDS, Command

ROOT = Path(__file__).resolve().parents[2]


def test_the_help_lists_every_command_with_its_one_line_help(capsys):
    assert front_door.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m bench <command> [flags]")
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    for command in COMMANDS:
        assert lines[command.name].endswith(f"  {command.help}"), command.name
        assert "\n" not in command.help and len(command.help) <= 100, command.name
    names = (
        "run headline reproduce ab report readme tracing mlperf rollout",
        "serving shared-device accelerator floors",
    )
    assert set(" ".join(names).split()) == set(BY_NAME) and len(COMMANDS) <= 13  # one command of each kind


def test_no_arguments_print_the_help_as_a_usage_error_and_an_unknown_command_is_refused(capsys):
    assert front_door.main([]) == 2
    assert "usage: python -m bench <command>" in capsys.readouterr().err
    assert front_door.main(["bogus"]) == 2
    assert "no command 'bogus'" in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.name)
def test_every_command_answers_its_own_help_with_its_flags(command: Command, capsys):
    with pytest.raises(SystemExit) as exit_:
        front_door.main([command.name, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m bench"), text[:200]
    assert "RELAYGR_" in text or "--" in text


def test_the_headline_command_is_the_block_experiment_and_flags_without_a_command_run(monkeypatch):
    called: list[tuple[str, list[str]]] = []
    monkeypatch.setattr("bench.headline.__main__.main", lambda argv: called.append(("headline", list(argv))))
    monkeypatch.setattr("bench.run.__main__.main", lambda argv: called.append(("run", list(argv))))
    assert front_door.main(["headline", "--name", "headline-2"]) == 0
    assert front_door.main(["--profile", "quick"]) == 0  # flags without a command: `run`
    assert called == [("headline", ["--name", "headline-2"]), ("run", ["--profile", "quick"])]


def test_a_commands_status_is_the_exit_status(monkeypatch):
    monkeypatch.setattr("bench.headline.compare.main", lambda argv: 1)
    assert front_door.main(["reproduce", "--runs", "a,b"]) == 1


def test_the_library_imports_no_command():
    """No module of bench/ other than a command's own imports a command: the modules the table names, or
    bench.commands."""
    commands = {command.target.split(":")[0] for command in COMMANDS}
    for path in sorted((ROOT / "bench").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module in commands or module in ("bench.commands", "bench.__main__"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert name not in commands and not name.startswith("bench.commands"), f"{module}: {name}"
