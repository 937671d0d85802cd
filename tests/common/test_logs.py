"""A client-supplied string in a log message cannot forge a log line (CWE-117)."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from services.common.logs import SafeFormatter, escape

FORGED = "u1\n2026-11-24 00:00:00,000 ERROR ranker[x] services: forged\r\x1b[2J\u2028"


@given(st.text())
def test_escaped_text_has_no_line_break_and_no_control_character(text):
    escaped = escape(text)
    assert len(escaped.splitlines()) <= 1
    assert all(ch.isprintable() for ch in escaped)


@given(st.text(st.characters(categories=("L", "N", "P", "S"), include_characters=" ")))
def test_printable_text_is_left_alone(text):
    assert escape(text) == text


def formatted(message: str, *args, exc: BaseException | None = None) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(SafeFormatter("%(levelname)s svc: %(message)s"))
    logger = logging.Logger("test")
    logger.addHandler(handler)
    if exc is None:
        logger.warning(message, *args)
    else:
        try:
            raise exc
        except type(exc):
            logger.exception(message, *args)
    return stream.getvalue()


def test_a_user_id_with_a_newline_stays_on_its_records_line():
    out = formatted("PreInfer for user %s failed", FORGED)
    assert out == "WARNING svc: PreInfer for user u1\\n2026-11-24 00:00:00,000 ERROR ranker[x] services: " \
        "forged\\r\\x1b[2J\\u2028 failed\n"  # fmt: skip


def test_a_traceback_is_indented_so_that_no_line_of_it_looks_like_a_record():
    out = formatted("production of %s failed", FORGED, exc=KeyError(FORGED))
    lines = out.splitlines()
    assert lines[0].startswith("WARNING svc: production of u1\\n") or lines[0].startswith("ERROR svc: ")
    assert len(lines) > 2 and all(line.startswith("    ") for line in lines[1:])
    assert "forged" in lines[-1] and "\\n" in lines[-1]


def test_every_service_logs_through_the_safe_formatter():
    """`setup_logging`, which every service's entry point calls, in a process of its own."""
    code = (
        "import logging, sys\n"
        "from services.common.logs import setup_logging\n"
        "setup_logging('INFO', 'ranker[r0]')\n"
        "logging.getLogger('services.trigger').warning('PreInfer for user %s failed', sys.argv[1])\n"
    )
    done = subprocess.run([sys.executable, "-c", code, FORGED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert " WARNING ranker[r0] services.trigger: PreInfer for user u1\\n2026-11-24" in lines[0]
