"""The generated configuration pages: current, every flag of every command on them, none printed twice."""

from __future__ import annotations

import dataclasses
import re

import pytest

from services.common.config import flag_name
from tools import docs

FLAG_ROW = re.compile(r"^\| `(--[a-z0-9-]+)` \|", re.MULTILINE)


@pytest.mark.parametrize("page", list(docs.PAGES), ids=lambda page: page.name)
def test_the_configuration_pages_are_current(page):
    text = page.read_text()
    assert docs.update(text, docs.PAGES[page]()) == text, f"{page.name} is stale: run `python -m tools.docs`"


def sections(rendered: str) -> dict[str, list[str]]:
    """The flags of each `## ` section of a rendered page, in order."""
    out: dict[str, list[str]] = {}
    for part in rendered.split("\n## ")[1:]:
        heading, _, body = part.partition("\n")
        out[heading] = FLAG_ROW.findall(body)
    return out


@pytest.mark.parametrize(
    ("page", "commands", "groups"),
    [
        (docs.CONFIGURATION, docs.SERVICES, docs.SERVICE_GROUPS),
        (docs.BENCH_CONFIGURATION, docs.BENCH, docs.BENCH_GROUPS),
    ],
    ids=["services", "bench"],
)
def test_every_setting_is_printed_once_a_shared_one_in_its_group(page, commands, groups):
    """A command's section lists exactly the flags it does not share through a group (what an extending
    command adds, for one that extends another), each once; each group's section lists the group's."""
    by_heading = sections(docs.PAGES[page]())
    group_classes = [docs.load(group.settings) for group in groups]
    for command in commands:
        cls = docs.load(command.settings)
        if command.extends:
            shared = {f.name for f in dataclasses.fields(docs.load(command.extends))}
        else:
            shared = {f.name for g in group_classes if issubclass(cls, g) for f in dataclasses.fields(g)}
        own = [flag_name(f.name) for f in dataclasses.fields(cls) if f.name not in shared]
        assert by_heading[command.heading] == own, command.name
        assert own, f"{command.name} prints no flag of its own"
    for group, cls in zip(groups, group_classes, strict=True):
        if group.heading in by_heading:
            assert by_heading[group.heading] == [flag_name(f.name) for f in dataclasses.fields(cls)]
    # The generic rows are what the groups save: a group's flag appears in no command's section.
    for group, cls in zip(groups, group_classes, strict=True):
        flags = {flag_name(f.name) for f in dataclasses.fields(cls)}
        for command in commands:
            if not command.extends and issubclass(docs.load(command.settings), cls):
                assert not flags & set(by_heading[command.heading]), (group.heading, command.name)


def test_a_shared_flag_shows_the_default_of_each_service_that_changes_it():
    rendered = docs.PAGES[docs.CONFIGURATION]()
    (port,) = [line for line in rendered.splitlines() if line.startswith("| `--port` |")]
    assert "ranker `50051`" in port and "router `" in port and "trigger `" in port
    (host,) = [line for line in rendered.splitlines() if line.startswith("| `--host` |")]
    assert "| `127.0.0.1` |" in host  # every service's default is the same: printed once
    assert "[every service](#every-service)" in rendered and "## Every service" in rendered
