"""`python -m tritonactor.settings --markdown` prints the settings table of
docs/configuration.md; `--update PATH` writes it into that document, between its markers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tritonactor.settings.docs import markdown_table, replace_table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tritonactor.settings", allow_abbrev=False)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--markdown", action="store_true", help="print the settings table")
    action.add_argument(
        "--update", type=Path, metavar="PATH", help="write the table into this document"
    )
    args = parser.parse_args(argv)
    if args.update is not None:
        document = args.update.read_text(encoding="utf-8")
        args.update.write_text(replace_table(document), encoding="utf-8")
    else:
        sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
