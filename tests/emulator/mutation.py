"""Instruction-level mutation testing of the gfx950 FlyDSL code objects (issue 46, item 2).

``make mutate`` (or ``python tests/emulator/mutation.py``) builds every MiniMax-M3.1
specialization, makes mutants of each kernel's assembly text, one instruction changed at a
time, and runs each mutant in the CDNA emulator on the cases of the emulated tests. It reports,
per kernel family and kind of mutant, how many the tests kill, how many are equivalent and
how many survive. The kinds (:data:`KINDS`):

* ``scale``: a scaled MFMA with its two scale operands swapped, or with ``op_sel`` picking
  another byte of either scale register;
* ``compare``: a ``v_cmp`` turned into its off-by-one partner (gt <-> ge, lt <-> le,
  eq <-> ne);
* ``offset``: a global, buffer or LDS load's offset moved by one element or by one row
  (:data:`ROW_BYTES`);
* ``waitcnt``: an ``s_waitcnt`` dropped (replaced by ``s_nop 0``, so line numbers hold).

A mutant is **killed** when a case's output differs from the float64 oracle the tests use
(bits where SPEC says exact, SPEC §10's tolerance for attention) or the emulator refuses to
run it (an undefined register, an access out of bounds, an instruction it does not model:
a GPU would compute garbage there, and the emulated tests fail the same way). A mutant that
is not killed is **equivalent** when its outputs equal the kernel's own, bit for bit, on a
second case with other data and every context of :data:`tests.emulator.test_emulator_flydsl.
EQUIVALENCE` (attention) or other rows (the scorers, the writer); otherwise it **survives**, a
gap in the tests. The kill rate is killed / (mutants - equivalent); issue 46 asks for 95 %.

Mutants of the MXFP8-output attention kernels are not judged here: their tests compare
against the bf16 path's own output, which this runner does not rebuild per mutant.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import harness  # noqa: E402
import numpy as np  # noqa: E402
import oracle  # noqa: E402
import test_emulator_flydsl as flydsl_tests  # noqa: E402
import test_emulator_write_cache as write_tests  # noqa: E402
from conftest import SM_SCALE, attention_case, ramp_index_case  # noqa: E402

from cdna_emulator import EmulatorFault  # noqa: E402
from jax_mxfp4 import reference  # noqa: E402
from jax_mxfp4._src.core.progress import progress  # noqa: E402

KINDS = ("scale", "compare", "offset", "waitcnt")
ROW_BYTES = 256
"""One row of a tile in the offset mutants: a 128-element bf16 row (an MXFP4 page row of
packed values is 64 bytes, an fp32 row of 16 lanes 64: 256 covers the widest)."""

_SCALED = re.compile(r"^(\s*v_mfma_scale\S*\s+(?:[^,]+,\s*){4})([^,\s]+)(,\s*)([^,\s]+)(.*)$")
_COMPARE = re.compile(r"^(\s*v_cmpx?_)(gt|ge|lt|le|eq|ne)(_\w+.*)$")
_PARTNER = {"gt": "ge", "ge": "gt", "lt": "le", "le": "lt", "eq": "ne", "ne": "eq"}
_LOAD = re.compile(r"^\s*(global_load|buffer_load|ds_read|ds_load)\S*")
_WIDTH = re.compile(r"(dwordx(\d)|dword|ubyte|sbyte|ushort|sshort|short|b(\d+)|u(\d+)|i(\d+))")


@dataclasses.dataclass(frozen=True)
class Mutant:
    """Kernel ``symbol``'s assembly with line ``line`` (1-based) replaced by ``after``."""

    symbol: str
    kind: str
    line: int
    before: str
    after: str

    @property
    def key(self) -> tuple[str, int, str]:
        """What a recorded verdict is looked up by (with the kernel text's hash)."""
        return self.symbol, self.line, self.after

    def apply(self, isa: str) -> str:
        lines = isa.split("\n")
        assert lines[self.line - 1] == self.before
        lines[self.line - 1] = self.after
        return "\n".join(lines)


def _scale_mutants(line: str) -> Iterator[str]:
    m = _SCALED.match(line)
    if not m:
        return
    yield f"{m.group(1)}{m.group(4)}{m.group(3)}{m.group(2)}{m.group(5)}"
    for op_sel in ("op_sel:[1,0,0]", "op_sel:[0,1,0]"):
        yield f"{line} {op_sel}"


def _compare_mutants(line: str) -> Iterator[str]:
    m = _COMPARE.match(line)
    if m:
        yield f"{m.group(1)}{_PARTNER[m.group(2)]}{m.group(3)}"


def _element_bytes(mnemonic: str) -> int:
    m = _WIDTH.search(mnemonic.split("_", 2)[-1])
    if not m:
        return 4
    if m.group(1).startswith("dwordx"):
        return 4 * int(m.group(2))
    if m.group(1) == "dword":
        return 4
    if m.group(1) in ("ubyte", "sbyte"):
        return 1
    if m.group(1) in ("ushort", "sshort", "short"):
        return 2
    bits = int(next(g for g in m.groups()[2:] if g))
    return max(bits // 8, 1)


def _offset_mutants(line: str) -> Iterator[str]:
    m = _LOAD.match(line)
    if not m:
        return
    mnemonic = line.split()[0]
    if "read2" in mnemonic or "load_2" in mnemonic:  # offset0/offset1 count elements
        for field in ("offset0", "offset1"):
            found = re.search(rf"{field}:(\d+)", line)
            if found:
                moved = int(found.group(1)) + 1
                yield line.replace(found.group(0), f"{field}:{moved}")
        return
    size = _element_bytes(mnemonic)
    found = re.search(r"(?<!\w)offset:(-?\d+)", line)
    base = int(found.group(1)) if found else 0
    for delta in (size, ROW_BYTES):
        field = f"offset:{base + delta}"
        yield line.replace(found.group(0), field) if found else f"{line} {field}"


def _waitcnt_mutants(line: str) -> Iterator[str]:
    if re.match(r"^\s*s_waitcnt\b", line):
        yield re.sub(r"s_waitcnt.*$", "s_nop 0", line)


MAKERS: dict[str, Callable[[str], Iterator[str]]] = {
    "scale": _scale_mutants, "compare": _compare_mutants, "offset": _offset_mutants,
    "waitcnt": _waitcnt_mutants}


def mutants_of(symbol: str, isa: str, kinds=KINDS) -> list[Mutant]:
    """Every mutant of ``kinds`` of the kernel's assembly text, in line order."""
    found = []
    for number, line in enumerate(isa.split("\n"), start=1):
        for kind in kinds:
            found += [Mutant(symbol, kind, number, line, after) for after in MAKERS[kind](line)
                      if after != line]
    return found


# ---- judges: how the emulated tests see one kernel ---------------------------------------------


@dataclasses.dataclass
class Judge:
    """One kernel as the emulated tests see it: ``run(objects, case)`` its outputs with the
    code objects ``objects`` (symbol -> CodeObject), ``wrong(outputs, case)`` whether the
    tests fail them, on the ``kill`` cases; ``other`` a case with other data for the
    equivalence check."""

    run: Callable
    wrong: Callable
    kill: list
    other: object
    bf16_of: Callable | None = None  # MXFP8 kernels: the unmutated path's bf16 output
    other_outputs: object = None  # the unmutated kernels' outputs on ``other`` (computed once)

    def unmutated_other(self, objects):
        if self.other_outputs is None:
            self.other_outputs = self.run(objects, self.other)
        return self.other_outputs


def _index_judge(spec, rng) -> Judge:
    def run(objects, case):
        built = (None, objects)
        return flydsl_tests.run_index_scores(built, spec, case)[0]

    def wrong(scores, case):
        want = oracle.index_scores(*case.args(), num_blocks=case.num_blocks, sm_scale=SM_SCALE)
        return not oracle.bits_equal(scores, want).all()

    long = flydsl_tests.long_index_case
    return Judge(run, wrong,
                 [flydsl_tests.index_case(rng, spec), long(rng, spec.heads, spec.tiling, spec.q),
                  ramp_index_case(spec.tiling, spec.heads, spec.q)],
                 long(rng, spec.heads, spec.tiling, spec.q))


@dataclasses.dataclass
class AttentionRun:
    """An attention case and the split-K partition count it runs with (split path and merge);
    ``bf16``: the unmutated path's bf16 output, what an MXFP8 output is held to."""

    case: object
    partitions: int = 3
    bf16: np.ndarray | None = None


SPLIT_EQUIVALENCE_PARTITIONS = 11
"""The equivalence runs of the split path: more partitions than the merge kernel's unrolled
step of 8 (and a remainder), so that every loop of the merge runs (the emulated tests' 2 and
3 partitions never enter the unrolled step; a MiniMax-M3.1 call has 8)."""


def _attention_judge(spec, rng) -> Judge:
    """Attention kernels (direct or split) and the merge, by the path's final output, on the
    cases of the emulated tests (``test_sparse_attention_*``)."""
    q, output = spec.q or "bf16", spec.output
    path = "split" if spec.op == "attention_merge" else spec.path

    def run(objects, item, output=output):
        built = (None, objects)
        if path == "direct":
            return flydsl_tests.run_direct(built, item.case, q, output)
        return flydsl_tests.run_split(built, item.case, q, item.partitions, output)

    def wrong(out, item):
        if output == "mxfp8":  # the tests: MXFP8 of the same path's bf16 output, bit for bit
            values, scales = out
            want_v, want_s = oracle.quantize_mxfp8(item.bf16.reshape(item.bf16.shape[0], -1))
            return not (np.array_equal(scales, want_s) and oracle.bits_equal(values, want_v).all())
        want = oracle.sparse_attention(*item.case.args(), sm_scale=SM_SCALE)
        return np.isnan(out.astype(np.float32)).any() or not oracle.attention_close(out, want)[0]

    def sweep(contexts):
        return attention_case(rng, contexts, group=16, q_dtype=q, n_pages=3)

    kill = [AttentionRun(flydsl_tests.attention_inputs(rng, q), partitions)
            for partitions in (2, 3)] + [AttentionRun(sweep(flydsl_tests.SWEEP))]
    kill += [AttentionRun(flydsl_tests.attention_inputs(rng, q), p)
             for p in flydsl_tests.MANY_PARTITIONS]
    other = AttentionRun(sweep(flydsl_tests.EQUIVALENCE), SPLIT_EQUIVALENCE_PARTITIONS)
    return Judge(run, wrong, kill, other, lambda objects, item: run(objects, item, "bf16"))


def _write_judge(spec, rng) -> Judge:
    def case_of(tokens):
        pool = rng.integers(0, 256, (4, 2, 8704), dtype=np.uint8)
        x = np.ascontiguousarray(write_tests.rows(rng, tokens, 2))
        slots = rng.permutation(4 * 128)[:tokens].astype(np.int32)
        slots[7] = -1
        return pool, x, slots

    def run(objects, case):
        return write_tests.run_write((None, objects), *case, "up")[0]

    def wrong(pool, case):
        import jax.numpy as jnp

        want = reference.write_cache(*(jnp.asarray(a) for a in case), round_mode="up")
        return not np.array_equal(pool, np.asarray(want))

    return Judge(run, wrong, [case_of(37), case_of(130)], case_of(64))


def judge_of(spec, rng) -> Judge:
    if spec.op == "index_scores":
        return _index_judge(spec, rng)
    if spec.op == "write_cache":
        return _write_judge(spec, rng)
    return _attention_judge(spec, rng)


def _with_bf16(objects, judge: Judge, spec) -> None:
    """MXFP8 kernels are judged against the bf16 output of the same path on the same case
    (and partition count): computed once per case with the unmutated kernels."""
    if spec.output == "mxfp8":
        for item in [*judge.kill, judge.other]:
            item.bf16 = judge.bf16_of(objects, item)


def verdict(mutant: Mutant, objects: dict, judge: Judge) -> str:
    """``killed``, ``equivalent`` or ``survived`` (module docstring). A mutant the kill cases
    pass that faults on the other case survives: the tests' own cases miss what it breaks."""
    co = objects[mutant.symbol]
    mutated = {**objects, mutant.symbol: dataclasses.replace(co, isa=mutant.apply(co.isa))}
    try:
        for case in judge.kill:
            if judge.wrong(judge.run(mutated, case), case):
                return "killed"
    except EmulatorFault:
        return "killed"
    try:
        got = judge.run(mutated, judge.other)
    except EmulatorFault:
        return "survived"
    want = judge.unmutated_other(objects)
    same = (all(oracle.bits_equal(a, b).all() for a, b in zip(got, want, strict=True))
            if isinstance(got, tuple) else oracle.bits_equal(got, want).all())
    return "equivalent" if same else "survived"


class UnmutatedRuns:
    """A memo of the emulator's launches of unmutated kernels, installed over
    ``harness.run``: a launch whose kernel text, grid, block, kernel arguments and every mapped
    byte equal an earlier one's gets that one's outputs (its writable regions as they were
    after the run) and report back. The emulator is deterministic, so this changes no verdict;
    it makes a merge mutant cost the merge alone (the split kernel before it runs unmutated on
    the same case every time). Mutated kernels always run."""

    def __init__(self, objects: dict):
        self.texts = {co.isa for co in objects.values()}
        self.seen: dict[tuple, tuple] = {}
        self.inner = harness.run

    def __call__(self, kernel, *, memory, kernarg, grid, block, **kw):
        if kernel.program.text not in self.texts:
            return self.inner(kernel, memory=memory, kernarg=kernarg, grid=grid, block=block,
                              **kw)
        key = (hashlib.sha256(kernel.program.text.encode()).digest(), kernel.descriptor.symbol,
               tuple(grid), tuple(block), bytes(kernarg), tuple(sorted(kw.items())),
               tuple((r.start, r.writable, hashlib.sha256(r.view.tobytes()).digest())
                     for r in memory.regions))
        if key not in self.seen:
            report = self.inner(kernel, memory=memory, kernarg=kernarg, grid=grid, block=block,
                                **kw)
            self.seen[key] = (report, [r.view.copy() for r in memory.regions if r.writable])
        report, after = self.seen[key]
        for region, bytes_after in zip([r for r in memory.regions if r.writable], after,
                                       strict=True):
            region.view[...] = bytes_after
        return report


# ---- the run -----------------------------------------------------------------------------------


def family(symbol: str) -> str:
    for name in ("index_scores", "sparse_attention", "attention_merge", "write_cache"):
        if name in symbol:
            return name
    return symbol


def build(kernel_dir: Path | None) -> dict:
    """symbol -> CodeObject of every MiniMax-M3.1 specialization: from ``kernel_dir`` (a
    ``python -m jax_mxfp4 build`` folder) or built now with a fresh cache."""
    import os

    from jax_mxfp4._src.flydsl.build import build_all

    if kernel_dir is not None:
        os.environ["JAX_MXFP4_KERNEL_DIR"] = str(kernel_dir)
    else:
        os.environ.pop("JAX_MXFP4_KERNEL_DIR", None)
        os.environ["JAX_MXFP4_CACHE_DIR"] = tempfile.mkdtemp(prefix="mutation-cache-")
    return {co.symbol: co for co in build_all("gfx950", None, progress=False)}


def choose(objects: dict, symbols: list[str], kinds, per_kind: int | None, seed: int,
           shard: tuple[int, int] = (0, 1)) -> list[Mutant]:
    """The mutants of each kernel in ``symbols`` and kind (at most ``per_kind`` of each, a
    seeded sample), in order; ``shard`` ``(k, n)`` keeps every n-th from the k-th."""
    sample = random.Random(seed)
    chosen: list[Mutant] = []
    for symbol in symbols:
        for kind in kinds:
            of_kind = mutants_of(symbol, objects[symbol].isa, (kind,))
            if per_kind is not None and len(of_kind) > per_kind:
                of_kind = sorted(sample.sample(of_kind, per_kind), key=lambda m: m.line)
            chosen += of_kind
    k, n = shard
    return chosen[k::n]


def text_hash(isa: str) -> str:
    """What a recorded verdict is valid for: the kernel's assembly text."""
    return hashlib.sha256(isa.encode()).hexdigest()[:16]


def recorded(path: Path | None, objects: dict) -> dict[tuple, str]:
    """Verdicts already in the results file ``path`` (JSON lines) for these very kernels:
    ``(symbol, line, after) -> verdict``; lines of another build of a kernel are ignored."""
    if path is None or not path.exists():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        co = objects.get(row["symbol"])
        if co is not None and row["isa"] == text_hash(co.isa):
            found[(row["symbol"], row["line"], row["after"])] = row["verdict"]
    return found


def run(objects: dict, chosen: list[Mutant], seed: int, results: Path | None = None) -> list:
    """``(mutant, verdict)`` for each mutant of ``chosen``; those already in ``results`` are
    not run again, and each new verdict is appended to it as soon as it is known (so that a
    stopped run resumes, and shards in several processes share one file)."""
    done = recorded(results, objects)
    judges, verdicts = {}, []
    harness.run = UnmutatedRuns(objects)
    try:
        for i, mutant in enumerate(chosen):
            progress(i, len(chosen), f"{mutant.symbol} {mutant.kind} line {mutant.line}",
                     what="mutant")
            if mutant.key not in done:
                done[mutant.key] = verdict(mutant, objects, _judge(mutant, objects, judges, seed))
                _append(results, mutant, done[mutant.key], objects)
            verdicts.append((mutant, done[mutant.key]))
    finally:
        harness.run = harness.run.inner
    progress(len(chosen), len(chosen), "done", what="mutant")
    return verdicts


def _judge(mutant: Mutant, objects: dict, judges: dict, seed: int) -> Judge:
    """The judge of ``mutant``'s kernel, made on its first mutant and kept in ``judges``."""
    if mutant.symbol not in judges:
        spec = objects[mutant.symbol].spec
        judges[mutant.symbol] = judge_of(spec, np.random.default_rng(seed))
        _with_bf16(objects, judges[mutant.symbol], spec)
    return judges[mutant.symbol]


def _append(results: Path | None, mutant: Mutant, outcome: str, objects: dict) -> None:
    """One JSON line for ``mutant``'s verdict, in a single short write: appends from several
    shards' processes interleave whole lines."""
    if results is not None:
        row = {**dataclasses.asdict(mutant), "verdict": outcome,
               "isa": text_hash(objects[mutant.symbol].isa)}
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")


def report(results: list) -> list[dict]:
    """One row per (kernel family, kind) and a total: counts and the kill rate."""
    counts: dict[tuple[str, str], Counter] = {}
    for mutant, outcome in results:
        counts.setdefault((family(mutant.symbol), mutant.kind), Counter())[outcome] += 1
    total = sum(counts.values(), Counter())
    rows = []
    for (name, kind), c in [*sorted(counts.items()), (("all", "all"), total)]:
        judged = c["killed"] + c["survived"]
        rate = c["killed"] / judged if judged else 1.0
        rows.append({"family": name, "kind": kind, "mutants": sum(c.values()),
                     "killed": c["killed"], "equivalent": c["equivalent"],
                     "survived": c["survived"], "kill_rate": round(rate, 4)})
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernel-dir", type=Path, help="a prebuilt gfx950 folder (default: "
                        "build every specialization now, with a fresh cache)")
    parser.add_argument("--kernels", default=".", help="regex over kernel symbols")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of "
                        + "/".join(KINDS))
    parser.add_argument("--per-kind", type=int, default=None,
                        help="sample at most this many mutants per kernel and kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard", default="0/1", help="K/N: judge every N-th mutant from the "
                        "K-th (run N processes on one --results file, then once without)")
    parser.add_argument("--results", type=Path, help="a JSON-lines file of verdicts: those in it "
                        "(for the same kernel text) are not run again, new ones are appended")
    parser.add_argument("--recorded-only", action="store_true", help="judge nothing: the table "
                        "of the verdicts --results holds for the selection (a partial run)")
    parser.add_argument("--json", action="store_true", help="one JSON object as the last line")
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"--kinds: unknown {sorted(unknown)}; choose from {KINDS}")
    objects = build(args.kernel_dir)
    symbols = sorted(s for s in objects if re.search(args.kernels, s))
    if not symbols:
        parser.error(f"--kernels {args.kernels!r} matches none of {sorted(objects)}")
    try:
        shard = tuple(int(x) for x in args.shard.split("/"))
        if len(shard) != 2 or not 0 <= shard[0] < shard[1]:
            raise ValueError
    except ValueError:
        parser.error(f"--shard: {args.shard!r} is not K/N with 0 <= K < N")
    chosen = choose(objects, symbols, kinds, args.per_kind, args.seed, shard)
    if args.recorded_only:
        done = recorded(args.results, objects)
        results = [(m, done[m.key]) for m in chosen if m.key in done]
        print(f"recorded verdicts: {len(results)} of the {len(chosen)} mutants selected")
    else:
        results = run(objects, chosen, args.seed, args.results)
    rows = report(results)
    print("family | kind | mutants | killed | equivalent | survived | kill rate")
    for r in rows:
        print(f"{r['family']} | {r['kind']} | {r['mutants']} | {r['killed']} | "
              f"{r['equivalent']} | {r['survived']} | {100 * r['kill_rate']:.1f} %")
    survivors = [m for m, outcome in results if outcome == "survived"]
    for m in survivors:
        print(f"survived: {m.symbol}:{m.line} {m.kind}: {m.before.strip()} -> {m.after.strip()}")
    if args.json:
        print(json.dumps({"rows": rows, "survivors": [dataclasses.asdict(m) for m in survivors]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
