"""finetune-lab: the NLP-frameworks lab as a reproducible report."""
__version__ = "0.1.0"
