"""FlyDSL kernel: block scores of query rows over the MXFP4 index cache (SPEC §4, §4.1, §5, §9.2).

``out[h, t, j] = fp32(max over live tokens k of Qe[t, h] . K[page(t, j), k]) * score_scale``
with ``-inf`` where no token is live. One scaled MFMA per 16 tokens:
``v_mfma_scale_f32_16x16x128_f8f6f4`` with **K as the fp4 A operand** (cbsz 4) and its e8m0
byte as the A scale, **Q as the e4m3 B operand** (blgp 0) with B scale 127 (1.0). A bf16 Q is
rounded to e4m3 in-kernel (saturating nearest-even, SPEC §1.5, §5.1).

Work split (4 waves of 64 lanes per workgroup):

* a wave owns one column tile of 16 (row, head) columns (``16 / H`` rows times ``H`` heads)
  and 4 consecutive blocks; the workgroup covers ``rows x blocks`` =
  :func:`.abi.index_scores_tile` — prefill tiling: 4 column tiles share each page
  (64 rows at H = 1), decode tiling: one column tile, 4 waves on different blocks;
* the workgroup takes ``tile_rows`` rows (:func:`.abi.index_scores_tile_rows`: the full tile
  for prefill, the rows of one request for decode) and walks their distinct requests
  ("segments"); columns of other requests are masked, so any row order is correct (repeats of
  a request recompute identical values);
* prefill tiling: every page a segment needs is staged **still MXFP4** in LDS (8704 bytes per
  page) by global-to-LDS DMA (``global_load_lds_dwordx4``, 1 KiB a wave instruction), double
  buffered (page u + 1 in flight while page u is scored, one barrier a page), then read
  back as the A operand by the 4 column tiles;
* decode tiling (``_segment_direct``): a wave reads its own 4 pages straight from global
  memory into the A operand, all page loads issued before the first MFMA, no LDS and no
  barrier; a page no live column reaches is not read (a wave-uniform branch);
* either way lane (g, i) holds token i's bytes 16g..16g+15 and its scale byte g;
* the causal mask is ``j*128 + k <= position``; pages past every row's reach are not loaded;
  a page id outside ``[0, P)``, a padding row or a request outside ``[0, B)`` scores ``-inf``;
  a live token whose logit is not finite (a scale byte 255 in any of its groups, a NaN query
  element, an overflow) makes the score NaN (SPEC §9.2);
* per column the 4 block maxima are reduced across the 4 lane groups and stored merged: the
  4 lanes of a column write 4 consecutive floats (16 contiguous bytes of the output row).

Accumulator layout assumed (16x16 MFMA): lane ``l`` holds ``D[4*(l//16) + v][l % 16]``.
Kernarg layout: :data:`ARGS` below (the one declaration). Grid: :func:`.abi.grid`.
"""

from __future__ import annotations

import functools

from jax_mxfp4._src.core.formats import PAGE_BYTES
from jax_mxfp4._src.core.formats import PAGE_SCALE_OFFSET as SCALE_OFFSET
from jax_mxfp4._src.flydsl import _ir as ir
from jax_mxfp4._src.flydsl import _numerics as numerics
from jax_mxfp4._src.flydsl._signature import jit_launcher
from jax_mxfp4._src.flydsl.abi import (
    BLOCK_THREADS,
    BLOCKS_PER_WAVE,
    TILINGS,
    Arg,
    Specialization,
    index_scores_tile,
)

ARGS = (
    Arg("q", "pointer", "bf16|e4m3[T, H, 128] index queries"),
    Arg("index_pool", "pointer", "u8[P, 8704] MXFP4 index-key pages"),
    Arg("block_table", "pointer", "s32[B, W] logical block -> page"),
    Arg("positions", "pointer", "s32[T] absolute position of each row, -1 = padding"),
    Arg("requests", "pointer", "s32[T] request of each row"),
    Arg("out", "pointer", "f32[H, T, NB] scores (every element written)"),
    Arg("num_rows", "i32", "T"),
    Arg("num_pages", "i32", "P"),
    Arg("num_requests", "i32", "B"),
    Arg("table_width", "i32", "W (>= NB)"),
    Arg("num_blocks", "i32", "NB"),
    Arg("tile_rows", "i32", "rows per workgroup (abi.index_scores_tile_rows)"),
    Arg("score_scale", "f32", "fp32(sm_scale * 1.4426950409)"),
)

THREADS = BLOCK_THREADS["index_scores"]


class _Geometry:
    """Compile-time shape of one specialization."""

    def __init__(self, spec: Specialization) -> None:
        self.q = spec.q
        self.heads = spec.heads
        self.col_tiles, self.block_waves = TILINGS[spec.tiling]
        self.rows, self.blocks = index_scores_tile(spec)
        self.rows_per_tile = 16 // spec.heads
        # decode: each wave reads its pages from global memory into the MFMA operands itself;
        # prefill: the waves share pages staged in LDS, then the row keys
        self.direct = spec.tiling == "decode"
        self.keys_offset = 0 if self.direct else 2 * PAGE_BYTES  # two page buffers
        assert self.direct or self.block_waves == 1, "the staged path shares one page"


def _lane_setup(g: _Geometry, a) -> ir.LaneContext:
    c = ir.lane_context()
    c.col_tile = ir.srem(c.wave, ir.ci32(g.col_tiles))
    c.bwave = ir.sdiv(c.wave, ir.ci32(g.col_tiles))
    c.row0 = ir.mul(ir.block_id("x"), a.tile_rows)
    c.jstep = ir.mul(ir.block_id("y"), ir.ci32(g.blocks))
    c.head = ir.srem(c.col, ir.ci32(g.heads))
    local = ir.add(ir.mul(c.col_tile, ir.ci32(g.rows_per_tile)), ir.sdiv(c.col, ir.ci32(g.heads)))
    c.t = ir.add(c.row0, local)
    c.in_tile = ir.lt(local, a.tile_rows)
    c.t_ok = ir.land(c.in_tile, ir.lt(c.t, a.num_rows))
    c.t_safe = ir.select(c.t_ok, c.t, ir.ci32(0))
    pos = _load_i32(a.positions, c.t_safe)
    req = _load_i32(a.requests, c.t_safe)
    live = ir.land(c.t_ok, ir.land(ir.ge(pos, ir.ci32(0)),
                                   ir.land(ir.ge(req, ir.ci32(0)), ir.lt(req, a.num_requests))))
    c.pos = pos
    c.key = ir.select(live, req, ir.ci32(-1))
    c.dead = ir.land(c.t_ok, ir.lnot(live))
    return c


def _load_i32(arg, index):
    return ir.load(ir.i32(), ir.global_ptr(arg), ir.mul(ir.zext64(index), ir.ci64(4)), align=4)


def _publish_row_keys(g: _Geometry, c: ir.LaneContext, lds) -> None:
    """Each row's (request if live else -1, position if live else -1) into the LDS table
    after the staged pages, written once per row by the lane that loaded it in
    ``_lane_setup``: the row loops then read it from LDS instead of a dependent pair of global
    loads per row (a round trip to memory each). The caller's barrier makes it visible."""
    first_lane_of_row = ir.land(ir.land(ir.eq(c.grp, ir.ci32(0)), ir.eq(c.head, ir.ci32(0))),
                                ir.eq(c.bwave, ir.ci32(0)))
    with ir.when(ir.land(first_lane_of_row, c.in_tile)):
        at = ir.add(ir.ci32(g.keys_offset), ir.mul(ir.sub(c.t, c.row0), ir.ci32(8)))
        live = ir.ne(c.key, ir.ci32(-1))
        ir.store(c.key, lds, at, align=4)
        ir.store(ir.select(live, c.pos, ir.ci32(-1)), lds, ir.add(at, ir.ci32(4)), align=4)


def _lane_rows(g: _Geometry, a, c: ir.LaneContext, lds):
    """(key, position) of the workgroup's row ``l`` in lane ``l`` of every wave (``-1, -1``
    in lanes past ``tile_rows``), read once from the LDS table of ``_publish_row_keys``: the
    segment walk and the reach then cost a few wave operations, not a scalar loop over the
    rows."""
    row = ir.smin(c.lane, ir.ci32(g.rows - 1))
    at = ir.add(ir.ci32(g.keys_offset), ir.mul(row, ir.ci32(8)))
    mine = ir.lt(c.lane, a.tile_rows)
    key = ir.load(ir.i32(), lds, at, align=4)
    pos = ir.load(ir.i32(), lds, ir.add(at, ir.ci32(4)), align=4)
    return ir.select(mine, key, ir.ci32(-1)), ir.select(mine, pos, ir.ci32(-1))


def _max_position(c: ir.LaneContext, row_pos):
    """Largest live position among the workgroup's rows (-1 if none; ``row_pos`` of
    :func:`_lane_rows`), uniform: a butterfly over the wave's lanes."""
    best = row_pos
    for mask in (1, 2, 4, 8, 16, 32):
        other = ir.f32_bits(ir.lane_xor_f32(ir.f32_from_bits(best), c.lane, mask))
        best = ir.smax(best, other)
    return ir.uniform(best)


def _walk_segments(row_key, score) -> None:
    """``score(key)`` once for each distinct live request among the workgroup's rows
    (``row_key`` of :func:`_lane_rows`; every wave walks the same keys in the same order, so
    the walk is workgroup-uniform): take the lowest pending lane's key, score it, clear every
    lane holding it."""
    def pending_lanes(carried):
        return ir.ballot(ir.ne(carried[0], ir.ci32(0)))

    def step(carried):
        key = ir.read_lane(row_key, ir.first_lane(pending_lanes(carried)))
        score(key)
        return [ir.select(ir.eq(row_key, key), ir.ci32(0), carried[0])]

    pending = ir.select(ir.ge(row_key, ir.ci32(0)), ir.ci32(1), ir.ci32(0))
    ir.while_loop([pending], lambda carried: ir.ne(pending_lanes(carried), ir.ci64(0)), step)


def _query_operand(g: _Geometry, a, c: ir.LaneContext):
    """This lane's e4m3 B operand: column (t, h), K elements 16g..16g+15 then 64+16g..+15."""
    elem = ir.mul(ir.add(ir.mul(ir.zext64(c.t_safe), ir.ci64(g.heads)), ir.zext64(c.head)),
                  ir.ci64(128))
    first = ir.zext64(ir.mul(c.grp, ir.ci32(16)))
    words = []
    for half in range(2):
        start = ir.add(elem, ir.add(first, ir.ci64(64 * half)))
        if g.q == "e4m3":
            chunk = ir.load(ir.vec(4, ir.i32()), ir.global_ptr(a.q), start, align=16)
            words += [ir.extract(chunk, e) for e in range(4)]
        else:
            bf = []
            for k in range(2):
                at = ir.add(ir.mul(start, ir.ci64(2)), ir.ci64(16 * k))
                chunk = ir.load(ir.vec(4, ir.i32()), ir.global_ptr(a.q), at, align=16)
                bf += [ir.extract(chunk, e) for e in range(4)]
            words += numerics.pack_e4m3(numerics.bf16_words_to_f32(bf))
    return ir.from_elements(ir.vec(8, ir.i32()), words)


def _page_of(a, key, j):
    """(page id, page usable) of block ``j`` of request ``key`` (uniform)."""
    inside = ir.lt(j, a.num_blocks)
    column = ir.zext64(ir.select(inside, j, ir.ci32(0)))
    at = ir.add(ir.mul(ir.zext64(key), ir.zext64(a.table_width)), column)
    page = ir.uniform(ir.load(ir.i32(), ir.global_ptr(a.block_table), ir.mul(at, ir.ci64(4)),
                              align=4))
    ok = ir.land(inside, ir.land(ir.ge(page, ir.ci32(0)), ir.lt(page, a.num_pages)))
    return page, ok


DMA_CHUNK = 64 * 16  # bytes one wave's global-to-LDS DMA instruction moves
PAGE_DMA_CHUNKS = -(-PAGE_BYTES // DMA_CHUNK)  # 9: the last one half full
WAVES = THREADS // 64


def _dma_page(a, c: ir.LaneContext, lds, page, wanted, lds_base: int, scope: dict) -> None:
    """Start copying page ``page`` into LDS at ``lds_base``, MXFP4 as stored, by
    global-to-LDS DMA (wave ``w`` takes 1 KiB chunks ``w, w + 4, ..``), when ``wanted``
    (uniform). The copy is complete for the whole workgroup once every wave has waited for
    it and met at a barrier."""
    with ir.when(wanted):
        base = ir.mul(ir.zext64(page), ir.ci64(PAGE_BYTES))
        for first in range(0, PAGE_DMA_CHUNKS, WAVES):
            chunk = ir.add(ir.ci32(first), c.wave)
            at = ir.add(ir.mul(chunk, ir.ci32(DMA_CHUNK)), ir.mul(c.lane, ir.ci32(16)))
            lds_at = ir.add(ir.ci32(lds_base), ir.mul(chunk, ir.ci32(DMA_CHUNK)))
            if first + WAVES <= PAGE_DMA_CHUNKS - 1:  # every lane of every wave in the page
                ir.load_to_lds(ir.global_ptr(a.index_pool), ir.add(base, ir.zext64(at)), lds,
                               lds_at, scope=scope)
                continue
            with ir.when(ir.lt(at, ir.ci32(PAGE_BYTES))):
                ir.load_to_lds(ir.global_ptr(a.index_pool), ir.add(base, ir.zext64(at)), lds,
                               lds_at, scope=scope)


TOKEN_TILES = 8  # 16-token MFMA tiles per 128-token page


def _tile_types():
    """The MLIR types of one page's operands as :func:`_flat` lists them."""
    return [ir.vec(4, ir.i32())] * TOKEN_TILES + [ir.i32()] * TOKEN_TILES


def _flat(tiles) -> list:
    return [a4 for a4, _ in tiles] + [scale for _, scale in tiles]


def _unflat(values) -> list:
    return list(zip(values[:TOKEN_TILES], values[TOKEN_TILES:], strict=True))


def _page_tiles(ptr, base, c: ir.LaneContext, *, wide: bool, scope: dict | None = None) -> list:
    """One page's A operands at byte ``base`` of ``ptr`` (LDS or global): per 16-token tile
    ``m``, lane (g, i) takes token ``16m + i``'s data bytes ``16g..16g+15`` (a 4-dword
    vector) and its scale byte ``g`` (as i32). ``base`` is i32 for LDS, i64 (``wide``) for
    global memory."""
    widen = ir.zext64 if wide else (lambda v: v)
    tiles = []
    for m in range(TOKEN_TILES):
        token = ir.add(ir.ci32(16 * m), c.col)
        data_at = ir.add(ir.mul(token, ir.ci32(64)), ir.mul(c.grp, ir.ci32(16)))
        scale_at = ir.add(ir.ci32(SCALE_OFFSET), ir.add(ir.mul(token, ir.ci32(4)), c.grp))
        a4 = ir.load(ir.vec(4, ir.i32()), ptr, ir.add(base, widen(data_at)), align=16,
                     scope=scope)
        scale = ir.zext32(ir.load(ir.i8(), ptr, ir.add(base, widen(scale_at)), align=1,
                                  scope=scope))
        tiles.append((a4, scale))
    return tiles


def _global_page_tiles(a, c: ir.LaneContext, page, wanted) -> list:
    """:func:`_page_tiles` of index page ``page`` read from global memory when ``wanted``
    (wave-uniform: a scalar branch, so an unwanted page costs no traffic), zeros otherwise."""
    base = ir.mul(ir.zext64(page), ir.ci64(PAGE_BYTES))
    zeros = [ir.splat(ir.vec(4, ir.i32()), 0)] * TOKEN_TILES + [ir.ci32(0)] * TOKEN_TILES
    return _unflat(ir.branch(wanted, _tile_types(),
                             lambda: _flat(_page_tiles(ir.global_ptr(a.index_pool), base, c,
                                                        wide=True)),
                             lambda: zeros))


def _score_tiles(tiles, c: ir.LaneContext, b_operand, usable, limit):
    """Max over a page's live tokens (``k <= limit``, where ``usable``) of this lane's column,
    reduced over the lane groups: ``-inf`` with no live token, NaN when a live logit is not
    finite (SPEC §9.2: a scale byte 255 or a NaN query makes the MFMA's dot NaN, an overflow
    makes it ±inf).

    The logits are folded into NaN-propagating ``maximum`` and ``minimum`` (``v_maximum3`` /
    ``v_minimum3``): +inf and NaN show in the maximum, -inf in the minimum, so no per-token
    test is needed. When every usable lane of the wave sees the whole page live (a
    wave-uniform branch: every page of a decode row but its last, every page below a prefill
    tile's diagonal) the logits enter as they are; otherwise each is first replaced by
    ``-FLT_MAX`` past ``limit`` (a finite fill that changes neither the maximum of the live
    logits, nor, when one is live, whether the minimum is -inf)."""
    limit = ir.select(usable, limit, ir.ci32(-1))
    logits = [ir.mfma_scale_16x16x128(ir.widen_to_8_dwords(a4), b_operand, ir.zeros_f32x4(),
                                      fmt_a=ir.FMT_FP4_E2M1, fmt_b=ir.FMT_FP8_E4M3,
                                      scale_a=scale, scale_b=ir.ci32(127))
              for a4, scale in tiles]

    def fold(masked: bool):
        high, low = ir.cf32(ir.NEG_INF), ir.cf32(float("inf"))
        # token 16m + 4g + v of the page is element v of tile m's accumulator in lane group g:
        # live iff 16m + v <= limit - 4g (a constant against one value a lane, not a token
        # index a lane per element, which LLVM hoists out of the loops into 32 VGPRs)
        reach = ir.sub(limit, ir.mul(c.grp, ir.ci32(4)))
        for m, d in enumerate(logits):
            for v in range(4):
                logit = ir.extract(d, v)
                if masked:
                    live = ir.le(ir.ci32(16 * m + v), reach)
                    logit = ir.select(live, logit, ir.cf32(-ir.FLT_MAX))
                high, low = ir.fmax_nan(high, logit), ir.fmin_nan(low, logit)
        return [high, low]

    whole = ir.all_lanes(ir.lor(ir.lnot(usable), ir.ge(limit, ir.ci32(127))))
    high, low = ir.branch(whole, [ir.f32(), ir.f32()], lambda: fold(False), lambda: fold(True))
    for mask in (16, 32):
        high = ir.fmax_nan(high, ir.lane_xor_f32(high, c.lane, mask))
        low = ir.fmin_nan(low, ir.lane_xor_f32(low, c.lane, mask))
    poisoned = ir.lor(ir.not_finite(high), ir.eq(ir.f32_bits(low), ir.ci32(0xFF800000)))
    best = ir.select(poisoned, ir.cf32(float("nan")), high)
    return ir.select(ir.ge(limit, ir.ci32(0)), best, ir.cf32(ir.NEG_INF))


def _limit(c: ir.LaneContext, j):
    """Token ``k`` of block ``j`` is live for this lane's row iff ``k <= limit``."""
    return ir.sub(c.pos, ir.mul(j, ir.ci32(128)))


def _store_scores(g: _Geometry, a, c: ir.LaneContext, values, mask) -> None:
    """Lane (g, i) stores ``values[g]`` for block ``jstep + 4*bwave + g`` of its column."""
    value = values[0]
    for k in range(1, BLOCKS_PER_WAVE):
        value = ir.select(ir.eq(c.grp, ir.ci32(k)), values[k], value)
    j = ir.add(c.jstep, ir.add(ir.mul(c.bwave, ir.ci32(BLOCKS_PER_WAVE)), c.grp))
    with ir.when(ir.land(mask, ir.lt(j, a.num_blocks))):
        row = ir.add(ir.mul(ir.zext64(c.head), ir.zext64(a.num_rows)), ir.zext64(c.t))
        at = ir.add(ir.mul(row, ir.zext64(a.num_blocks)), ir.zext64(j))
        ir.store(value, ir.global_ptr(a.out), ir.mul(at, ir.ci64(4)), align=4)


def _wave_block(c: ir.LaneContext, u: int):
    """Block ``u`` of this wave's ``BLOCKS_PER_WAVE`` consecutive blocks (uniform)."""
    return ir.add(c.jstep, ir.add(ir.mul(c.bwave, ir.ci32(BLOCKS_PER_WAVE)), ir.ci32(u)))


def _step_pages(a, c: ir.LaneContext, key, maxpos) -> list:
    """``(block, page id, page usable, page wanted)`` of this wave's ``BLOCKS_PER_WAVE``
    blocks of request ``key``, all uniform; wanted: usable and reached by a row (``maxpos``).
    Both tilings look every table entry up before their first page load."""
    out = []
    for u in range(BLOCKS_PER_WAVE):
        j = _wave_block(c, u)
        page, ok = _page_of(a, key, j)
        out.append((j, page, ok, ir.land(ok, ir.le(ir.mul(j, ir.ci32(128)), maxpos))))
    return out


def _segment_staged(g: _Geometry, a, c: ir.LaneContext, lds, b_operand, key, maxpos) -> None:
    """Prefill tiling: score this step's blocks for the columns of request ``key``, each page
    staged in LDS once for the workgroup's column tiles, double buffered: page ``u + 1``'s
    DMA is in flight while the waves score page ``u``, one barrier a page (LLVM waits for
    every memory operation before an ``s_barrier`` on gfx950, so a DMA cannot stay in flight
    across one). The table entries are looked up first: a lookup's wait would otherwise also
    wait for every DMA before it."""
    owned = ir.eq(c.key, key)
    buffers = (0, PAGE_BYTES)
    scopes = ir.AliasScopes(2, "index page buffers")
    pages = _step_pages(a, c, key, maxpos)

    def start(u):
        _, page, _, wanted = pages[u]
        _dma_page(a, c, lds, page, wanted, buffers[u % 2], scopes.scope(u % 2))

    start(0)
    ir.wait_vmcnt(0)
    ir.barrier()
    maxima = []
    for u, (j, _, ok, _) in enumerate(pages):
        if u + 1 < BLOCKS_PER_WAVE:  # into the buffer page u - 1 left (read before the barrier)
            start(u + 1)
        tiles = _page_tiles(lds, ir.ci32(buffers[u % 2]), c, wide=False,
                            scope=scopes.scope(u % 2))
        best = _score_tiles(tiles, c, b_operand, ir.land(owned, ok), _limit(c, j))
        maxima.append(ir.fmul(best, a.score_scale))
        ir.wait_vmcnt(0)  # page u + 1 copied, by this wave; by every wave after the barrier
        ir.barrier()
    _store_scores(g, a, c, maxima, owned)


def _segment_direct(g: _Geometry, a, c: ir.LaneContext, b_operand, key, maxpos) -> None:
    """Decode tiling: each wave scores its own blocks for the columns of request ``key``,
    reading the pages straight into its MFMA operands (no LDS, no barrier). The table entries
    are looked up first, then every wanted page's loads are issued before the first MFMA, so
    a wave has its whole share of pages in flight at once."""
    owned = ir.eq(c.key, key)
    pages = _step_pages(a, c, key, maxpos)
    staged = [_global_page_tiles(a, c, page, wanted) for _, page, _, wanted in pages]
    maxima = []
    for (j, _, ok, _), tiles in zip(pages, staged, strict=True):
        best = _score_tiles(tiles, c, b_operand, ir.land(owned, ok), _limit(c, j))
        maxima.append(ir.fmul(best, a.score_scale))
    _store_scores(g, a, c, maxima, owned)


def _body(g: _Geometry, a) -> None:
    lds = ir.lds_alloc(g.keys_offset + g.rows * 8)
    c = _lane_setup(g, a)
    _publish_row_keys(g, c, lds)
    ir.barrier()
    row_key, row_pos = _lane_rows(g, a, c, lds)
    maxpos = _max_position(c, row_pos)
    reach = ir.le(ir.mul(c.jstep, ir.ci32(128)), maxpos)
    neg = [ir.cf32(ir.NEG_INF)] * BLOCKS_PER_WAVE
    _store_scores(g, a, c, neg, ir.land(c.t_ok, ir.lor(c.dead, ir.lnot(reach))))
    with ir.when(reach):
        b_operand = _query_operand(g, a, c)

        def score(key):
            if g.direct:
                _segment_direct(g, a, c, b_operand, key, maxpos)
            else:
                _segment_staged(g, a, c, lds, b_operand, key, maxpos)

        _walk_segments(row_key, score)


def build(spec: Specialization):
    """The ``@flyc.jit`` launcher of one index_scores specialization."""
    assert spec.op == "index_scores"
    return jit_launcher(spec.symbol, ARGS, functools.partial(_body, _Geometry(spec)), THREADS)
