"""What the benchmarks' command lines share: the ``--smoke`` option, which
tests/test_bench_smoke.py runs every benchmark with."""

from __future__ import annotations

import argparse

SMOKE_HELP = "a smoke run: tiny sizes, seconds; checks the script runs (its numbers mean nothing)"


def parse_with_smoke(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments ``parser`` reads, with ``--smoke`` added as its last option (the
    script shrinks its sizes when ``args.smoke`` is set)."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    return parser.parse_args()
