"""The machine state of a batch of waves: register files, EXEC, SCC, LDS, scratch, and the
bookkeeping of the fault model (definedness, loads in flight, LDS access epochs).

Layout, chosen so that one instruction runs for every selected wave at once:

* ``v``: uint32 ``[vgpr_file, W, 64]`` — the unified VGPR file (ArchVGPRs, then AGPRs at
  ``accum_offset``) of W waves; ``v[r]`` is the ``[W, 64]`` plane of register r.
* ``s``: uint32 ``[128, W]`` — SGPRs in hardware encoding order (VCC at 106, M0 at 124, EXEC
  at 126); ``scc``: bool ``[W]``.
* ``exec``: bool ``[W, 64]`` mirror of s[126:128], refreshed whenever EXEC is written.
* ``lds``: uint8 ``[workgroups, lds_bytes]``; ``scratch``: uint8 ``[W, 64, private_bytes]``.

A wave selector ``w`` is either :data:`ALL` (every wave: numpy basic slicing, no copies) or an
int array of wave indices.

Definedness: ``vdef`` (bool, like ``v``) and ``sdef`` (bool ``[128, W]``) say which lanes'
registers hold a written value; ``v_undef``/``s_undef`` are Python sets of register numbers
that may be undefined somewhere, so instructions whose sources are all outside them skip the
per-lane bookkeeping. ``sdef`` is kept per bit (uint32 masks of defined bits), so that lane
masks combined with ``s_and_b64`` stay defined where one operand's defined zeros decide them.
"""

from __future__ import annotations

import numpy as np

from .errors import EmulatorFault
from .operands import EXEC, SGPR_FILE

ALL = slice(None)
LANES = 64
FULL = np.uint32(0xFFFFFFFF)
LANE_BITS = (np.uint64(1) << np.arange(64, dtype=np.uint64))


def mask_to_bits(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bool ``[n, 64]`` lane masks to (lo, hi) uint32 ``[n]`` halves of the 64-bit mask."""
    packed = np.packbits(np.ascontiguousarray(mask, dtype=bool), axis=-1, bitorder="little")
    words = np.ascontiguousarray(packed).view(np.uint32)
    return words[..., 0], words[..., 1]


def bits_to_mask(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """(lo, hi) uint32 ``[n]`` halves to a bool ``[n, 64]`` lane mask."""
    words = np.stack([np.asarray(lo, np.uint32), np.asarray(hi, np.uint32)], axis=-1)
    return np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little").astype(bool)


class Machine:
    """State of ``waves`` waves (``workgroups`` workgroups of ``waves_per_group`` each)."""

    def __init__(self, *, waves: int, vgprs: int, workgroups: int, waves_per_group: int,
                 lds_bytes: int, private_bytes: int, checks: frozenset[str]):
        self.W = waves
        self.NV = vgprs
        self.v = np.zeros((vgprs, waves, LANES), np.uint32)
        self.s = np.zeros((SGPR_FILE, waves), np.uint32)
        self.scc = np.zeros(waves, bool)
        self.exec = np.zeros((waves, LANES), bool)
        self.full = np.zeros(waves, bool)
        self.all_full = False
        self.mode = np.zeros(waves, np.uint32)
        self.pc = np.zeros(waves, np.int64)
        self.ended = np.zeros(waves, bool)
        self.waiting = np.zeros(waves, bool)
        self.wave_group = np.repeat(np.arange(workgroups), waves_per_group)[:waves]
        self.wave_in_group = np.tile(np.arange(waves_per_group), workgroups)[:waves]
        self.groups = workgroups
        self.waves_per_group = waves_per_group
        self.lds_bytes = lds_bytes
        # rows padded to 16 bytes so that aligned accesses can use 4-byte cells
        self.lds = np.zeros((workgroups, -(-max(lds_bytes, 1) // 16) * 16), np.uint8)
        self.private_bytes = private_bytes
        self.scratch = (np.zeros((waves, LANES, private_bytes), np.uint8)
                        if private_bytes else None)
        self.checks = checks
        self._full_of = None
        self._full = False
        self.live_selection = None  # the index array the scheduler uses for all live waves
        self.trace = None  # a trace.Trace while a traced launch runs
        self.check_undefined = "undefined" in checks
        self.check_waitcnt = "waitcnt" in checks
        self.check_races = "lds-race" in checks and waves_per_group > 1
        # definedness
        self.vdef = np.zeros((vgprs, waves, LANES), bool) if self.check_undefined else None
        self.sdef = np.zeros((SGPR_FILE, waves), np.uint32) if self.check_undefined else None
        self.scc_def = np.zeros(waves, bool)
        self.v_undef: set[int] = set(range(vgprs)) if self.check_undefined else set()
        # per 16-bit half, where a word write left one half of a lane defined (half_defined)
        self.vhalf: dict[int, np.ndarray] = {}
        self.s_undef: set[int] = set(range(SGPR_FILE)) if self.check_undefined else set()
        self.lds_def = (np.zeros_like(self.lds, dtype=bool) if self.check_undefined else None)
        self.scratch_def = (np.zeros_like(self.scratch, dtype=bool)
                            if self.check_undefined and self.scratch is not None else None)
        # loads in flight (see waitcnt.py)
        self.queue: list = []
        self.outstanding = {"vm": np.zeros(waves, np.int64), "lgkm": np.zeros(waves, np.int64)}
        self.pending_v: set[int] = set()
        self.pending_s: set[int] = set()
        self.pending_lds = False  # an LDS DMA load is in flight (waitcnt.check_lds)
        # LDS race bookkeeping (see memory_ops.py)
        self.epoch = np.zeros(workgroups, np.int32)
        if self.check_races:
            shape = self.lds.shape
            # per LDS byte: (epoch << 4) | wave of the last write, (epoch << 16) | mask of
            # the waves that read it in that epoch; -1: never
            self.lds_write_info = np.full(shape, -1, np.int64)
            self.lds_read_info = np.full(shape, -1, np.int64)
        # statistics (bytes; see profile.py)
        self.stats = {"global_read": 0, "global_written": 0, "smem_bytes": 0, "lds_read": 0,
                      "lds_written": 0, "scratch_read": 0, "scratch_written": 0}

    # ---- EXEC ------------------------------------------------------------------------------
    def sync_exec(self, w) -> None:
        """Refresh the EXEC mirror of waves ``w`` after s[126:128] changed."""
        mask = bits_to_mask(self.s[EXEC][w], self.s[EXEC + 1][w])
        self.exec[w] = mask
        self.full[w] = mask.all(axis=1)
        self.all_full = bool(self.full[~self.ended].all())
        self._full_of = None

    def all_active(self, w) -> bool:
        """Whether every lane of every wave in ``w`` is active (cached per selection object:
        the scheduler passes the same ``w`` for a run of instructions)."""
        if w is ALL:
            return self.all_full
        if self._full_of is not w:
            self._full_of = w
            self._full = bool(self.full[w].all())
        return self._full

    def covers_live(self, w) -> bool:
        """Whether ``w`` selects every wave that has not ended (a write by ``w`` with the full
        EXEC then defines a register everywhere that matters)."""
        return w is ALL or w is self.live_selection

    # ---- VGPR writes -------------------------------------------------------------------------
    def write_v(self, w, r: int, value, mask=None) -> None:
        """Write ``value`` (uint32, broadcastable to [n, 64]) to VGPR r of the active lanes of
        waves ``w`` (``mask``: an extra per-lane write mask, combined with EXEC)."""
        plane = self.v[r]
        if mask is None and self.all_active(w):
            plane[w] = value
            if self.check_undefined and r in self.v_undef:
                self.vdef[r][w] = True
                if self.covers_live(w):
                    self.v_undef.discard(r)
            return
        m = self.exec[w] if mask is None else (self.exec[w] & mask)
        track = self.check_undefined and r in self.v_undef
        if w is ALL:
            np.copyto(plane, value, where=m)
            if track:
                self.vdef[r] |= m
        else:
            plane[w] = np.where(m, value, plane[w])
            if track:
                self.vdef[r][w] = self.vdef[r][w] | m
        if track and self.vdef[r].all():
            self.v_undef.discard(r)

    def write_v_def(self, w, r: int, defined, mask=None) -> None:
        """Set the definedness of VGPR r's active lanes to ``defined`` (bool [n, 64])."""
        m = self.exec[w] if mask is None else (self.exec[w] & mask)
        plane = self.vdef[r]
        if w is ALL:
            np.copyto(plane, defined, where=m)
        else:
            plane[w] = np.where(m, defined, plane[w])
        self.forget_halves(w, r, m)
        if plane.all():
            self.v_undef.discard(r)
        else:
            self.v_undef.add(r)

    # Per-half definedness. ``vdef`` is per lane; a word write (``v_cvt_pk_fp8_f32`` with its
    # destination-word select keeps the other 16 bits) can leave one half of a lane defined
    # and the other not, and a later word write of the other half, or a read of the defined
    # half alone, must see that. ``vhalf[r]`` (uint8 [W, 64]: bit 0 the low half defined, bit
    # 1 the high half) holds it where ``vdef[r]`` is False; every path that makes a lane of
    # ``vdef`` False (write_v_def, forget_halves) clears the lane's bits first, so stale bits
    # never count (the other paths only make lanes defined, which overrides them).
    def forget_halves(self, w, r: int, lanes=None) -> None:
        """Drop the half bits of VGPR r's ``lanes`` (bool [n, 64]; None: all) of waves w."""
        codes = self.vhalf.get(r)
        if codes is None:
            return
        if lanes is None:
            codes[w] = 0
        else:
            codes[w] = np.where(lanes, np.uint8(0), codes[w])

    def half_defined(self, w, r: int, half: int) -> np.ndarray:
        """bool [n, 64] (a new array): whether bits ``16*half .. 16*half+15`` of VGPR r are
        defined in each lane of waves w."""
        d = self.vdef[r][w].copy()
        codes = self.vhalf.get(r)
        if codes is not None:
            d |= ((codes[w] >> np.uint8(half)) & np.uint8(1)).astype(bool)
        return d

    def write_half_def(self, w, r: int, lo, hi) -> None:
        """Definedness of VGPR r's active lanes after a word write: ``lo`` / ``hi`` (bool
        [n, 64]) for its low and high 16 bits."""
        lo, hi = np.broadcast_to(lo, self.exec[w].shape), np.broadcast_to(hi, self.exec[w].shape)
        self.write_v_def(w, r, lo & hi)
        if (lo & hi).all() and r not in self.vhalf:
            return
        codes = self.vhalf.setdefault(r, np.zeros(self.vdef.shape[1:], np.uint8))
        bits = lo.astype(np.uint8) | (hi.astype(np.uint8) << np.uint8(1))
        codes[w] = np.where(self.exec[w], bits, codes[w])

    # ---- SGPR writes -------------------------------------------------------------------------
    def write_s(self, w, r: int, value, defined=None) -> None:
        """Write SGPR r of waves ``w``; ``defined``: uint32 mask of its defined bits (None:
        all defined)."""
        self.s[r][w] = value
        if self.check_undefined:
            if defined is None:
                if r in self.s_undef:
                    self.sdef[r][w] = FULL
                    if self.covers_live(w) or bool((self.sdef[r] == FULL).all()):
                        self.s_undef.discard(r)
            else:
                self.sdef[r][w] = defined
                if np.all(self.sdef[r] == FULL):
                    self.s_undef.discard(r)
                else:
                    self.s_undef.add(r)
        if r == EXEC or r == EXEC + 1:
            self.sync_exec(w)

    def end_waves(self, w) -> None:
        """Mark waves ended; their registers count as defined from now on."""
        self.ended[w] = True
        self.live_selection = None
        self.all_full = bool(self.full[~self.ended].all()) if not self.ended.all() else True
        if self.check_undefined:
            self.vdef[:, w] = True
            self.sdef[:, w] = FULL

    def fault_context(self, inst, w, lane=None, address=None, wave_index=None):
        """Location fields for an EmulatorFault raised while executing ``inst``."""
        wave = int(np.arange(self.W)[w][0] if wave_index is None else wave_index)
        return dict(instruction=inst.text, line=inst.line, pc=inst.pc,
                    wave=self.global_wave(wave), workgroup=self.group_id(wave), lane=lane,
                    address=address)

    # The launch fills these in (global numbering across chunks).
    wave_base = 0
    group_ids: np.ndarray | None = None

    def global_wave(self, wave: int) -> int:
        return int(self.wave_base + wave)

    def group_id(self, wave: int) -> tuple[int, int, int] | None:
        if self.group_ids is None:
            return None
        return tuple(int(x) for x in self.group_ids[self.wave_group[wave]])

    def fault(self, kind, message, inst, w, lane=None, address=None, wave_index=None):
        return EmulatorFault(kind, message, **self.fault_context(inst, w, lane, address,
                                                                 wave_index))
