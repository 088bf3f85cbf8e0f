# `make demo` and `make test` set everything up from nothing: a .venv with the package
# (built with its C++ FFI handlers) and its test extras, then run.
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SOURCES_NEEDING_REBUILD := pyproject.toml CMakeLists.txt $(shell find ffi -type f 2>/dev/null)

.PHONY: demo test lint install clean

$(STAMP): $(SOURCES_NEEDING_REBUILD)
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	@# Build requirements go in first so the editable build can skip isolation (and not
	@# download jaxlib a second time into a throwaway environment).
	$(VPY) -m pip install -q "scikit-build-core>=0.10" cmake ninja "jax>=0.10"
	$(VPY) -m pip install -q --no-build-isolation -e ".[test]"
	@touch $@

install: $(STAMP)

demo: $(STAMP)
	$(VPY) -m jax_mxfp4 demo

lint: $(STAMP)
	$(VPY) -m ruff check .

test: $(STAMP) lint
	$(VPY) -m pytest -q tests

clean:
	rm -rf $(VENV) build
