"""Pin every corpus document's built-in model to the revision the built-in resolves to now.

A built-in's revision is the digest of its tensors; when a built-in is rebuilt differently its
documents must pin the new digest, and the bundles made from them (``make_artifacts.py pca
rot``) must be made again, since their stamps carry the revision. Documents that name a hub
model are left alone.

    .venv/bin/python scripts/pin_corpus.py            # rewrite stale revisions
    .venv/bin/python scripts/pin_corpus.py --check    # exit 1 if any is stale
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "documents" / "v2"


def stale(check_only: bool) -> list[Path]:
    """The documents whose built-in revision differs from the current one (rewritten unless
    ``check_only``)."""
    from causalab.models import SCHEME, resolve

    found = []
    for path in sorted(CORPUS.glob("*.json")):
        document = json.loads(path.read_text())
        model = document["model"]
        if not model["key"].startswith(SCHEME):
            continue
        revision = resolve(model["key"]).revision
        if model["revision"] == revision:
            continue
        found.append(path)
        if not check_only:
            model["revision"] = revision
            path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report only; exit 1 if stale")
    args = parser.parse_args()
    # A checkout without `make setup` has no installed package: run against this tree.
    sys.path.insert(0, str(REPO))
    found = stale(args.check)
    for path in found:
        print(path.relative_to(REPO))
    if args.check and found:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
