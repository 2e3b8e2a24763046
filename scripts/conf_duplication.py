"""How much of conf/ says the same thing twice: the share of value lines found in more than one file.

A value line is a YAML line that sets something (`key: value` or a list item), stripped of its
indentation and trailing comment; a bare `key:` that only opens a block, `defaults:` and comments
are structure, not values, and so is a defaults list (it names groups: the composition that
replaces restating). Prints the share and the lines repeated most; `--max` makes it a check.

    python scripts/conf_duplication.py [--root conf] [--max 0.2]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import sys

_COMMENT = re.compile(r"\s+#.*$")


def value_lines(text: str) -> list[str]:
    """The lines of one YAML file that set a value, normalised for comparison."""
    found, in_defaults = [], False
    for raw in text.splitlines():
        line = _COMMENT.sub("", raw).strip()
        if not line or line.startswith("#"):
            continue
        if not raw.startswith((" ", "-")):
            in_defaults = line == "defaults:"
        if in_defaults or line.startswith("defaults:") or line.endswith(":"):
            continue
        found.append(line)
    return found


def repeated_share(root: pathlib.Path) -> tuple[float, int, collections.Counter[str]]:
    """(share of value lines whose text appears in two or more files, their count, files per text)."""
    per_file = {path: value_lines(path.read_text()) for path in sorted(root.rglob("*.yaml"))}
    files_of: collections.Counter[str] = collections.Counter()
    for lines in per_file.values():
        files_of.update(set(lines))
    total = sum(len(lines) for lines in per_file.values())
    repeated = sum(1 for lines in per_file.values() for line in lines if files_of[line] > 1)
    return (repeated / total if total else 0.0), total, files_of


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parents[1] / "conf"))
    parser.add_argument("--max", type=float, default=None, help="exit 1 when the share is above it")
    args = parser.parse_args(argv)
    share, total, files_of = repeated_share(pathlib.Path(args.root))
    print(f"conf/ value lines repeated across files: {share:.1%} of {total}")
    for line, count in files_of.most_common(10):
        if count > 1:
            print(f"  {count:3d} files  {line}")
    return 1 if args.max is not None and share > args.max else 0


if __name__ == "__main__":
    sys.exit(main())
