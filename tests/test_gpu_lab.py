"""The one-call GPU path, end to end on this CPU with a tiny budget.

Three folders stand for the two machines: ``home`` (a copy of the project with real data
prepared: the checkpoint's tokenizer, CLS-Books, a two-novel corpus) makes the bundle and later
takes the runs back; ``remote`` holds only what a device call sends (the files git does not
ignore, plus the carried ``.gpu/``), with no data root, and runs ``scripts/gpu-lab.sh``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import needs_data_root

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from finetune_lab.runs import gpu_archive, gpu_bundle, gpu_plan



DEVICE_LACKS = ("jsonschema", "tbparse", "nbclient", "nbformat")
"""Packages of this environment that the device's image does not have: the rehearsal call
cannot import them either."""


def _copy_project(dst: Path) -> None:
    """The source tree as a clean clone has it (no run cache), plus the packaged checkpoint."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=PROJECT_ROOT, capture_output=True, check=True).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        if rel.startswith("data/runs/") or not (PROJECT_ROOT / rel).is_file():
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PROJECT_ROOT / rel, dst / rel)
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)


def _cli_env(root: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    from finetune_lab.config import DATA_ROOT_ENV, default_data_root

    env = {**os.environ, DATA_ROOT_ENV: str(default_data_root()), **(env or {}),
           "PYTHONPATH": str(root / "src")}  # the data root beside this checkout, not the copy
    for name in ("FINETUNE_LAB_WORK_DIR", "FINETUNE_LAB_RUNS_DIR"):
        env.pop(name, None)
    return env


def _cli(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "finetune_lab.cli", *args], cwd=root,
                          env=_cli_env(root, env), capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def smoke_call(tmp_path_factory):
    from data_fixtures import cls_dir

    from finetune_lab import reproduce
    from finetune_lab.data import pretrain_corpus
    from finetune_lab.models import checkpoints

    base = tmp_path_factory.mktemp("gpu-lab")
    home, remote, out = base / "home", base / "remote", base / "out"
    _copy_project(home)
    work = home / "data" / "work"
    reproduce.adopt_checkpoint_tokenizer(home / "data" / "checkpoints" / checkpoints.CHECKPOINT_NAME,
                                         work / "tokenizer")
    # The tiny call carries a few reviews; home holds the same few, so the hashes can agree.
    gpu_bundle.tiny_cls(cls_dir(), work / "cls.books")  # the split, as this process built it
    pretrain_corpus.prepare_pretrain(tokenizer_dir=work / "tokenizer", out=work / "pretrain-bin",
                                     with_reviews=False, max_novels=2, workers=1)
    # this machine has fairseq and the wheels' packages: the rehearsal downloads nothing (the
    # wheels and fairseq's sdist are cut down by functions tested on their own below)
    # the pretrained init only: a random init's job is the same command with another --init
    # (the plan's jobs are tested below, and both inits run in tests/test_finetune_fairseq.py and
    # tests/test_hf_finetune.py); two jobs fewer kept this fixture's minutes down (issue 36)
    made = _cli(home, "gpu-bundle", "--tiny", "--steps", "pretrain", "lab", "--then-finetune",
                "--inits", "pretrained", "--from-environment")
    assert made.returncode == 0, made.stderr
    assert not (home / gpu_plan.BUNDLE_DIR / "wheels").exists()
    _copy_project(remote)  # what a device call sends: the tree git does not ignore ...
    shutil.copytree(home / gpu_plan.BUNDLE_DIR, remote / gpu_plan.BUNDLE_DIR)  # ... and the carry
    # A CPU shared with other tests is far slower than the device: the rehearsal's deadline is
    # raised so that every job finishes (the tiny jobs are counted in updates, not minutes; the
    # deadline itself is tested in tests/test_jobs.py and below).
    plan_file = remote / gpu_plan.BUNDLE_DIR / gpu_plan.PLAN_FILE
    plan = json.loads(plan_file.read_text())
    plan_file.write_text(json.dumps({**plan, "runs_until_s": plan["runs_until_s"] + 3600}))
    # ... with the committed runs: one where the call's own runs go (a snapshot must not carry
    # it back), and a pretraining run whose manifest lists checkpoints (loading the packaged
    # checkpoint must not judge it: the registry needs packages the device lacks)
    committed = PROJECT_ROOT / "data" / "runs"
    shutil.copytree(committed / "fairseq" / "random-seed0",
                    remote / "data" / "runs" / "fairseq-gpu-smoke" / "random-seed7")
    listing = next(m.parent for m in sorted(committed.glob("pretrain/*/manifest.json"))
                   if "saved_checkpoints" in m.read_text(encoding="utf-8"))
    shutil.copytree(listing, remote / "data" / "runs" / "pretrain" / listing.name)
    blocked = base / "not-on-the-device"  # what the device's image lacks (KINDS.md)
    blocked.mkdir()
    for name in DEVICE_LACKS:
        (blocked / f"{name}.py").write_text(
            f"raise ModuleNotFoundError('{name} is not on the device', name='{name}')\n")
    env = {**os.environ, "PYTHON": sys.executable, "GPU_LAB_PARALLEL": "2",
           "FINETUNE_LAB_DATA_ROOT": str(base / "no-data-root-there"), "OUT": str(out),
           "PYTHONPATH": str(blocked)}
    ran = subprocess.run(["bash", "scripts/gpu-lab.sh", gpu_plan.BUNDLE_DIR], cwd=remote, env=env,
                         capture_output=True, text=True, check=False)
    # home builds its own inputs, so the runs' data hashes are compared, not skipped (side by
    # side, as the call does)
    built = [subprocess.Popen([sys.executable, "-m", "finetune_lab.cli", step], cwd=home,
                              env=_cli_env(home), stdout=subprocess.DEVNULL)
             for step in ("binarize-cls", "convert-hf")]
    assert [p.wait() for p in built] == [0, 0]
    return {"home": home, "remote": remote, "out": out, "ran": ran}


@pytest.mark.slow
@needs_data_root
def test_the_call_runs_every_job_and_returns_pieces_within_the_limits(smoke_call):
    ran = smoke_call["ran"]
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    result = json.loads((smoke_call["out"] / gpu_archive.RESULT_FILE).read_text())
    jobs = {j["job"]: j["exit_code"] for j in result["jobs"]}
    assert jobs == {name: 0 for name in (
        "binarize-cls", "convert-hf", "pretrain", "fairseq-pretrained-seed0",
        "transformers-pretrained-seed0", "lora-lora-qv-seed0", "lora-qlora-qv-seed0")}
    # a snapshot after each finished run, then the last one: only the last one's pieces remain
    assert result["snapshot"] == 1 + 4 + 1  # after pretraining, after each of 4 runs, at the end
    pieces = {p["file"] for p in result["pieces"]}
    assert {p.name for p in smoke_call["out"].glob(gpu_archive.ARCHIVE + ".*")} == pieces
    files = sorted(p.name for p in smoke_call["out"].iterdir())
    assert len(files) <= gpu_archive.MAX_FILES_BACK
    assert all((smoke_call["out"] / f).stat().st_size <= gpu_archive.PIECE_BYTES for f in files)
    assert result["device"]["type"] == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.slow
@needs_data_root
def test_unpacked_runs_are_valid_here_with_their_data_checked(smoke_call):
    home = smoke_call["home"]
    done = _cli(home, "gpu-unpack", str(smoke_call["out"]))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    runs = home / "data" / "runs"
    # --then-finetune: the fairseq pretrained seed starts from the weights the call just made
    expected = ["fairseq-candidate-gpu-smoke/pretrained-seed0",
                "transformers-gpu-smoke/pretrained-seed0",
                "lora-gpu-smoke/lora-qv-seed0", "lora-gpu-smoke/qlora-qv-seed0",
                "pretrain-gpu-smoke/gpu-smoke"]
    for rel in expected:
        assert f"data/runs/{rel}: valid" in done.stdout, done.stdout
    assert "random-seed7" not in done.stdout  # a run the call found there is not sent back
    assert "data/work/candidates/gpu-smoke: model.pt matches its manifest" in done.stdout
    man = json.loads((runs / "fairseq-candidate-gpu-smoke" / "pretrained-seed0" /
                      "manifest.json").read_text())
    assert man["inputs"]["checkpoint"]["path"] == "data/work/candidates/gpu-smoke/model.pt"
    # checked against home's own binarization (relative path), not skipped as absent
    assert man["inputs"]["data"][0]["path"] == "data/work/cls-books-bin"
    assert "not on this machine" not in done.stdout
    cand = home / "data" / "work" / "candidates" / "gpu-smoke"
    meta = json.loads((cand / "manifest.json").read_text())
    assert meta["dtype"] == "float16"
    from finetune_lab._files import sha256_file
    assert sha256_file(cand / "model.pt") == meta["files"]["model.pt"]["sha256"]
    # the call's own record is kept beside the summaries, as the call wrote it
    result = json.loads((smoke_call["out"] / gpu_archive.RESULT_FILE).read_text())
    (logs,) = [p for p in result["products"] if p.startswith(gpu_archive.LOGS_ROOT)]
    record = home / gpu_archive.CALL_RECORDS / f"{Path(logs).name}.json"
    assert json.loads(record.read_text()) == result
    # a second unpack replaces nothing
    again = _cli(home, "gpu-unpack", str(smoke_call["out"]))
    assert again.returncode == 0 and "exists; left as it is" in again.stdout
    assert again.stdout.endswith("gpu-unpack: nothing new was placed in the project\n")
    assert ": valid" not in again.stdout


@pytest.mark.slow
@needs_data_root
def test_a_damaged_piece_is_refused_by_name(smoke_call, tmp_path):
    copy = tmp_path / "files"
    shutil.copytree(smoke_call["out"], copy)
    first = json.loads((copy / gpu_archive.RESULT_FILE).read_text())["pieces"][0]["file"]
    piece = copy / first
    data = bytearray(piece.read_bytes())
    data[100] ^= 1
    piece.write_bytes(bytes(data))
    with pytest.raises(UserError, match=rf"{first} does not match its sha256"):
        gpu_archive.unpack(copy, root=tmp_path)


def test_pieces_reassemble_and_a_missing_one_is_named(tmp_path):
    root = tmp_path / "root"
    run = root / "data" / "runs" / "x-gpu" / "r-seed0"
    run.mkdir(parents=True)
    payload = os.urandom(300_000)  # incompressible, so it spans several pieces
    (run / "blob").write_bytes(payload)
    (root / "data" / "runs" / "x-gpu" / ".r-seed0.lock").write_text("")
    meta = gpu_archive.pack([root / "data" / "runs" / "x-gpu"], tmp_path / "out", root=root,
                        piece_bytes=100_000, extra={"products": ["data/runs/x-gpu"]})
    assert len(meta["pieces"]) == 4
    home = tmp_path / "home"
    placed = gpu_archive.unpack(tmp_path / "out", root=home)
    assert placed == [home / "data" / "runs" / "x-gpu" / "r-seed0"]  # never the lock file
    assert (placed[0] / "blob").read_bytes() == payload
    (tmp_path / "out" / f"{gpu_archive.ARCHIVE}.002").unlink()
    with pytest.raises(UserError, match=r"gpu-lab\.tar\.002 does not exist: every piece"):
        gpu_archive.unpack(tmp_path / "out", root=tmp_path / "home2")


def test_a_later_snapshot_replaces_the_earlier_whole_and_a_kill_midway_keeps_the_earlier(
        tmp_path, monkeypatch):
    root = tmp_path / "root"
    exp = root / "data" / "runs" / "x-gpu"
    (exp / "r-seed0").mkdir(parents=True)
    (exp / "r-seed0" / "a").write_text("first run")
    out, products = tmp_path / "out", {"products": ["data/runs/x-gpu"]}
    gpu_archive.pack([exp / "r-seed0"], out, root=root, extra=products, generation=1)
    (exp / "r-seed1").mkdir()
    (exp / "r-seed1" / "b").write_text("second run")
    second = gpu_archive.pack([exp / "r-seed0", exp / "r-seed1"], out, root=root,
                              extra=products, generation=2)
    # only the second snapshot's pieces are left, and they hold both runs
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [gpu_archive.RESULT_FILE] + [p["file"] for p in second["pieces"]])
    placed = gpu_archive.unpack(out, root=tmp_path / "home")
    assert sorted(p.name for p in placed) == ["r-seed0", "r-seed1"]
    # a call killed while writing the third snapshot (before gpu-lab.json is replaced): the
    # second is still whole and unpacks
    (exp / "r-seed2").mkdir()
    (exp / "r-seed2" / "c").write_text("third run")

    def killed(*_args: object) -> None:
        raise KeyboardInterrupt("the call's deadline")

    monkeypatch.setattr(gpu_archive.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        gpu_archive.pack([exp / "r-seed0", exp / "r-seed1", exp / "r-seed2"], out, root=root,
                         extra=products, generation=3)
    placed = gpu_archive.unpack(out, root=tmp_path / "home2")
    assert sorted(p.name for p in placed) == ["r-seed0", "r-seed1"]


def test_slim_bitsandbytes_keeps_one_cuda_build_and_a_consistent_record(tmp_path):
    wheel = tmp_path / "bitsandbytes-0.0-py3-none-any.whl"
    libs = ["libbitsandbytes_cpu.so", gpu_bundle.CUDA_LIB, "libbitsandbytes_cuda118.so",
            "libbitsandbytes_rocm71.so"]
    with zipfile.ZipFile(wheel, "w") as z:
        for name in [*libs, "__init__.py"]:
            z.writestr(f"bitsandbytes/{name}", b"x" * 1000)
        z.writestr("bitsandbytes-0.0.dist-info/RECORD",
                   "".join(f"bitsandbytes/{n},sha256=x,1000\n" for n in [*libs, "__init__.py"]))
    gpu_bundle.slim_bitsandbytes(wheel)
    with zipfile.ZipFile(wheel) as z:
        names = sorted(Path(n).name for n in z.namelist())
        record = z.read("bitsandbytes-0.0.dist-info/RECORD").decode()
    assert names == sorted(["RECORD", "__init__.py", "libbitsandbytes_cpu.so", gpu_bundle.CUDA_LIB])
    assert "cuda118" not in record and "rocm" not in record and gpu_bundle.CUDA_LIB in record
    with pytest.raises(UserError, match="has no libbitsandbytes_cuda999.so"):
        gpu_bundle.slim_bitsandbytes(wheel, keep="libbitsandbytes_cuda999.so")


def _dataset(prefix: Path, items: list[list[int]]) -> None:
    import numpy as np
    from fairseq.data import indexed_dataset

    builder = indexed_dataset.MMapIndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for item in items:
        builder.add_item(torch.tensor(item, dtype=torch.int64))
    builder.finalize(str(prefix) + ".idx")


def test_corpus_slice_draws_whole_chunks_keeps_order_and_appends_the_other_corpus(tmp_path,
                                                                                   monkeypatch):
    from fairseq.data import indexed_dataset

    monkeypatch.setattr(gpu_bundle, "SLICE_CHUNK", 10)
    src, tapt = tmp_path / "bin", tmp_path / "tapt"
    src.mkdir(), tapt.mkdir()
    (src / "dict.txt").write_text("a 1\n")
    _dataset(src / "train", [[i, i + 1] for i in range(1000)])  # item i holds the tokens i, i+1
    _dataset(src / "valid", [[7, 7, 7]])
    _dataset(tapt / "train", [[999, 998, 997]])
    kept = gpu_bundle.corpus_slice(src, tmp_path / "out", 600, also=tapt, seed=0)
    out = indexed_dataset.MMapIndexedDataset(str(tmp_path / "out" / "train"))
    firsts = [int(out[i][0]) for i in range(len(out) - 1)]
    assert kept == 2 * (len(out) - 1) + 3 and out[len(out) - 1].tolist() == [999, 998, 997]
    assert 150 <= len(firsts) <= 450  # a coin of 0.3 per chunk of 10, over 100 chunks
    assert firsts == sorted(firsts) and all(f % 10 == 0 for f in firsts[::10])  # whole chunks
    assert firsts[-1] > 500  # not the head of the corpus only
    assert indexed_dataset.MMapIndexedDataset(str(tmp_path / "out" / "valid"))[0].tolist() == [7] * 3
    again = gpu_bundle.corpus_slice(src, tmp_path / "again", 600, also=tapt, seed=0)
    assert again == kept  # seeded: the same slice here as on the machine's copy
    head = gpu_bundle.corpus_slice(src, tmp_path / "head", 600)
    assert head == 600  # no seed: the first items


def test_pretrain_budget_is_what_the_deadline_leaves_and_refuses_too_little():
    plan = gpu_plan.Plan(steps=["pretrain"], runs_until_s=530.0)
    assert gpu_plan.pretrain_budget(plan, started=1000.0, now=1050.0) == pytest.approx(
        (530 - 50 - gpu_plan.PRETRAIN_TAIL_S) / 60)
    with pytest.raises(UserError, match="only 30 s are left"):
        gpu_plan.pretrain_budget(plan, started=1000.0, now=1000.0 + 530 - gpu_plan.PRETRAIN_TAIL_S - 30)
    assert gpu_plan.pretrain_budget(gpu_plan.Plan(pretrain_minutes=3.0), started=0.0) == 3.0
    # pretraining then fine-tuning in one call: after a cold machine's 50 s of setup, the default
    # plan still trains (240 s kept for fine-tuning had left 10 s, and the call failed)
    both = gpu_plan.Plan(steps=["pretrain", "lab"], then_finetune=True)
    assert gpu_plan.pretrain_budget(both, started=0.0, now=50.0) >= 1.5
    with pytest.raises(UserError, match="less 150 s kept for fine-tuning.*without --then-finetune"):
        gpu_plan.pretrain_budget(both, started=0.0, now=120.0)
    # a tiny call trains a few updates whatever the clock says: a slow machine does not fail it
    tiny = gpu_plan.Plan(steps=["pretrain"], runs_until_s=530.0, tiny=True)
    assert gpu_plan.pretrain_budget(tiny, started=1000.0, now=1000.0 + 530) == 1.0
    job, = gpu_plan.pretrain_jobs(gpu_plan.Plan(pretrain_lr=7e-4, pretrain_batch_size=128),
                                  Path("logs"), minutes=6.25)
    assert job.log == Path("logs") / "pretrain.log"
    assert job.argv[job.argv.index("--minutes") + 1] == "6.25"
    assert job.argv[job.argv.index("--lr") + 1] == "0.0007"
    assert job.argv[job.argv.index("--batch-size") + 1] == "128"
    assert "--update-freq" not in job.argv


def test_lab_jobs_send_a_carried_candidate_to_its_own_experiment():
    plan = gpu_plan.Plan(lab_parts=["fairseq"], seeds=[0, 1], checkpoint="data/work/candidates/gpu",
                        candidate_experiment="fairseq-candidate-5")
    jobs = {j.name: j.argv for j in gpu_plan.lab_jobs(plan, Path("logs"))}
    assert sorted(jobs) == ["fairseq-pretrained-seed0", "fairseq-pretrained-seed1",
                            "fairseq-random-seed0", "fairseq-random-seed1"]
    pre, rnd = jobs["fairseq-pretrained-seed1"], jobs["fairseq-random-seed1"]
    assert pre[pre.index("--checkpoint") + 1] == "data/work/candidates/gpu"
    assert pre[pre.index("--experiment") + 1] == "fairseq-candidate-5"
    assert "--checkpoint" not in rnd and rnd[rnd.index("--experiment") + 1] == "fairseq-gpu"
    # a candidate's call: its pretrained seeds alone
    only = gpu_plan.Plan(lab_parts=["fairseq"], seeds=[0, 1], fairseq_inits=["pretrained"],
                         checkpoint="data/work/candidates/gpu")
    assert [j.name for j in gpu_plan.lab_jobs(only, Path("logs"))] == [
        "fairseq-pretrained-seed0", "fairseq-pretrained-seed1"]


def test_the_default_lab_is_both_grids_and_three_lora_methods_with_three_seeds():
    names = [j.name for j in gpu_plan.lab_jobs(gpu_plan.Plan(), Path("logs"))]
    assert len(names) == 6 + 6 + 9 and len(set(names)) == len(names)
    assert {n.rsplit("-seed", 1)[0] for n in names} == {
        "fairseq-pretrained", "fairseq-random", "transformers-pretrained", "transformers-random",
        "lora-lora-qv", "lora-lora-attn", "lora-qlora-qv"}


def test_the_slim_sdist_keeps_the_package_and_drops_examples_and_tests(tmp_path):
    import tarfile

    src = tmp_path / "fairseq-fixed-0.12.3.1"
    for rel in ("fairseq/data/data_utils_fast.pyx", "fairseq/examples/big.txt", "tests/t.py",
                "examples/e.py", "docs/d.rst", "setup.py"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(rel)
    sdist = tmp_path / "fairseq-fixed-0.12.3.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    out = tmp_path / "out"
    out.mkdir()
    slim = gpu_bundle.slim_sdist(sdist, out)
    with tarfile.open(slim) as tar:
        files = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert files == ["fairseq-src/fairseq/data/data_utils_fast.pyx", "fairseq-src/setup.py"]


SENTENCE_PREDICTION = """import torch
from sklearn.metrics import f1_score
from sklearn.metrics import matthews_corrcoef as _matthews_corrcoef
from scipy.stats import pearsonr, spearmanr

def acc_and_f1(preds, labels):
    f1 = f1_score(y_true=labels, y_pred=preds)

def pearson_and_spearman(preds, labels):
    pearson_corr = pearsonr(preds, labels)[0]

def matthews_corrcoef(preds, labels):
    mcc = _matthews_corrcoef(labels, preds)
"""
"""The lines of fairseq 0.12.3's sentence_prediction.py that the deferral moves, as its sdist
has them (with Windows line endings)."""


def test_fairseqs_unused_imports_move_to_their_use_and_its_line_endings_stay(tmp_path):
    from finetune_lab.runs.gpu_remote import defer_unused_imports

    module = tmp_path / "fairseq" / "criterions" / "sentence_prediction.py"
    module.parent.mkdir(parents=True)
    module.write_bytes(SENTENCE_PREDICTION.replace("\n", "\r\n").encode())
    other = tmp_path / "fairseq" / "tasks" / "audio_classification.py"
    other.parent.mkdir()
    other.write_text("from sklearn import metrics as sklearn_metrics\n")  # not fairseq's text
    assert defer_unused_imports(tmp_path) == ["fairseq/criterions/sentence_prediction.py"]
    text = module.read_bytes().decode()
    assert "\n" not in text.replace("\r\n", "")
    lines = text.split("\r\n")
    assert lines[:2] == ["import torch", ""]
    assert lines[lines.index("def acc_and_f1(preds, labels):") + 1] == \
        "    from sklearn.metrics import f1_score"
    assert lines[lines.index("def matthews_corrcoef(preds, labels):") + 1] == \
        "    from sklearn.metrics import matthews_corrcoef as _matthews_corrcoef"
    assert "    from scipy.stats import pearsonr, spearmanr" in lines
    assert other.read_text() == "from sklearn import metrics as sklearn_metrics\n"
    assert defer_unused_imports(tmp_path) == []  # done once; a second time changes nothing
    compile(text, str(module), "exec")


def test_this_environments_fairseq_starts_without_scikit_learn_or_scipy():
    """setup.sh builds fairseq with the deferral: a trainer process loads neither."""
    code = ("import sys, fairseq_cli.train, fairseq_cli.preprocess; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'scipy'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.splitlines()[-1] == "[]", "fairseq was not built by scripts/setup.sh: run it"


def test_unpack_keeps_the_call_record_with_the_gpu_use(tmp_path):
    root = tmp_path / "root"
    run = root / "data" / "runs" / "x-gpu" / "r-seed0"
    logs = root / gpu_archive.LOGS_ROOT / "20260101T000000Z"
    run.mkdir(parents=True)
    logs.mkdir(parents=True)
    (run / "a").write_text("run")
    (logs / "nvidia-smi.csv").write_text("timestamp, utilization.gpu [%]\n")
    products = ["data/runs/x-gpu", f"{gpu_archive.LOGS_ROOT}/20260101T000000Z"]
    gpu_archive.pack([run, logs], tmp_path / "out", root=root,
                     extra={"products": products, "wall_s": 1.0, "plan": {}, "timings_s": {},
                            "device": {}, "jobs": [{"job": "r-seed0", "exit_code": 0}]})
    home = tmp_path / "home"
    placed = gpu_archive.unpack(tmp_path / "out", root=home)
    kept = home / gpu_archive.CALL_RECORDS
    assert kept / "20260101T000000Z.json" in placed
    assert (kept / "20260101T000000Z-nvidia-smi.csv").read_text().startswith("timestamp")
    assert json.loads((kept / "20260101T000000Z.json").read_text())["wall_s"] == 1.0


def test_only_a_call_with_qlora_carries_bitsandbytes():
    """bitsandbytes is 3.6 MiB of a call's 64: a call without a 4-bit method leaves it here."""
    from finetune_lab.runs.gpu_bundle import needs_bitsandbytes
    from finetune_lab.runs.gpu_plan import Plan

    assert needs_bitsandbytes(Plan())
    assert not needs_bitsandbytes(Plan(lab_parts=["fairseq", "transformers"]))
    assert not needs_bitsandbytes(Plan(lora_methods=["lora-qv", "lora-attn"]))
    assert not needs_bitsandbytes(Plan(steps=["pretrain"]))


def test_weights_with_a_damaged_manifest_are_refused_before_anything_moves(tmp_path):
    """gpu-unpack of a candidate whose manifest.json was cut short moved the folder in, then
    raised a traceback: the weights' manifest is checked with every other product, first."""
    root = tmp_path / "root"
    run = root / "data" / "runs" / "x-gpu" / "r-seed0"
    run.mkdir(parents=True)
    (run / "blob").write_text("run")
    cand = root / "data" / "work" / "candidates" / "zz-new"
    cand.mkdir(parents=True)
    (cand / "manifest.json").write_text('{"files": {"model.pt": {"sha2')
    gpu_archive.pack([root / "data" / "runs" / "x-gpu", cand], tmp_path / "out", root=root,
                     extra={"products": ["data/runs/x-gpu", "data/work/candidates/zz-new"]})
    home = tmp_path / "home"
    with pytest.raises(UserError, match="zz-new: .*manifest.json is damaged .*nothing was "
                                        "unpacked"):
        gpu_archive.unpack(tmp_path / "out", root=home)
    assert not (home / "data" / "runs").exists() and not (home / "data" / "work").exists()
