# The README's two commands are `make site` and `make test`; both set everything up first.
VENV ?= .venv

.PHONY: setup lock site test check-freeze clean experiments

setup:
	scripts/setup.sh $(VENV)

# Regenerate requirements/lock.txt (and fairseq.txt, uv.txt) from pyproject.toml; see README.
lock:
	scripts/lock.sh $(LOCK_ARGS)

site: setup
	VENV=$(VENV) scripts/render.sh

test: setup
	$(VENV)/bin/python -m pytest -n auto --dist loadfile --no-loadscope-reorder --durations=20

check-freeze: setup
	$(VENV)/bin/finetune-lab check-freeze

clean:
	rm -rf _site .quarto  # not _freeze/: it is committed (see README, Quarto)

# Re-run every experiment (resumable; on a GPU when one is available). See README.
experiments: setup
	$(VENV)/bin/finetune-lab reproduce
