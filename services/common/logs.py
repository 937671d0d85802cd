"""Service logging: one line per record, whatever a client put in the strings it logs.

User ids, request ids and error details come from clients. A newline in one would start a line of its
own, forged to look like any log record (CWE-117). `SafeFormatter` escapes every non-printable
character of a record's message (`\\n` → `\\\\n`, ANSI ESC → `\\\\x1b`), and indents every line of an
attached traceback, so only the formatter itself starts a line with a timestamp.
"""

from __future__ import annotations

import logging


def escape(text: str) -> str:
    """`text` with every character Python does not call printable (controls, format characters, line and
    paragraph separators, spaces other than ' ') written as its escape."""
    if text.isprintable():  # the common case: nothing to do
        return text
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape", "backslashreplace").decode("ascii")
        for ch in text
    )


class SafeFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("    " + escape(line) for line in text.splitlines())


def setup_logging(level: str, service: str) -> None:
    """Logs to stderr at `level`, each line naming `service`, through `SafeFormatter`."""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO))
    formatter = SafeFormatter(f"%(asctime)s %(levelname)s {escape(service)} %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
