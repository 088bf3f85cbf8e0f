"""The mutation runner of tests/emulator/mutation.py (``make mutate``), checked on what it
makes and how it judges: each kind of mutant rewrites the one line it should, and on the
write_cache kernel an unchanged "mutant" is equivalent while a dropped ``s_waitcnt`` before a
load's use is killed (by the emulator's refusal or by the outputs). Mutation: a verdict that
never runs the kill cases (always "equivalent") fails the second test."""

from __future__ import annotations

import mutation

ASM = """\
\tv_mfma_scale_f32_16x16x128_f8f6f4 v[10:13], v[36:39], v[2:9], 0, v10, v53 op_sel_hi:[0,0,0] cbsz:4
\tv_cmp_gt_i32_e32 vcc, s92, v13
\tglobal_load_dwordx4 v[16:19], v[2:3], off offset:16
\tds_read2_b32 v[4:5], v15 offset0:129 offset1:131
\ts_waitcnt vmcnt(0)"""


def test_each_kind_rewrites_its_line():
    made = {(m.kind, m.line): [] for m in mutation.mutants_of("k", ASM)}
    for m in mutation.mutants_of("k", ASM):
        made[(m.kind, m.line)].append(m.after.strip())
    scale = made[("scale", 1)]
    assert scale[0].endswith("0, v53, v10 op_sel_hi:[0,0,0] cbsz:4")  # the scales swapped
    assert [s.rsplit(" ", 1)[-1] for s in scale[1:]] == ["op_sel:[1,0,0]", "op_sel:[0,1,0]"]
    assert made[("compare", 2)] == ["v_cmp_ge_i32_e32 vcc, s92, v13"]
    assert made[("offset", 3)] == ["global_load_dwordx4 v[16:19], v[2:3], off offset:32",
                                   f"global_load_dwordx4 v[16:19], v[2:3], off offset:"
                                   f"{16 + mutation.ROW_BYTES}"]
    assert made[("offset", 4)] == ["ds_read2_b32 v[4:5], v15 offset0:130 offset1:131",
                                   "ds_read2_b32 v[4:5], v15 offset0:129 offset1:132"]
    assert made[("waitcnt", 5)] == ["s_nop 0"]
    assert sorted(made) == [("compare", 2), ("offset", 3), ("offset", 4), ("scale", 1),
                            ("waitcnt", 5)]


def test_verdicts_on_the_writer(built):
    import numpy as np

    objects = built[1]
    symbol = "jax_mxfp4_write_cache"
    co = objects[symbol]
    judge = mutation.judge_of(co.spec, np.random.default_rng(0))
    lines = co.isa.split("\n")
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("s_waitcnt"))
    unchanged = mutation.Mutant(symbol, "waitcnt", first + 1, lines[first], lines[first])
    assert mutation.verdict(unchanged, objects, judge) == "equivalent"
    dropped = [m for m in mutation.mutants_of(symbol, co.isa, ("waitcnt",))]
    assert dropped and all(mutation.verdict(m, objects, judge) == "killed" for m in dropped)


def test_shards_share_one_results_file_and_a_rerun_reuses_it(built, tmp_path, monkeypatch):
    """Two shards cover the selection between them, each verdict lands in the results file
    once, and a later run over the whole selection judges nothing again (its verdicts all come
    from the file). Mutation: a ``recorded`` that ignores the file makes the rerun call
    ``verdict``, which this test forbids."""
    import dataclasses
    import json

    objects = built[1]
    symbols = ["jax_mxfp4_write_cache"]
    whole = mutation.choose(objects, symbols, ("waitcnt",), None, 0)
    halves = [mutation.choose(objects, symbols, ("waitcnt",), None, 0, (k, 2)) for k in (0, 1)]
    assert sorted(m.line for h in halves for m in h) == sorted(m.line for m in whole)
    results = tmp_path / "verdicts.jsonl"
    first = [v for h in halves for v in mutation.run(objects, h, 0, results)]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == len(whole) and {r["verdict"] for r in rows} == {"killed"}

    def no_rerun(*args):
        raise AssertionError("a recorded mutant was judged again")

    monkeypatch.setattr(mutation, "verdict", no_rerun)
    again = mutation.run(objects, whole, 0, results)
    assert sorted((m.line, v) for m, v in again) == sorted((m.line, v) for m, v in first)
    co = objects[symbols[0]]
    rebuilt = {symbols[0]: dataclasses.replace(co, isa=co.isa + "\n")}
    assert mutation.recorded(results, rebuilt) == {}  # another text: its verdicts do not apply
