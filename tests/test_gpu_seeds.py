"""Which seeds ran on which GPU, in how many device calls: the sentence the GPU sections print."""

from __future__ import annotations

from finetune_lab.book.gpu_seeds import seeds_by_gpu, seeds_by_gpu_sentence


def test_the_sentence_names_each_gpu_its_seeds_and_its_calls():
    rows = [("1× NVIDIA H200", (0, 1, 2, 3, 4, 5, 6, 7, 8), 3),
            ("1× NVIDIA H100 80GB HBM3", (9, 10, 11), 1)]
    assert seeds_by_gpu_sentence(rows) == (
        "Seeds 0 to 8 ran on one NVIDIA H200, in 3 device calls, and seeds 9 to 11 on one "
        "NVIDIA H100 80GB HBM3, in one device call.")
    assert seeds_by_gpu_sentence([("1× NVIDIA H200", (4,), 1)]) == (
        "Seed 4 ran on one NVIDIA H200, in one device call.")
    assert seeds_by_gpu_sentence([]) == ""


def test_no_gpu_experiment_gives_no_rows(tmp_path):
    assert seeds_by_gpu("fairseq", root=tmp_path, runs_root=tmp_path) == []
