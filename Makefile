# The two commands a newcomer types on a fresh Debian 12 machine, as root:
#   make demo    make test
# Each one installs what it needs (Debian packages, then .venv) first.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: all deps demo test lint bench screenshots clean bytecode

all: test

$(STAMP): pyproject.toml scripts/install-system-deps
	./scripts/install-system-deps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

deps: $(STAMP)

# The editable install leaves hvfleet's own modules uncompiled, and a
# PYTHONDONTWRITEBYTECODE environment never writes them: every `hvfleet`
# process would compile them again (~45 ms). pip compiles a regular install.
bytecode: $(STAMP)
	$(PY) -m compileall -q src

demo: bytecode
	./scripts/demo

test: bytecode
	$(PY) -m ruff check src tests bench
	$(PY) -m mypy src
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m mypy src

screenshots: $(STAMP)
	$(PY) -m bench.screenshots --out docs/img

bench: bytecode
	./scripts/bench

clean:
	rm -rf $(VENV) .demo .mypy_cache .ruff_cache .pytest_cache
