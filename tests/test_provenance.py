"""The provenance footer, built from real runs and a chapter's declared inputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from runfixtures import EXPERIMENT, copy_run

from finetune_lab.book.records import digest_of
from finetune_lab._files import sha256_file
from finetune_lab.book.provenance import current_chapter, provenance_footer, provenance_markdown
from finetune_lab.runs.manifest import read_manifest
from finetune_lab.runs.registry import discover_runs


@pytest.mark.slow
def test_footer_lists_runs_hashes_devices_and_inputs(tiny_grid, tmp_path: Path,
                                                     monkeypatch) -> None:
    runs_root = tmp_path / "data" / "runs"
    good = copy_run(tiny_grid, "random-seed1", runs_root)
    bad = copy_run(tiny_grid, "random-seed2", runs_root)
    (bad / "manifest.json").unlink()
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "r.qmd").write_text(
        f"---\ntitle: R\ninputs:\n  - data/runs/{EXPERIMENT}/**\n---\n")
    records = discover_runs(runs_root)
    text = provenance_markdown(records, chapter="chapters/r.qmd", project=tmp_path)
    man = read_manifest(good)
    assert "Runs: 1 used, 1 excluded." in text
    assert f"{EXPERIMENT}/random-seed1" in text and "excluded: " in text
    assert sha256_file(good / "manifest.json")[:12] in text
    assert digest_of(man["outputs"])[:12] in text
    assert man["device"]["name"] in text
    assert f"torch {man['environment']['packages']['torch']}" in text
    assert "Executed " in text and "from Quarto's freeze" not in text  # said once, on the front page
    n_files = sum(1 for p in (runs_root / EXPERIMENT).rglob("*") if p.is_file())
    assert f"Inputs of `chapters/r.qmd` (its declared data, and the package modules its code " \
        f"imports, directly or not): {n_files} files" in text
    # the HTML's full form and the PDF's compact one, as Quarto conditional content
    html, rest = text.split('::: {.content-visible when-format="html"}')[1].split(":::", 1)
    pdf = rest.split('::: {.content-hidden when-format="html"}')[1].split(":::")[0]
    assert man["device"]["name"] in html and man["device"]["name"] not in pdf
    assert f"`{sha256_file(good / 'manifest.json')[:8]}`" not in pdf  # valid runs: HTML only
    bad = [r for r in records if not r.valid]
    from finetune_lab.book.provenance import compact_run_rows
    assert bad and all(f"`{row['run']}` (manifest {row['manifest']})" in pdf
                       for row in compact_run_rows(bad))
    assert pdf.count("Excluded: ") == 1 and "| run |" not in pdf
    assert "listed in the HTML book" in pdf
    md = provenance_footer(records, chapter="chapters/r.qmd", project=tmp_path)
    assert md._repr_markdown_().startswith("## Provenance")

    monkeypatch.setenv("QUARTO_DOCUMENT_PATH", str(tmp_path / "chapters"))
    monkeypatch.setenv("QUARTO_DOCUMENT_FILE", "r.qmd")
    assert current_chapter(tmp_path) == "chapters/r.qmd"
    shutil.rmtree(runs_root)
    assert "declares no `inputs:` and imports no package module" in provenance_markdown(
        [], chapter="index.qmd", project=_with_index(tmp_path))


def _with_index(root: Path) -> Path:
    (root / "index.qmd").write_text("---\ntitle: Home\n---\n")
    return root
