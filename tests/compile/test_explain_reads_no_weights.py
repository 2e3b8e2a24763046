"""`explain` needs config, tokenizer and data only: it imports no torch and reads no weight file.

Every shipped document is explained as shipped, the IOI experiments as rendered for both real
checkpoints, and a handful of documents retargeted to every built-in and to local directories,
all in one fresh interpreter with an audit hook on ``open``. safetensors opens its files from
Rust, out of the hook's sight, so the local directories' weights are also made unusable while
keeping their size and modification time (a copy's record still matches): a read there would
fail to parse, and ``safetensors.torch`` would have imported torch.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCUMENTS = Path(__file__).resolve().parents[2] / "documents"
PROBE = r"""
import contextlib, io, json, sys, time
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].endswith(
            (".safetensors", ".gguf", ".bin", ".pt")):
        opened.append(args[0])
sys.addaudithook(hook)
from causalab.cli.main import main
asked = json.loads(sys.stdin.read())
codes = {}
for document in asked["documents"]:
    started, said = time.perf_counter(), io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
        code = main(["explain", document, "--data-root", asked["data_root"]])
    codes[document] = [code, time.perf_counter() - started, said.getvalue()]
print(json.dumps({"codes": codes, "opened": opened,
                  "imported": sorted(m for m in ("torch", "transformers", "safetensors.torch",
                                                 "nnterp", "nnsight") if m in sys.modules)}))
"""
RETARGETED = ("known/behavior.json", "known/layer_sweep.json", "known/logit_lens.json",
              "v2/patching.json", "v2/logit_lens.json", "v2/head_patching.json")
IOI = ("ioi_behavior", "ioi_layer_sweep", "ioi_unrelated_sweep", "ioi_head_patching",
       "ioi_logit_lens", "ioi_das", "ioi_attention")


def _unusable_weights(folder: Path) -> None:
    """Overwrite each weight file with zeros of its size and put its modification time back."""
    for weights in folder.glob("*.safetensors"):
        info = weights.stat()
        weights.write_bytes(bytes(info.st_size))
        os.utime(weights, ns=(info.st_atime_ns, info.st_mtime_ns))


def _local_directories(root: Path) -> dict[str, tuple[str, str | None]]:
    """{name: (directory, revision to pin)}: a copy with its record, one without, one pinned."""
    from causalab.models import BUILTINS, resolve

    source, revision = resolve("causalab:tiny-llama").path, BUILTINS["tiny-llama"]["revision"]
    made = {}
    for name, pin, keep_record in (("recorded", revision, True), ("unrecorded", None, False),
                                   ("pinned", revision, False)):
        folder = root / name
        shutil.copytree(source, folder)
        if not keep_record:
            (folder / "causalab-revision.json").unlink()
        _unusable_weights(folder)
        made[name] = (str(folder), pin)
    return made


def _retarget(document: dict, key: str, revision: str | None) -> dict:
    return {**document,
            "model": {**document["model"], "key": key, "revision": revision or "main"}}


@pytest.fixture(scope="module")
def explained(tmp_path_factory, smollm2_dir, gemma3_dir):
    from causalab.models import BUILTINS, SCHEME
    from causalab.hydra.rendering import render

    root = tmp_path_factory.mktemp("explain")
    documents = [str(p) for p in sorted(DOCUMENTS.glob("*/*.json"))
                 if p.parent.name not in ("data", "artifacts")]
    for model in ("gemma3", "smollm2"):
        for name in IOI:
            path = root / f"{name}-{model}.json"
            path.write_text(json.dumps(render([f"experiment={name}", f"model={model}"])))
            documents.append(str(path))
    targets = {name: (SCHEME + name, None) for name in BUILTINS}
    targets.update(_local_directories(root / "local"))
    for name, (key, revision) in targets.items():
        for shipped in RETARGETED:
            document = json.loads((DOCUMENTS / shipped).read_text())
            path = root / f"{shipped.replace('/', '-')[:-5]}-on-{name}.json"
            path.write_text(json.dumps(_retarget(document, key, revision)))
            documents.append(str(path))
    # A user's folder holding the shipped documents: bundle paths are relative to it.
    (root / "user").mkdir()
    (root / "user" / "documents").symlink_to(DOCUMENTS)
    asked = {"documents": documents, "data_root": str(DOCUMENTS / "data")}
    done = subprocess.run([sys.executable, "-c", PROBE], input=json.dumps(asked),
                          cwd=root / "user", capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]), targets


def _model_folders(targets: dict) -> list[Path]:
    from causalab.models import models_home
    from causalab.models.resolve import WEIGHTS

    return [models_home(), WEIGHTS, *(Path(key) for key, _ in targets.values())]


def test_explain_imports_no_torch_and_opens_no_weight_file_on_any_model(explained):
    found, targets = explained
    assert found["imported"] == [], found["imported"]
    folders = [str(folder.resolve()) for folder in _model_folders(targets)]
    weights = [path for path in found["opened"]
               if any(str(Path(path).resolve()).startswith(folder) for folder in folders)]
    assert weights == []


def test_every_shipped_document_and_ioi_rendering_explains_except_those_on_the_hub(explained):
    found, _ = explained
    for document, (code, _, said) in found["codes"].items():
        name = Path(document).name
        if "-on-" in name:
            continue
        if name.startswith("weekdays_"):  # Llama-3.2-1B: the hub is not here
            assert code == 1 and said.count("\n") == 1 and "model.key" in said, name
        else:
            assert code == 0, (name, said)


@pytest.mark.parametrize("name", ["recorded", "unrecorded", "pinned"])
def test_a_local_directory_explains_with_its_weights_unusable(name, explained):
    found, _ = explained
    for shipped in ("v2-patching", "v2-logit_lens", "v2-head_patching"):
        code, _, said = next(v for k, v in found["codes"].items()
                             if Path(k).name == f"{shipped}-on-{name}.json")
        assert code == 0, (shipped, said)


def test_the_documents_retargeted_to_each_built_in_explain_where_their_places_exist(explained):
    from causalab.models import BUILTINS

    found, _ = explained
    for name in BUILTINS:
        code, _, said = next(v for k, v in found["codes"].items()
                             if Path(k).name == f"v2-patching-on-{name}.json")
        assert code == 0, (name, said)
