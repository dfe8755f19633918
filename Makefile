# The two commands a newcomer types on a fresh Debian 12 machine, as root:
#   make demo    make test
# Each one installs what it needs (Debian packages, then .venv) first.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: all deps demo test lint bench clean

all: test

$(STAMP): pyproject.toml scripts/install-system-deps
	./scripts/install-system-deps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

deps: $(STAMP)

demo: $(STAMP)
	./scripts/demo

test: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m mypy src
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m mypy src

bench: $(STAMP)
	./scripts/bench

clean:
	rm -rf $(VENV) .demo .mypy_cache .ruff_cache .pytest_cache
