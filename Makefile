# `make demo` and `make test` set everything up from nothing, in .venv:
#   make demo  the package alone (its C++ FFI handlers built by scikit-build-core/CMake) and
#              what it depends on (jax, numpy, ml_dtypes), then the demo;
#   make test  the package with its `test` and `rocm` extras (pytest, Triton, FlyDSL, an LLD;
#              no torch: gfx950 builds run FlyDSL with a stand-in), then ruff and the suite
#              in TEST_WORKERS processes.
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
SOURCES_NEEDING_REBUILD := pyproject.toml CMakeLists.txt $(shell find ffi -type f 2>/dev/null)
EXTRAS_demo :=
EXTRAS_test := [test,rocm]
# Test processes (pytest-xdist): CI's machine has 2 cores; every worker loads JAX with 8 host
# devices, so raise it with care on a larger machine (`make test TEST_WORKERS=4`).
TEST_WORKERS ?= 2

.PHONY: demo test lint install clean

# $(VENV)/.installed-demo and $(VENV)/.installed-test: one install each, redone when the
# package's build inputs change.
$(VENV)/.installed-%: $(SOURCES_NEEDING_REBUILD)
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	@# Build requirements go in first so the editable build can skip isolation (and not
	@# download jaxlib a second time into a throwaway environment).
	$(VPY) -m pip install -q "scikit-build-core>=0.10" cmake ninja "jax>=0.10"
	$(VPY) -m pip install -q --no-build-isolation -e ".$(EXTRAS_$*)"
	@touch $@

install: $(VENV)/.installed-test

demo: $(VENV)/.installed-demo
	$(VPY) -m jax_mxfp4 demo

lint: $(VENV)/.installed-test
	$(VPY) -m ruff check .

test: $(VENV)/.installed-test lint
	$(VPY) -m pytest -q -n $(TEST_WORKERS) tests

clean:
	rm -rf $(VENV) build

# `make asan`: the CPU FFI handlers built with AddressSanitizer (scikit-build-core with
# cmake.define.JAX_MXFP4_ASAN=ON, in build/asan; the .venv install is left untouched), then
# tests/test_cpu_ffi.py run against that build with libasan preloaded.
ASAN_BUILD := build/asan
# libstdc++ is preloaded too: python itself does not link it, and ASan's __cxa_throw interceptor
# needs the real one (jaxlib throws C++ exceptions internally).
ASAN_LIB = $(shell $(CXX) -print-file-name=libasan.so) $(shell $(CXX) -print-file-name=libstdc++.so.6)
ASAN_RUN := import glob, importlib.util, sys; \
	path = glob.glob('$(ASAN_BUILD)/ffi/_ffi_cpu*.so')[0]; \
	spec = importlib.util.spec_from_file_location('jax_mxfp4._ffi_cpu', path); \
	mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); \
	sys.modules['jax_mxfp4._ffi_cpu'] = mod; print('FFI handlers from', path); \
	import pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/test_cpu_ffi.py']))

.PHONY: asan
asan: $(VENV)/.installed-test
	$(VPY) -m pip wheel -q --no-build-isolation --no-deps -w $(ASAN_BUILD)/dist \
		--config-settings=cmake.define.JAX_MXFP4_ASAN=ON \
		--config-settings=build-dir=$(ASAN_BUILD) .
	LD_PRELOAD="$(ASAN_LIB)" ASAN_OPTIONS=detect_leaks=0 $(VPY) -c "$(ASAN_RUN)"

# `make fuzz`: the long metadata fuzzing run (`pytest -m fuzz`: tests/test_fuzz.py, with
# JAX_MXFP4_FUZZ_EXAMPLES examples per case, 400 by default) and the boundary, edge and
# non-finite tests, all through the public API, against the CPU FFI handlers built with
# AddressSanitizer as for `make asan` (an access outside a pool is reported where it happens).
# --capture=sys: with pytest's default fd capture an ASan report goes to the capture file and
# the run just exits 1, silently.
FUZZ_TESTS := 'tests/test_fuzz.py', 'tests/test_checks.py', 'tests/test_edges.py', \
	'tests/test_nonfinite.py', 'tests/test_metadata.py'
FUZZ_RUN := import glob, importlib.util, sys; \
	path = glob.glob('$(ASAN_BUILD)/ffi/_ffi_cpu*.so')[0]; \
	spec = importlib.util.spec_from_file_location('jax_mxfp4._ffi_cpu', path); \
	mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); \
	sys.modules['jax_mxfp4._ffi_cpu'] = mod; print('FFI handlers from', path); \
	import pytest; sys.exit(pytest.main(['-q', '--capture=sys', '-p', 'no:cacheprovider', \
	'-m', 'fuzz or not fuzz', $(FUZZ_TESTS)]))

.PHONY: fuzz
fuzz: $(STAMP)
	$(VPY) -m pip wheel -q --no-build-isolation --no-deps -w $(ASAN_BUILD)/dist \
		--config-settings=cmake.define.JAX_MXFP4_ASAN=ON \
		--config-settings=build-dir=$(ASAN_BUILD) .
	LD_PRELOAD="$(ASAN_LIB)" ASAN_OPTIONS=detect_leaks=0 $(VPY) -c "$(FUZZ_RUN)"
