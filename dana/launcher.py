"""The ``dana`` command's entry point: ``dana --version`` answers without importing
torch; anything else runs :func:`dana.cli.main`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        from dana.version import __version__

        print(f"dana {__version__}")
        return 0
    from dana.cli import main as cli_main

    return cli_main(argv)
