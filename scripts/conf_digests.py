"""Pin what conf/ renders to: one SHA-256 per composed document, for a refactor of conf/ to keep.

Every experiment on every model, and experiment=compare with every method on three models, is
rendered (causalab.hydra.rendering.render) and hashed as canonical JSON, header included. The
table is tests/platform/conf_renderings.json; tests/platform/test_render.py renders the same
overrides and asserts the same hashes. A change to conf/ that means to change a document rewrites
the table on purpose:

    .venv/bin/python scripts/conf_digests.py --write
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
TABLE = REPO / "tests" / "platform" / "conf_renderings.json"
COMPARE_MODELS = ("llama", "tiny_llama", "smollm2")


def rendered_digest(document: dict) -> str:
    """SHA-256 of the document as compact JSON with sorted keys, its header kept."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cases(conf: pathlib.Path) -> list[list[str]]:
    """The override lists the table pins."""
    experiments = sorted(path.stem for path in (conf / "experiment").glob("*.yaml"))
    models = sorted(path.stem for path in (conf / "model").glob("*.yaml"))
    methods = sorted(path.stem for path in (conf / "method").glob("*.yaml"))
    pinned = [[f"experiment={e}", f"model={m}"] for e in experiments for m in models]
    pinned += [["experiment=compare", f"method={x}", f"model={m}"]
               for x in methods for m in COMPARE_MODELS]
    return pinned


def table() -> dict[str, str]:
    """Each case's overrides, space-joined, to its rendered digest."""
    from causalab.hydra.rendering import CONF, render

    return {" ".join(case): rendered_digest(render(case)) for case in cases(CONF)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {TABLE.relative_to(REPO)}")
    args = parser.parse_args(argv)
    found = table()
    if args.write:
        TABLE.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(found)} renderings to {TABLE.relative_to(REPO)}")
        return 0
    pinned = json.loads(TABLE.read_text())
    changed = sorted(key for key in found.keys() | pinned.keys() if found.get(key) != pinned.get(key))
    for key in changed:
        print(f"changed: {key}")
    print(f"{len(found) - len(changed)} of {len(found)} renderings as pinned")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
