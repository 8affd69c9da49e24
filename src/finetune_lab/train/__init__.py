"""Stage 3, train: pretraining the stand-in and fine-tuning it with fairseq, Transformers and peft."""
