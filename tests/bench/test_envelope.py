"""One envelope around every command's results (`bench.lib.envelope`): every committed result is one, whose
record reads back out of it and goes back in as the same bytes, and a record of any command goes in and
comes out as it was; `python -m bench report` renders every committed folder's report(s) as committed, by
the renderer of the command that wrote it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.lib import envelope
from bench.lib.envelope import FIELDS, HEADER
from bench.report import __main__ as report_command

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
FILES = sorted(
    [*RESULTS.glob("*/results.json"), *RESULTS.glob("*/result.json"), *RESULTS.glob("*/*/*/result.json")]
)
# Recorded by hand or by a tool of their time, not by a command: no envelope.
RECORDED = {"focus-16", "gain-stability"}


def test_every_committed_result_but_the_recorded_ones_is_an_envelope():
    bare = {path.relative_to(RESULTS).parts[0] for path in FILES if envelope.command_of(path) is None}
    assert bare == RECORDED
    commands = {envelope.command_of(path) for path in FILES} - {None}
    assert commands == set(FIELDS)  # every command has committed results


@pytest.mark.parametrize(
    "path", [p for p in FILES if envelope.command_of(p)], ids=lambda p: str(p.relative_to(RESULTS))
)
def test_a_committed_result_reads_out_of_its_envelope_and_back_in_byte_for_byte(path: Path):
    data = json.loads(path.read_text())
    assert list(data) == [*HEADER, "payload"]
    command = data["command"]
    record = envelope.read(path, command)
    assert not set(FIELDS[command].values()) & set(data["payload"])  # lifted, not also in the payload
    rest = {name: data[name] for name in HEADER if name not in FIELDS[command] and name != "command"}
    assert envelope.dumps(envelope.wrap(command, record, **rest)) == path.read_text()


VALUES = st.one_of(st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=3))


@given(
    command=st.sampled_from(sorted(FIELDS)),
    data=st.data(),
)
def test_any_record_comes_out_of_its_envelope_as_it_went_in(command, data):
    own = sorted(FIELDS[command].values())
    held = data.draw(st.lists(st.sampled_from(own), unique=True)) if own else []
    record = {key: data.draw(VALUES) for key in held}
    record.update(
        data.draw(st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: k not in own), VALUES))
    )
    wrapped = envelope.wrap(command, record, commit="abc1234")
    assert envelope.unwrap(wrapped, command) == record
    if "commit" not in FIELDS[command]:
        assert wrapped["commit"] == "abc1234"  # what the record does not hold, the writer gives


def test_a_result_of_another_command_or_no_envelope_is_refused_by_name(tmp_path: Path):
    path = tmp_path / "results.json"
    envelope.write(path, "ab", {"settings": {"seeds": 5}, "cells": []})
    with pytest.raises(ValueError, match=r"results\.json: command is 'ab', not 'run'"):
        envelope.read(path, "run")
    for bare in ({"settings": {}}, {"command": "ab", "payload": [1]}):
        path.write_text(json.dumps(bare))
        with pytest.raises(ValueError, match=r"results\.json: no envelope"):
            envelope.read(path, "ab")
    with pytest.raises(ValueError, match="not header fields: colour"):
        envelope.wrap("ab", {}, colour="red")


# Folders whose report no command renders from results: hand-recorded studies and console logs, rollout's
# runs (its summary's first line is the run's wall time and load), and two serving runs older than the
# serving renderer's record.
NOT_RENDERED = {
    "focus-16", "focus-mix1-batched", "gain-stability", "incomplete-10de36d", "incomplete-a592bc0",
    "incomplete-eb298be", "placement-ab", "routing-ab", "serving-ab", "serving-ab-eb298be", "serving-in-turn",
    "rollout", "rollout-population", "serving-07bd905", "serving-582b8ae",
}  # fmt: skip
RENDERED = sorted(path.name for path in RESULTS.iterdir() if path.is_dir() and path.name not in NOT_RENDERED)


@pytest.mark.parametrize("name", RENDERED)
def test_python_m_bench_report_renders_a_committed_folder_as_committed(name: str, tmp_path: Path):
    folder = tmp_path / name
    shutil.copytree(RESULTS / name, folder)
    report_command.main(["--results-dir", str(folder), "--plots", "false"])
    for path in sorted(folder.rglob("*.md")):
        assert path.read_text() == (RESULTS / name / path.relative_to(folder)).read_text(), path


@pytest.mark.parametrize("name", sorted(NOT_RENDERED))
def test_a_folder_no_renderer_reads_is_refused_with_the_reason(name: str, tmp_path: Path):
    folder = tmp_path / name
    shutil.copytree(RESULTS / name, folder)
    with pytest.raises(SystemExit, match=r"python -m bench report: .*(no results|envelope|run only|lacks)"):
        report_command.main(["--results-dir", str(folder), "--plots", "false"])
