"""``stateful-sampler``: the command line. Each subcommand lives in its own module, imported only
when it runs, so ``audit`` never pays for importing Lightning."""

from __future__ import annotations

import argparse
import importlib
import sys

from stateful_sampler import __version__

PROG = "stateful-sampler"
COMMANDS = {
    "audit": (
        "stateful_sampler.audit.cli",
        "report what each epoch really feeds the model: coverage, padding, cut records, steps per rank",
    ),
    "verify": (
        "stateful_sampler.verify.cli",
        "prove that a killed and resumed run trains on exactly the batches of an uninterrupted one",
    ),
    "certificate": (
        "stateful_sampler.certificate.cli",
        "compare the certificates of the data two runs trained on (STATEFUL_SAMPLER_CERTIFICATE=path)",
    ),
}
_DESCRIPTION = """\
Checkpointable, exactly reproducible data order for PyTorch training: check what a run's epochs
feed the model before you train (audit), and prove on your own setup that a run killed with
SIGKILL and resumed equals the run that was never interrupted (verify)."""
_EPILOG = f"""\
Run '{PROG} COMMAND --help' for a command's options. The same as 'python -m stateful_sampler'.
Documentation: https://github.com/stateful-sampler/stateful-sampler#readme"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog=PROG, description=_DESCRIPTION, epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    if not argv or argv[0] not in COMMANDS:
        parser.parse_args(argv)  # --help, --version, or the usage and an error: exits
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
