"""Stage 5, book: what each chapter shows, computed from the run cache; the freeze."""
