"""sentencepiece-encode CLS-Books and binarize it with ``fairseq-preprocess``, as the lab does.

The lab runs, from the ``cls.books`` folder::

    fairseq-preprocess --only-source --trainpref train.spm.review --validpref valid.spm.review \
        --testpref test.spm.review --destdir cls-books-bin/input0 --srcdict dict.txt --workers N
    fairseq-preprocess --only-source --trainpref train.label --validpref valid.label \
        --testpref test.label --destdir cls-books-bin/label --workers N

Here the same two commands run on the encoded splits; the result is skipped when the inputs'
sha256s and the parameters are unchanged (idempotent), and written atomically.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from finetune_lab.argtypes import bounded_workers, folder, resolved_folder
from finetune_lab import _files
from finetune_lab.data.child import PRE_EXEC
from finetune_lab.data.tools import tool_versions
from finetune_lab.data import cls_books, tokenizer
from finetune_lab.data.cls_books import SPLITS, check_same_length, count_lines
from finetune_lab.data.split_checks import read_checked_splits
from finetune_lab.config import paths
from finetune_lab.errors import UserError

OUTPUT_NAME = "cls-books-bin"
COMMAND = "binarize-cls"


def _preprocess_executable() -> list[str]:
    """``fairseq-preprocess`` of the running interpreter's environment (venv first, then PATH)."""
    beside = Path(sys.executable).parent / "fairseq-preprocess"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("fairseq-preprocess")
    if found:
        return [found]
    return [sys.executable, "-m", "fairseq_cli.preprocess"]


def preprocess_command(
    trainpref: str,
    destdir: str,
    validpref: str | None = None,
    testpref: str | None = None,
    srcdict: Path | str | None = None,
    workers: int = 2,
) -> list[str]:
    """The ``fairseq-preprocess --only-source`` arguments (without the executable)."""
    args = ["--only-source", "--trainpref", trainpref]
    if validpref:
        args += ["--validpref", validpref]
    if testpref:
        args += ["--testpref", testpref]
    args += ["--destdir", destdir]
    if srcdict is not None:
        args += ["--srcdict", str(srcdict)]
    return args + ["--workers", str(workers)]


def display_command(args: list[str], srcdict: str = "dict.txt") -> str:
    """The command as the chapter prints it (the tokenizer's dict shown by a stable name)."""
    shown = list(args)
    if "--srcdict" in shown:
        shown[shown.index("--srcdict") + 1] = srcdict
    return " ".join(["fairseq-preprocess", *shown])


def run_preprocess(args: list[str], cwd: Path) -> float:
    """Run fairseq-preprocess in ``cwd``; a failure raises with its log tail. Returns seconds."""
    started = time.perf_counter()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [*_preprocess_executable(), *args], cwd=cwd, capture_output=True, text=True, env=env,
        preexec_fn=PRE_EXEC,
    )
    if result.returncode != 0:  # its last line says why (trial 19's X-y3: a 20-line traceback)
        said = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
        raise UserError(f"fairseq-preprocess failed (exit {result.returncode}): {said[-1]}; "
                        "if it names the tokenizer's dict.txt, rebuild the tokenizer "
                        "(`finetune-lab adopt-tokenizer --force`)")
    return time.perf_counter() - started


def up_to_date(out: Path, inputs: dict[str, str], parameters: dict) -> bool:
    """True when ``out`` was built from these exact inputs and parameters and is unmodified."""
    manifest_path = Path(out) / "manifest.json"
    if not manifest_path.is_file():
        return False
    try:
        manifest = _files.read_json(manifest_path)
    except ValueError:
        return False
    if manifest.get("inputs") != inputs or manifest.get("parameters") != parameters:
        return False
    recorded = manifest.get("outputs", {})
    exclude = ("manifest.json", "preprocess.log")
    return bool(recorded) and recorded == _files.sha256_tree(Path(out), exclude=exclude)


def default_output() -> Path:
    return paths().work / OUTPUT_NAME


def binarize_cls(
    cls_dir: Path | None = None,
    tokenizer_dir: Path | None = None,
    out: Path | None = None,
    workers: int = 2,
    force: bool = False,
) -> tuple[Path, bool]:
    """Encode ``cls.books`` with the tokenizer and binarize ``input0``/``label``; skip if up to date.

    Output: ``spm/{split}.spm.review`` (the encoded text), ``input0/`` and ``label/`` (fairseq's
    ``sentence_prediction`` data layout) and ``manifest.json``. Returns ``(out, ran)``.
    An existing ``out`` is replaced only if ``binarize-cls`` made it, unless ``force``.
    """
    cls_dir = Path(cls_dir) if cls_dir is not None else cls_books.default_output()
    tok_dir = Path(tokenizer_dir) if tokenizer_dir is not None else tokenizer.default_output()
    out = Path(out) if out is not None else default_output()
    if not cls_dir.is_dir():
        raise UserError(f"{cls_dir} {_files.not_there(cls_dir, 'folder')}: run `finetune-lab "
                        "prepare-cls` first, or pass the folder it wrote")
    model_path, dict_path = tokenizer.require_tokenizer(tok_dir)
    tokenizer.check_dictionary(model_path, dict_path)
    for split in SPLITS:  # cheap structural check before hashing or encoding anything
        check_same_length(cls_dir / f"{split}.review", count_lines(cls_dir / f"{split}.review"),
                          cls_dir / f"{split}.label", count_lines(cls_dir / f"{split}.label"))
    inputs = {f"cls.books/{split}.{kind}": _files.sha256_file(cls_dir / f"{split}.{kind}")
              for split in SPLITS for kind in ("review", "label")}
    inputs["tokenizer/spm.model"] = _files.sha256_file(model_path)
    inputs["tokenizer/dict.txt"] = _files.sha256_file(dict_path)
    parameters = {"format": "fairseq sentence_prediction (input0, label)"}
    if not force and up_to_date(out, inputs, parameters):
        return out, False

    started = time.perf_counter()
    splits = read_checked_splits(cls_dir, {  # the sha256s just computed
        name.split("/", 1)[1]: digest for name, digest in inputs.items()
        if name.startswith("cls.books/")})
    sp = tokenizer.load_processor(tok_dir)
    with _files.atomic_dir(out, COMMAND, force=force) as tmp:
        (tmp / "spm").mkdir()
        counts: dict[str, dict[str, int]] = {}
        for split, (reviews, labels) in splits.items():
            encoded = tokenizer.encode_pieces(sp, reviews)
            with open(tmp / "spm" / f"{split}.spm.review", "w", encoding="utf-8", newline="\n") as fh:
                fh.writelines(" ".join(pieces) + "\n" for pieces in encoded)
            (tmp / "spm" / f"{split}.label").write_text("".join(f"{y}\n" for y in labels))
            counts[split] = {
                "reviews": len(reviews),
                "words": sum(len(r.split()) for r in reviews),
                "tokens": sum(len(p) for p in encoded),
                "unk": sum(p.count("<unk>") for p in encoded),
            }
        encode_s = time.perf_counter() - started
        commands = [
            preprocess_command("spm/train.spm.review", "input0", "spm/valid.spm.review",
                               "spm/test.spm.review", srcdict=dict_path, workers=workers),
            preprocess_command("spm/train.label", "label", "spm/valid.label", "spm/test.label",
                               workers=workers),
        ]
        preprocess_s = [run_preprocess(cmd, cwd=tmp) for cmd in commands]
        manifest = {
            "step": COMMAND,
            "inputs": inputs,
            "outputs": _files.sha256_tree(tmp, exclude=("manifest.json", "preprocess.log")),
            "parameters": parameters,
            "workers": workers,
            "counts": counts,
            "commands": [display_command(c, srcdict="<tokenizer>/dict.txt") for c in commands],
            "tool_versions": tool_versions(),
            "timings_s": {
                "encode": round(encode_s, 3),
                "fairseq_preprocess": [round(s, 3) for s in preprocess_s],
                "total": round(time.perf_counter() - started, 3),
            },
        }
        _files.write_json_atomic(tmp / "manifest.json", manifest)
    return out, True


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "binarize-cls",
        help="sentencepiece-encode cls.books and run fairseq-preprocess (input0 + label)",
        description=binarize_cls.__doc__,
    )
    parser.add_argument("--cls", type=folder, default=None, dest="cls_dir",
                        help="cls.books folder (default: <work dir>/cls.books)")
    parser.add_argument("--tokenizer", type=resolved_folder, default=None,
                        help="folder with spm.model and dict.txt (default: <work dir>/tokenizer)")
    parser.add_argument("--out", type=resolved_folder, default=None,
                        help=f"output folder (default: <work dir>/{OUTPUT_NAME})")
    parser.add_argument("--workers", type=bounded_workers, default=2)
    parser.add_argument("--force", action="store_true",
                        help="rebuild even if up to date, replacing --out even if "
                             "binarize-cls did not make it")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    out, ran = binarize_cls(args.cls_dir, args.tokenizer, args.out, args.workers, args.force)
    print(f"binarize-cls: {'wrote' if ran else 'up to date, skipped:'} {out}")
    return 0
