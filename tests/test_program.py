"""Programs and the builder: allocation, element addresses, token folding, FINISH, files and errors."""
from __future__ import annotations

import numpy as np
import pytest

from vta import fsim
from vta.config import MEM_ACC, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from vta.isa import ALU_ADD, EncodeError, Finish, Gemm, Load, Store, Uop, decode_uops, encode_stream
from vta.program import Allocation, Program, ProgramBuilder


def _flags(insn) -> str:
    return "".join(name for name, flag in (("p", insn.pop_prev), ("n", insn.pop_next), ("P", insn.push_prev),
                                           ("N", insn.push_next)) if flag) or "-"


def _summary(program: Program) -> list[str]:
    """Each instruction as 'NAME:flags' (p pop_prev, n pop_next, P push_prev, N push_next; NOOP for x_size 0)."""
    out = []
    for insn in program.insns:
        name = type(insn).__name__.upper()
        if isinstance(insn, (Load, Store)) and insn.x_size == 0:
            name += "-NOOP"
        out.append(f"{name}:{_flags(insn)}")
    return out


# ---- allocation --------------------------------------------------------------------------------------------------
def test_alloc_aligns_and_fills(cfg):
    bld = ProgramBuilder(cfg)
    assert bld.default_align == 256  # the wgt element (16 x 16 int8) is the largest
    a = bld.alloc("a", np.arange(10, dtype=np.int8))
    b = bld.alloc("b", (3, 4), np.int32)
    c = bld.alloc("c", [1, 2, 3], np.int16, align=2)
    assert a == Allocation("a", 0, 10, (10,), "int8")
    assert b == Allocation("b", 256, 48, (3, 4), "int32")
    assert c == Allocation("c", 304, 6, (3,), "int16")
    prog = bld.finish()
    assert np.array_equal(prog.read("a"), np.arange(10))
    assert np.array_equal(prog.read("b"), np.zeros((3, 4)))
    assert prog.read("c").dtype == np.int16
    assert prog.dram[304:310].tolist() == [1, 0, 2, 0, 3, 0]  # little-endian


def test_elem_addr(cfg):
    bld = ProgramBuilder(cfg)
    bld.alloc("pad", (100,))
    x = bld.alloc("x", (1024,))
    assert x.offset == 256
    assert bld.elem_addr(x, MEM_WGT) == 1
    assert bld.elem_addr("x", MEM_INP, 32) == 18
    assert bld.elem_addr(x, MEM_ACC) == 4
    assert bld.elem_addr(x, MEM_UOP, 4) == 65
    with pytest.raises(ValueError, match=r"^byte 264 \(allocation 'x' \+ 8\) is not a multiple of the 16-byte inp "
                       r"element; align the allocation or the offset to 16 bytes$"):
        bld.elem_addr(x, MEM_INP, 8)


def test_alloc_errors(cfg):
    bld = ProgramBuilder(cfg)
    bld.alloc("a", 4)
    with pytest.raises(ValueError, match=r"^an allocation named 'a' already exists; choose another name$"):
        bld.alloc("a", 4)
    with pytest.raises(ValueError, match=r"^align must be a positive number of bytes, not 0$"):
        bld.alloc("b", 4, align=0)
    with pytest.raises(TypeError, match=r"^allocation data must be integers \(DRAM holds fixed-point values\), not "
                       r"float64$"):
        bld.alloc("c", np.zeros(3))
    with pytest.raises(ValueError, match=r"^a shape must be a tuple of non-negative integers, not \(2, -1\)$"):
        bld.alloc("d", (2, -1))
    with pytest.raises(KeyError, match=r"no allocation named 'zz'; known allocations: a"):
        bld.elem_addr("zz", MEM_INP)


def test_read_errors(cfg):
    prog = ProgramBuilder(cfg).finish()
    with pytest.raises(KeyError, match=r"the program has no allocation named 'out'; known allocations: none"):
        prog.read("out")


def test_uop_kernel_round_trip(cfg):
    bld = ProgramBuilder(cfg)
    k = bld.uop_kernel("k", [Uop(1, 2, 3), Uop(2047, 2047, 1023)])
    prog = bld.finish()
    words = prog.read("k")
    assert words.dtype == np.uint32
    dst, src, wgt = decode_uops(words, cfg)
    assert (dst.tolist(), src.tolist(), wgt.tolist()) == ([1, 2047], [2, 2047], [3, 1023])
    assert k.shape == (2,)


# ---- tokens ------------------------------------------------------------------------------------------------------
def test_push_folds_into_last_instruction_and_pop_into_next(cfg):
    bld = ProgramBuilder(cfg)
    bld.load(MEM_INP, sram_base=0, dram_base=0)
    bld.dep_push("load", "compute")
    bld.dep_pop("load", "compute")
    bld.gemm(uop_bgn=0, uop_end=1)
    bld.dep_push("compute", "store")
    bld.dep_pop("compute", "store")
    bld.store(sram_base=0, dram_base=0)
    prog = bld.finish()
    # FINISH waits on the store module: its push folds into the STORE, FINISH pops it.
    assert _summary(prog) == ["LOAD:N", "GEMM:pN", "STORE:pP", "FINISH:n"]


def test_noops_when_nothing_to_fold_into(cfg):
    bld = ProgramBuilder(cfg)
    bld.dep_push("compute", "load")  # compute has no instruction yet: token-only LOAD UOP
    bld.dep_pop("compute", "load")
    bld.dep_pop("compute", "load")  # a second pop while one is pending: the first goes into a token-only LOAD INP
    bld.load(MEM_WGT, sram_base=0, dram_base=0)
    prog = bld.finish()
    assert _summary(prog) == ["LOAD-NOOP:P", "LOAD-NOOP:n", "LOAD:n", "STORE-NOOP:P", "FINISH:n"]
    assert prog.insns[0].mem == MEM_UOP and prog.insns[1].mem == MEM_INP
    assert prog.insns[3] == Store(y_size=0, x_size=0, x_stride=0, push_prev=True)


def test_push_after_pending_pop_is_not_folded_backwards(cfg):
    """A push must follow the pops requested before it, so it goes with them into a token-only instruction."""
    bld = ProgramBuilder(cfg)
    bld.gemm(uop_bgn=0, uop_end=1)
    bld.dep_pop("store", "compute")
    bld.dep_push("compute", "load")
    bld.store(sram_base=0, dram_base=0, x_size=0)
    prog_insns = bld.insns
    assert _flags(prog_insns[0]) == "-"
    assert isinstance(prog_insns[1], Load) and _flags(prog_insns[1]) == "nP"


def test_push_flag_already_set_gets_a_noop(cfg):
    bld = ProgramBuilder(cfg)
    bld.load(MEM_INP, sram_base=0, dram_base=0)
    bld.dep_push("load", "compute")
    bld.dep_push("load", "compute")
    assert [_flags(i) for i in bld.insns] == ["N", "N"]
    assert bld.insns[1].x_size == 0


def test_finish_commits_pending_pops_of_load_and_store(cfg):
    bld = ProgramBuilder(cfg)
    bld.dep_pop("compute", "load")
    bld.dep_pop("compute", "store")
    prog = bld.finish()
    assert _summary(prog) == ["LOAD-NOOP:n", "STORE-NOOP:pP", "FINISH:n"]


def test_token_errors(cfg):
    bld = ProgramBuilder(cfg)
    with pytest.raises(ValueError, match=r"^module must be one of 'load', 'compute', 'store', not 'fetch'$"):
        bld.dep_push("fetch", "load")
    with pytest.raises(ValueError, match=r"^there is no token queue from 'load' to 'store'; queues exist only between "
                       r"load and compute and between compute and store \(both directions\)$"):
        bld.dep_pop("load", "store")
    with pytest.raises(ValueError, match=r"^there is no token queue from 'compute' to 'compute'"):
        bld.dep_push("compute", "compute")


# ---- instructions and errors ------------------------------------------------------------------------------------
def test_builder_instructions(cfg):
    bld = ProgramBuilder(cfg)
    assert bld.load(MEM_INP, sram_base=1, dram_base=2, y_size=3, x_size=4) == 0
    assert bld.insns[0].x_stride == 4  # defaults to x_size
    assert bld.alu(ALU_ADD, uop_bgn=0, uop_end=2, use_imm=True, imm=-5) == 1
    assert bld.store(sram_base=0, dram_base=0, x_size=2, x_stride=7) == 2
    assert bld.insns[2] == Store(mem=MEM_OUT, x_size=2, x_stride=7)
    assert bld.emit(Gemm(uop_end=3, iter_in=2)) == 3


def test_encode_error_names_the_instruction(cfg):
    bld = ProgramBuilder(cfg)
    bld.gemm(uop_bgn=0, uop_end=1)
    with pytest.raises(EncodeError, match=r"^instruction 1: LOAD field y_pad_0 = 16 does not fit its 4-bit field "
                       r"\(allowed 0..15\) at config 1x16_i8w8a32_15_15_18_17$"):
        bld.load(MEM_INP, sram_base=0, dram_base=0, y_pad_0=16)
    assert len(bld.insns) == 1  # the bad instruction was not appended
    with pytest.raises(ValueError, match=r"^LOAD takes memory type UOP \(0\), WGT \(1\), INP \(2\), ACC \(3\) or "
                       r"ACC_8BIT \(5\), not 4$"):
        bld.load(MEM_OUT, sram_base=0, dram_base=0)
    with pytest.raises(TypeError, match=r"^expected a Load, Store, Gemm, Alu or Finish instruction, not Uop$"):
        bld.emit(Uop(0, 0))
    with pytest.raises(TypeError, match=r"^micro-op 1 of kernel 'k' must be a Uop, not tuple$"):
        bld.uop_kernel("k", [Uop(0, 0), (1, 2, 3)])


def test_patch_changes_fields_and_keeps_the_token_flags(cfg):
    """patch() sets an emitted instruction's operands (a LOAD UOP sized once its kernels are known) and re-encodes it;
    the flags it carries stay, and the flags themselves, unknown fields, bad indices and values too wide are
    refused."""
    bld = ProgramBuilder(cfg)
    bld.dep_pop("load", "compute")
    k = bld.load(MEM_UOP, sram_base=0, dram_base=0, x_size=1)
    bld.dep_push("compute", "store")
    bld.patch(k, dram_base=12, x_size=5)
    assert bld.insns[k] == Load(mem=MEM_UOP, dram_base=12, x_size=5, x_stride=1, pop_prev=True, push_next=True)
    with pytest.raises(AttributeError, match=r"^Load has no field 'push_next' to patch$"):
        bld.patch(k, push_next=False)
    with pytest.raises(AttributeError, match=r"^Load has no field 'uop_bgn' to patch$"):
        bld.patch(k, uop_bgn=1)
    with pytest.raises(IndexError, match=r"^instruction 1 does not exist: 1 emitted so far$"):
        bld.patch(1, x_size=1)
    with pytest.raises(EncodeError, match=r"^instruction 0: LOAD field y_pad_0 = 16 does not fit"):
        bld.patch(k, y_pad_0=16)
    assert bld.insns[k].y_pad_0 == 0
    prog = bld.finish()
    end = prog.insn_offset + len(prog.insns) * prog.insn_bytes  # the image holds the patched instruction
    assert encode_stream(prog.insns, cfg).tobytes() == prog.dram[prog.insn_offset:end].tobytes()


def test_builder_closed_after_finish(cfg):
    bld = ProgramBuilder(cfg)
    bld.finish()
    with pytest.raises(RuntimeError, match=r"^finish\(\) was already called on this builder; start a new "
                       r"ProgramBuilder$"):
        bld.gemm(uop_bgn=0, uop_end=1)


def test_finish_places_the_stream(cfg):
    bld = ProgramBuilder(cfg.replace(bus_bytes=64))
    bld.alloc("x", (300,))
    bld.gemm(uop_bgn=0, uop_end=1)
    prog = bld.finish()
    assert prog.insn_offset == 512
    assert isinstance(prog.insns[-1], Finish)
    assert np.array_equal(prog.encoded_insns(), encode_stream(prog.insns, prog.cfg))
    assert 512 + 16 * len(prog.insns) == 560
    assert prog.dram.size == 576  # rounded up to whole 64-byte bus beats
    assert not prog.dram[560:].any()
    assert repr(prog) == ("Program(cfg=1x16_i8w8a32_15_15_18_17_bus64, insns=3, dram=576 bytes, insn_offset=512, "
                          "allocations=[x])")


def test_program_validation(cfg):
    with pytest.raises(ValueError, match=r"^insn_offset must be a non-negative multiple of 16 bytes \(the bus width "
                       r"and the instruction size\), not 8$"):
        Program(cfg, [Finish()], np.zeros(64, np.uint8), 8)
    with pytest.raises(ValueError, match=r"^the instruction stream \[48, 64\) does not fit the 60-byte DRAM image$"):
        Program(cfg, [Finish()], np.zeros(60, np.uint8), 48)
    with pytest.raises(TypeError, match=r"^dram must be a one-dimensional uint8 numpy array"):
        Program(cfg, [Finish()], np.zeros(64, np.int8), 0)
    with pytest.raises(ValueError, match=r"^allocation 'a' \[0, 100\) lies outside the 64-byte DRAM image$"):
        Program(cfg, [Finish()], np.zeros(64, np.uint8), 0, {"a": Allocation("a", 0, 100, (100,), "int8")})


# ---- files -------------------------------------------------------------------------------------------------------
def test_save_load_round_trip(tmp_path, small_cfg):
    from vta.gemm import gemm_program

    prog, expected = gemm_program(small_cfg, 9, 13, 7)
    path = tmp_path / "p.npz"
    prog.save(path)
    back = Program.load(path)
    assert back.cfg == prog.cfg
    assert back.insns == prog.insns
    assert np.array_equal(back.dram, prog.dram)
    assert back.insn_offset == prog.insn_offset
    assert back.allocations == prog.allocations
    assert np.array_equal(back.read("C", fsim.run(back).dram), expected)


def test_load_rejects_inconsistent_files(tmp_path, cfg):
    prog = ProgramBuilder(cfg).finish()
    path = tmp_path / "p.npz"
    prog.save(path)
    with np.load(path) as data:
        parts = dict(data)
    parts["dram"] = parts["dram"].copy()
    parts["dram"][-1] ^= 0xFF
    np.savez(tmp_path / "bad.npz", **parts)
    with pytest.raises(ValueError, match=r"is inconsistent: the instruction stream in its DRAM image differs from its "
                       r"encoded instructions$"):
        Program.load(tmp_path / "bad.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match=r"is not a saved program: it lacks dram, insns, meta$"):
        Program.load(tmp_path / "other.npz")
    bad_cfg = dict(parts)
    bad_cfg["meta"] = np.array(str(parts["meta"]).replace('"LOG_BLOCK": 4', '"LOG_BLOCK": 9'))
    np.savez(tmp_path / "badcfg.npz", **bad_cfg)
    with pytest.raises(ValueError, match=r"LOG_BLOCK must be between 2 and 6, not 9"):
        Program.load(tmp_path / "badcfg.npz")


def test_load_rejects_damaged_files(tmp_path, cfg):
    """Truncated, non-zip, pickle-carrying and metadata-damaged .npz files are ValueErrors naming the file, never a
    zipfile or numpy traceback (found by scripts/fault_campaign.py)."""
    prog = ProgramBuilder(cfg).finish()
    path = tmp_path / "p.npz"
    prog.save(path)
    good = path.read_bytes()
    (tmp_path / "cut.npz").write_bytes(good[:len(good) // 2])
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all")
    np.savez(tmp_path / "obj.npz", meta=np.array([{"a": 1}], dtype=object), insns=np.zeros(1), dram=np.zeros(1))
    for name in ("cut.npz", "junk.npz", "obj.npz"):
        with pytest.raises(ValueError, match=rf"{name} is not a readable saved program \(\.npz\): it is damaged"):
            Program.load(tmp_path / name)
    with np.load(path) as data:
        parts = dict(data)
    parts["meta"] = np.array(str(parts["meta"]).replace('"allocations"', '"allocs"'))
    np.savez(tmp_path / "meta.npz", **parts)
    with pytest.raises(ValueError, match=r"meta.npz is not a valid saved program: its metadata is damaged \(KeyError"):
        Program.load(tmp_path / "meta.npz")


def test_program_config_type():
    with pytest.raises(TypeError, match=r"^cfg must be a VTAConfig, not dict$"):
        ProgramBuilder({})
    assert isinstance(VTAConfig(), VTAConfig)


def test_the_image_holds_each_instruction_as_encoded_after_its_token_flags():
    """ProgramBuilder encodes each instruction as it is emitted and sets token bits in place (dep_push on an
    emitted instruction): the finished image equals a fresh encoding of the final instruction list."""
    from vta.compiler.lowering.codegen import ConvLayer, build_conv_program
    from vta.compiler.lowering.intrin import intrinsics
    from vta.compiler.lowering.schedule import ConvTiling

    rng = np.random.default_rng(4)
    for cfg in (VTAConfig(), VTAConfig(log_block=3, bus_bytes=16)):
        w = rng.integers(-128, 128, (40, 24, 3, 3)).astype(np.int8)
        layer = ConvLayer.make((1, 24, 7, 7), w, rng.integers(-500, 500, 40), rng.integers(1, 300, 40),
                               rng.integers(8, 16, 40), 0, 127, pads=(1, 1, 1, 1), intr=intrinsics(cfg))
        for threads in (1, 2):
            prog, _ = build_conv_program(cfg, layer, None, ConvTiling(layer.geom, 1, 1, 3, 4, 3, threads))
            assert any(i.push_next or i.push_prev for i in prog.insns)
            n = len(prog.insns)
            image = prog.dram[prog.insn_offset:prog.insn_offset + n * prog.insn_bytes].reshape(n, -1)
            np.testing.assert_array_equal(image, encode_stream(prog.insns, cfg))


def test_with_data_fills_allocations_in_a_copy_and_names_bad_ones():
    cfg = VTAConfig()
    b = ProgramBuilder(cfg)
    b.alloc("a", np.zeros((2, cfg.batch, cfg.block_in), np.int8))
    b.alloc("c", np.zeros(3, np.int32))
    program = b.finish()
    values = np.arange(-3, 3, dtype=np.int32)[:3]
    filled = program.with_data({"c": values})
    assert np.array_equal(filled.read("c"), values) and not program.read("c").any()
    assert np.array_equal(filled.read("a"), program.read("a"))
    with pytest.raises(KeyError, match="no allocation named 'b'; known allocations: a, c"):
        program.with_data({"b": values})
    with pytest.raises(ValueError, match="value for 'c' has 8 bytes; the allocation holds 12"):
        program.with_data({"c": values[:2]})


@pytest.mark.parametrize("total", [None, 5])
@pytest.mark.parametrize("slots", [1, 2])
def test_slot_ring_balances_its_tokens_and_runs(slots, total):
    """Five uses of a load -> compute ring: every token pushed is popped (with ``total`` none is pushed that no use
    pops; without it ``drain`` pops the rest), the parts alternate, and fsim runs the program to its end."""
    from vta.counts import token_counts
    from vta.program import SlotRing
    cfg = VTAConfig()
    b = ProgramBuilder(cfg)
    x = b.alloc("x", np.ones((2, cfg.batch, cfg.block_in), np.int8))
    ring = SlotRing(b, "load", "compute", slots, total=total)
    parts = []
    for _ in range(5):
        parts.append(ring.claim())
        b.load(MEM_INP, sram_base=parts[-1], dram_base=b.elem_addr(x, MEM_INP), x_size=1)
        ring.handoff()
        b.gemm(uop_bgn=0, uop_end=1, reset=True)
        ring.release()
    ring.drain()
    program = b.finish()
    counts = token_counts(program.insns)
    assert parts == [k % slots for k in range(5)]
    assert counts["load_to_compute_pushes"] == counts["load_to_compute_pops"] == 5
    assert counts["compute_to_load_pushes"] == counts["compute_to_load_pops"] == (5 if total is None else 5 - slots)
    fsim.run(program)


def test_slot_ring_needs_a_slot():
    from vta.program import SlotRing
    with pytest.raises(ValueError, match="a slot ring needs at least one slot, not 0"):
        SlotRing(ProgramBuilder(VTAConfig()), "load", "compute", 0)
