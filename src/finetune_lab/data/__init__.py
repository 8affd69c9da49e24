"""Stage 1, data: CLS-Books and the ELTeC corpus read, tokenized and binarized."""
