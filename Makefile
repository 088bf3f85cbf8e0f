# `make demo` and `make test` set everything up from nothing:
#   make demo  .venv: the package alone (its C++ FFI handlers built by scikit-build-core/CMake)
#              and what it depends on (jax, numpy, ml_dtypes), then the demo;
#   make test  what CI judges, the wheel: builds it, installs it with its `test` and `rocm`
#              extras (pytest, Triton, FlyDSL, an LLD; no torch: gfx950 builds run FlyDSL with a
#              stand-in) into .venv-wheel (made afresh when pyproject.toml changes), then ruff
#              and the suite in TEST_WORKERS processes, run from a folder outside the checkout
#              against the installed package (conftest checks no source root is importable).
#   make install  .venv, editable, with the test and rocm extras: for development
#              (`.venv/bin/python -m pytest tests/...`).
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
SOURCES_NEEDING_REBUILD := pyproject.toml CMakeLists.txt $(shell find ffi -type f 2>/dev/null)
EXTRAS_demo :=
EXTRAS_test := [test,rocm]
BUILD_REQUIREMENTS := "scikit-build-core>=0.10" cmake ninja "jax>=0.10"
# Test processes (pytest-xdist): CI's machine has 2 cores; every worker loads JAX with 8 host
# devices, so raise it with care on a larger machine (`make test TEST_WORKERS=4`).
TEST_WORKERS ?= 2
WHEEL_VENV := .venv-wheel
WPY        := $(CURDIR)/$(WHEEL_VENV)/bin/python
WHEEL_DIR  := build/dist
# The suite runs from here (outside the checkout, so the working directory puts no source
# package on sys.path); pytest reads its options from the checkout's pyproject.toml.
TEST_RUN_DIR ?= $(or $(TMPDIR),/tmp)/jax_mxfp4-test-run
PACKAGE_SOURCES := $(shell find jax_mxfp4 cdna_emulator jax_mxfp4_tools -type f -not -path '*/__pycache__/*' \
	-not -name '*.so' 2>/dev/null)

.PHONY: demo test lint install clean wheel

# $(VENV)/.installed-demo and $(VENV)/.installed-test: one editable install each, redone when
# the package's build inputs change.
$(VENV)/.installed-%: $(SOURCES_NEEDING_REBUILD)
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	@# Build requirements go in first so the editable build can skip isolation (and not
	@# download jaxlib a second time into a throwaway environment).
	$(VPY) -m pip install -q $(BUILD_REQUIREMENTS)
	$(VPY) -m pip install -q --no-build-isolation -e ".$(EXTRAS_$*)"
	@touch $@

install: $(VENV)/.installed-test

demo: $(VENV)/.installed-demo
	$(VPY) -m jax_mxfp4 demo

# A fresh venv for the wheel whenever the dependencies may have changed.
$(WHEEL_VENV)/.created: pyproject.toml
	rm -rf $(WHEEL_VENV)
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WPY) -m pip install -q --upgrade pip
	$(WPY) -m pip install -q $(BUILD_REQUIREMENTS)
	@touch $@

# The wheel (build/wheel: its own CMake folder, apart from the editable install's), installed
# with its extras; redone when any file that goes into it changes.
$(WHEEL_VENV)/.installed: $(WHEEL_VENV)/.created $(SOURCES_NEEDING_REBUILD) $(PACKAGE_SOURCES)
	rm -rf $(WHEEL_DIR)
	$(WPY) -m pip wheel -q --no-build-isolation --no-deps -w $(WHEEL_DIR) \
		--config-settings=build-dir=build/wheel .
	$(WPY) -m pip install -q --force-reinstall --no-deps $(WHEEL_DIR)/jax_mxfp4-*.whl
	$(WPY) -m pip install -q "$$(ls $(WHEEL_DIR)/jax_mxfp4-*.whl)$(EXTRAS_test)"
	@touch $@

wheel: $(WHEEL_VENV)/.installed

lint: $(WHEEL_VENV)/.installed
	$(WPY) -m ruff check .
	$(WHEEL_VENV)/bin/lint-imports

test: $(WHEEL_VENV)/.installed lint
	rm -rf $(TEST_RUN_DIR) && mkdir -p $(TEST_RUN_DIR)
	cd $(TEST_RUN_DIR) && JAX_MXFP4_TEST_INSTALLED=1 $(WPY) -m pytest -q -n $(TEST_WORKERS) \
		-p no:cacheprovider -c $(CURDIR)/pyproject.toml --rootdir=$(CURDIR) $(CURDIR)/tests

clean:
	rm -rf $(VENV) $(WHEEL_VENV) build

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
# JAX_MXFP4_FUZZ_EXAMPLES examples per case, 400 by default), the emulated backends' API fuzz
# (tests/test_emulated_fuzz.py: emulated-gfx950 with each gfx950_kernels choice and
# emulated-gfx942, as many examples per case; several seconds each, so hours at 400), the
# single-instruction mutants of the FlyDSL kernels (tests/emulator/test_emulator_flydsl.py)
# and the boundary, edge and non-finite tests, all through the public API, against the CPU
# FFI handlers built with AddressSanitizer as for `make asan` (an access outside a pool is
# reported where it happens).
# --capture=sys: with pytest's default fd capture an ASan report goes to the capture file and
# the run just exits 1, silently.
FUZZ_TESTS := 'tests/test_fuzz.py', 'tests/test_checks.py', 'tests/test_edges.py', \
	'tests/test_nonfinite.py', 'tests/test_metadata.py', 'tests/test_emulated_fuzz.py', \
	'tests/emulator/test_emulator_flydsl.py'
FUZZ_RUN := import glob, importlib.util, sys; \
	path = glob.glob('$(ASAN_BUILD)/ffi/_ffi_cpu*.so')[0]; \
	spec = importlib.util.spec_from_file_location('jax_mxfp4._ffi_cpu', path); \
	mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); \
	sys.modules['jax_mxfp4._ffi_cpu'] = mod; print('FFI handlers from', path); \
	import pytest; sys.exit(pytest.main(['-q', '--capture=sys', '-p', 'no:cacheprovider', \
	'-m', 'fuzz or not fuzz', $(FUZZ_TESTS)]))

.PHONY: fuzz
fuzz: $(VENV)/.installed-test
	$(VPY) -m pip wheel -q --no-build-isolation --no-deps -w $(ASAN_BUILD)/dist \
		--config-settings=cmake.define.JAX_MXFP4_ASAN=ON \
		--config-settings=build-dir=$(ASAN_BUILD) .
	LD_PRELOAD="$(ASAN_LIB)" ASAN_OPTIONS=detect_leaks=0 $(VPY) -c "$(FUZZ_RUN)"

# `make mutate`: instruction-level mutation testing of the gfx950 FlyDSL code objects
# (tests/emulator/mutation.py, issue 46): every specialization built, mutants of each
# kernel's assembly (scale operands and op_sel of scaled MFMAs, v_cmp off-by-ones, load
# offsets, dropped s_waitcnt) run in the CDNA emulator on the emulated tests' cases; prints the
# kill rate per kernel family and kind, and every survivor. All 6.1K mutants take hours on a
# core (0.1-50 s each); MUTATE_ARGS samples, e.g. MUTATE_ARGS="--per-kind 10". A full run
# in N processes: `--shard K/N --results FILE` for each K (verdicts append to FILE, a stopped
# run resumes), then once with `--results FILE` alone for the table.
# `make rocm-sim`: the real ROCm JAX plugin on AMD's rocJITsu simulated MI350X, in a Debian
# sid chroot (tools/rocm-sim/README.md; a development machine, as root; not part of make test).
# ROCJITSU=DIR reuses a rocJITsu build it made before; ROCM_SIM_DIR caches the rest.
.PHONY: rocm-sim
rocm-sim:
	tools/rocm-sim/rocm-sim.sh

MUTATE_ARGS ?= --per-kind 10
.PHONY: mutate
mutate: $(VENV)/.installed-test
	$(VPY) tests/emulator/mutation.py $(MUTATE_ARGS)
