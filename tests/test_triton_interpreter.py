"""The GPU kernels' decoding and one-row scoring checked on the CPU by Triton's interpreter
(``interpreted_kernels.py``, in a process of its own), so CI catches a wrong decode without a
GPU. Mutations: ``mxfp4.code_halves`` returning its first two pairs swapped (elements 0, 4
and 2, 6 of every word trade places) fails the one-row scoring check; scaling the
one-row scorer's groups by ``2**7`` instead of ``2**8`` fails the scoring check (every live
score differs); the attention kernel's MXFP8 store without its non-finite case (scale byte
247/248 and scaled values where a block holds Inf or NaN) fails the epilogue check (4 of 16
scale bytes differ). The select_blocks kernel with the old sentinel keys (init 1e30, local 1e29)
fails its check (a 1e30 or +inf score outranks a local block); so does its bitonic network with
the tail's sort key at ``INT_MIN`` (the cut entries sort before the tail: 29 % of the results
differ) or with ties to the higher block (75 %). The split-K merge weighting every split's o
partial by split 0's weight, or by 1.05 times its own, fails the attention check (the merged
values against the direct path's, at SPEC §10's tolerance: 45 % / 63 % outside; 54 % for the
1.05 in the in-flight merge of ``_merge_in_flight``), and the 1.05 in the merge of a row of
more splits than ``MERGE_IN_FLIGHT`` fails the long-row check (4.5 % outside); so does a
merge program (one MXFP8 block of a row each) storing its head dimensions with the two
nibbles' columns swapped (83 % outside), or reading the high nibbles' columns ``BLOCKS * 16``
after the low ones instead of 64 (right only for a whole row), fails it. SPEC §9.2
(checked by the class of each result): without the NaN of a byte-255 token in
``mxfp4.page_logits`` the group-dot tiling fails, in ``mxfp4.row_page_logits`` the one-row
tiling; without the poisoned-row test of ``_masked_maxima`` / ``_row_maxima`` the group-dot /
one-row tilings;
without the page-exponent overflow check of ``folded_row_maxima`` (on the blocks a tile's
rows see whole, or on those they see in part: ``poison_diagonal_block``), or without its rows
made NaN from the first NaN-key token they see, the folded tiling; without the
NaN of an infinite logit in ``_attend_page``, or without the final NaN of a q head whose
running max is NaN, the attention checks; without the NaN of a byte-255
group in ``mxfp4.page_values`` the page check. Removing the reduce kernel's explicit NaN is
not seen here (the split's NaN partials carry it through the merge anyway, in numpy's
arithmetic); it is kept because PTX's ``max`` drops a NaN ``m``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_interpreted_kernels_match_the_oracle():
    here = Path(__file__).parent
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    # torch is blocked (an import of it fails) to show the interpreter runs on numpy alone.
    script = (f"import runpy, sys; sys.modules['torch'] = None; "
              f"runpy.run_path({str(here / 'interpreted_kernels.py')!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.split() == ["ok", "page_values", "ok", "scale_pow2", "ok",
                                   "one_row_index_scores", "ok",
                                   "mxfp8_epilogue", "ok", "select_blocks", "ok",
                                   "index_score_classes", "ok", "attention_classes", "ok",
                                   "attention_long_rows"]
