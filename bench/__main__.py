"""`python -m bench <command> [flags]`: the one front door to RelayGR's benchmarks (`bench.commands`).

`python -m bench --help` lists the commands, `python -m bench <command> --help` a command's flags. Flags
without a command (`python -m bench --profile quick`) run `run`, the benchmark itself.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bench.commands import BY_NAME, usage

HELP = ("-h", "--help")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0].startswith("-") and args[0] not in HELP:
        args = ["run", *args]
    if not args or args[0] in HELP:
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    name, *rest = args
    command = BY_NAME.get(name)
    if command is None:
        print(f"python -m bench: no command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return command.main(rest)


if __name__ == "__main__":
    sys.exit(main())
