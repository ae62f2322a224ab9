"""``stateful-sampler certificate compare A B``: whether two runs trained on the same data.

Exit codes are verify's: 0 equal (step by step, or the same multiset per epoch where a resize changed
the steps: the report says which), 1 different (the first differing step and its records), 2 could not
compare (a file unreadable or cut short, another dataset or order).
"""

from __future__ import annotations

import argparse
import sys

from stateful_sampler.certificate.compare import CANNOT_COMPARE, compare
from stateful_sampler.certificate.run import read_run
from stateful_sampler.errors import CertificateError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stateful-sampler certificate",
        description="Compare the certificates of the data two runs trained on (STATEFUL_SAMPLER_CERTIFICATE=path).",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    compared = actions.add_parser("compare", help="say whether two runs trained on the same data; exit 0, 1 or 2")
    compared.add_argument("first", help="a certificate path, as given to STATEFUL_SAMPLER_CERTIFICATE")
    compared.add_argument("second", help="the other run's certificate path")
    args = parser.parse_args(argv)
    try:
        runs = [read_run(path) for path in (args.first, args.second)]
    except CertificateError as error:
        print(f"COULD NOT COMPARE: {error}")
        return CANNOT_COMPARE
    comparison = compare(*runs)
    print(comparison.report())
    return comparison.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
