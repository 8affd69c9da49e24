"""Stage 4, runs: recording runs, reading them back, and running grids of them."""
