"""``stateful-sampler``: the command line. Each subcommand lives in its own module, imported only
when it runs, so ``audit`` never pays for importing Lightning."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "audit": ("stateful_sampler.audit.cli", "report what each epoch really feeds the model"),
    "verify": ("stateful_sampler.verify.cli", "prove that a killed and resumed run equals an uninterrupted one"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="stateful-sampler", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    if not argv or argv[0] not in COMMANDS:
        parser.parse_args(argv)  # prints usage and exits
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
