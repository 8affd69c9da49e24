"""Stage 2, models: RoBERTa-small-fr and BLOOM-560m as code: architecture, counts, checkpoints, conversion."""
