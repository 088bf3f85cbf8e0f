"""The tools around the library: the demo (``python -m jax_mxfp4 demo``), the benchmarks
(``bench``: ``bench.py`` on any platform, ``bench_gpu.py`` the GPU table, ``bench_step.py`` the
whole decode step against dense attention, ``bench_inputs.py`` their inputs) and the CDNA
emulator's profile of the ROCm kernels (``emulate``: ``emulate_profile.py``).

They use ``jax_mxfp4``'s public API (and, for the profile, its emulated backends); the library
never imports them (the import contract in ``pyproject.toml``).
"""
