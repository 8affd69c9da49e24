from __future__ import annotations

import pytest

from finetune_lab.errors import UserError
from finetune_lab.train.recipe import LAB_RECIPE, FinetuneRecipe


def test_lab_schedule_is_derived_from_data_size():
    assert LAB_RECIPE.total_updates(1800) == 1125
    assert LAB_RECIPE.warmup_updates(1800) == 67


def test_last_partial_batch_counts_as_an_update():
    recipe = FinetuneRecipe(batch_size=8, epochs=2)
    assert recipe.updates_per_epoch(17) == 3
    assert recipe.total_updates(17) == 6


def test_empty_training_set_is_refused():
    """Trial 26's E-m1: a ValueError (a traceback) where the split held no review."""
    with pytest.raises(UserError, match=r"the training split holds 0 reviews: prepare the "
                                        r"split again"):
        LAB_RECIPE.total_updates(0)


def test_as_dict_records_the_derived_schedule():
    d = LAB_RECIPE.as_dict(1800)
    assert (d["total_updates"], d["warmup_updates"], d["lr"]) == (1125, 67, 1e-5)
