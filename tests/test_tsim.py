"""The TSIM harness and bridge, exercised on the stand-in core (tests/tsim_standin.py): reads, bursts, writes,
latency, bounds checks, the watchdog, the cycle budget, counters and waveform traces."""
from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tsim_standin import generate_standin

from vta.config import MEM_INP, VTAConfig
from vta.isa import Alu, Finish, Gemm, Load, Store, encode_stream
from vta.tsim.backend import TSimBackend
from vta.tsim.bridge import Model, Stall, TsimBudgetError, TsimMemoryError, TsimWatchdogError
from vta.tsim.build import _lz4_flags, build

CFG = VTAConfig()
SOURCES = [Path(__file__).with_name("tsim_standin.py")]
DRAM_BYTES = 4096
DATA = 512     # byte address of the source data the stand-in copies
IB = 16        # instruction bytes at the default config


@pytest.fixture(scope="session")
def model() -> Model:
    return Model(build(CFG, generator=generate_standin, sources=SOURCES, progress=False))


def image(insns: list, cfg: VTAConfig = CFG, size: int = DRAM_BYTES) -> np.ndarray:
    """A DRAM image: the instructions at byte 0, bytes 0..255 repeating from DATA on."""
    dram = np.zeros(size, np.uint8)
    dram[DATA:] = np.arange(size - DATA) % 251
    stream = encode_stream(insns, cfg).reshape(-1)
    dram[:stream.size] = stream
    return dram


def copy(src_beat: int, dst_beat: int, beats: int, store: bool = False) -> Load | Store:
    """The stand-in's copy: ``beats`` bus beats from beat address ``src_beat`` to ``dst_beat``."""
    if store:
        return Store(dram_base=src_beat, x_size=beats, x_stride=dst_beat)
    return Load(mem=MEM_INP, dram_base=src_beat, x_size=beats, x_stride=dst_beat)


def test_copy_bursts_write_the_expected_bytes_and_count(model: Model) -> None:
    insns = [copy(DATA // 8, 256, 5), copy(DATA // 8 + 10, 300, 3, store=True), Alu(alu_opcode=0, iter_out=7),
             Finish()]
    dram = image(insns)
    out, run = model.run(dram, insn_addr=0, insn_count=len(insns))
    expected = dram.copy()
    expected[256 * 8:256 * 8 + 40] = dram[DATA:DATA + 40]
    expected[300 * 8:300 * 8 + 24] = dram[DATA + 80:DATA + 104]
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(dram, image(insns), "the caller's array is untouched unless in_place=True")
    c = run.counters
    assert (c["insn_bytes_read"], c["inp_bytes_read"], c["out_bytes_written"]) == (4 * IB, 40, 24)
    assert (c["fetch_insns"], c["load_insns"], c["store_insns"], c["compute_insns"]) == (4, 1, 1, 2)
    assert c["alu_uops"] == 7
    assert (run.rd_requests, run.rd_beats, run.wr_beats) == (6, 4 * 2 + 8, 8)
    assert c["cycles"] == run.cycles


def test_in_place_run_writes_the_callers_array(model: Model) -> None:
    insns = [copy(DATA // 8, 256, 1), Finish()]
    dram = image(insns)
    out, _ = model.run(dram, insn_addr=0, insn_count=2, in_place=True)
    assert out is dram
    np.testing.assert_array_equal(dram[2048:2056], dram[DATA:DATA + 8])


@pytest.mark.parametrize("insns, requests", [([Finish()], 1), ([copy(DATA // 8, 256, 2), Finish()], 3)])
def test_each_serialized_read_request_waits_the_latency(model: Model, insns: list, requests: int) -> None:
    dram = image(insns)
    _, fast = model.run(dram, insn_addr=0, insn_count=len(insns), latency=16)
    _, slow = model.run(dram, insn_addr=0, insn_count=len(insns), latency=48)
    assert slow.cycles - fast.cycles == 32 * requests


def test_latency_defaults_to_the_configs(model: Model) -> None:
    dram = image([Finish()])
    _, default = model.run(dram, insn_addr=0, insn_count=1)
    _, explicit = model.run(dram, insn_addr=0, insn_count=1, latency=CFG.dram_latency)
    assert default.cycles == explicit.cycles


def test_instructions_at_an_offset(model: Model) -> None:
    insns = [copy(DATA // 8, 256, 1), Finish()]
    dram = np.zeros(DRAM_BYTES, np.uint8)
    dram[DATA:DATA + 8] = 7
    dram[1024:1024 + 2 * IB] = encode_stream(insns, CFG).reshape(-1)
    out, _ = model.run(dram, insn_addr=1024, insn_count=2)
    assert list(out[2048:2056]) == [7] * 8


def test_a_read_outside_the_image_names_the_address(model: Model) -> None:
    insns = [copy(DRAM_BYTES // 8 - 2, 256, 4), Finish()]
    with pytest.raises(TsimMemoryError, match=r"a read of 32 bytes at byte address 0xff0 \(up to 0x1010\), "
                                              r"outside the 4096-byte DRAM image") as info:
        model.run(image(insns), insn_addr=0, insn_count=2)
    assert (info.value.address, info.value.nbytes, info.value.write) == (0xFF0, 32, False)


def test_a_write_outside_the_image_names_the_address_and_stops(model: Model) -> None:
    insns = [copy(DATA // 8, DRAM_BYTES // 8 - 1, 3), Finish()]
    dram = image(insns)
    with pytest.raises(TsimMemoryError, match=r"a write of 8 bytes at byte address 0x1000 \(up to 0x1008\)") as info:
        model.run(dram, insn_addr=0, insn_count=2, in_place=True)
    assert info.value.write is True
    assert list(dram[-8:]) == list(dram[DATA:DATA + 8]), "the beat inside the image was written"


def test_the_last_partial_beat_reads_zeros_past_the_end_and_takes_no_strobed_write(model: Model) -> None:
    insns = [copy(DRAM_BYTES // 8, 256, 1), Finish()]
    dram = image(insns, size=DRAM_BYTES + 4)  # the last beat, [4096, 4104), is half inside the image
    out, _ = model.run(dram, insn_addr=0, insn_count=2)
    assert list(out[2048:2056]) == list(dram[4096:4100]) + [0, 0, 0, 0]
    with pytest.raises(TsimMemoryError, match=r"a read of 16 bytes at byte address 0x1000 \(up to 0x1010\), outside "
                                              r"the 4100-byte DRAM image"):
        model.run(image([copy(DRAM_BYTES // 8, 256, 2), Finish()], size=DRAM_BYTES + 4), insn_addr=0, insn_count=2)
    insns = [copy(DATA // 8, DRAM_BYTES // 8, 1), Finish()]
    with pytest.raises(TsimMemoryError, match=r"a write of 8 bytes at byte address 0x1000 .* outside the 4100-byte"):
        model.run(image(insns, size=DRAM_BYTES + 4), insn_addr=0, insn_count=2)


def test_a_misaligned_request_is_an_error(model: Model) -> None:
    with pytest.raises(TsimMemoryError, match=r"a read at byte address 0x4, which is not a multiple of the 8-byte "
                                              r"bus width"):
        model.run(image([Finish()]), insn_addr=4, insn_count=1)


def test_the_watchdog_reports_each_modules_state_and_last_instruction(model: Model) -> None:
    insns = [copy(DATA // 8, 256, 1), Gemm(uop_end=3), Finish()]
    with pytest.raises(TsimWatchdogError, match=r"no module made progress for 500 cycles") as info:
        model.run(image(insns), insn_addr=0, insn_count=3, watchdog_cycles=500, insns=insns)
    err = info.value
    states = {m.module: m for m in err.modules}
    assert [m.module for m in err.modules] == ["fetch", "load", "compute", "store"]
    assert states["compute"].state == "wait_token"
    assert states["compute"].last_insn is not None and states["compute"].last_insn.startswith("instruction 1 (GEMM")
    assert (states["load"].state, states["load"].insns_done) == ("idle", 1)
    assert states["load"].last_insn is not None and states["load"].last_insn.startswith("instruction 0 (LOAD INP")
    assert err.idle_cycles == 500
    assert err.counters["compute_wait_token"] > 0
    assert re.search(r"compute: wait_token, 0 instructions done, last took instruction 1 \(GEMM", str(err))


def test_the_budget_stops_a_long_run(model: Model) -> None:
    insns = [Alu(alu_opcode=0, iter_out=5000), Finish()]
    with pytest.raises(TsimBudgetError, match=r"used its whole budget of 1000 cycles without reaching FINISH") as info:
        model.run(image(insns), insn_addr=0, insn_count=2, max_cycles=1000)
    assert info.value.cycles == 1000
    _, run = model.run(image(insns), insn_addr=0, insn_count=2, max_cycles=10_000)
    assert run.counters["alu_uops"] == 5000


def test_random_backpressure_is_seeded_slows_the_run_and_keeps_the_data(model: Model) -> None:
    insns = [copy(DATA // 8, 256, 5), copy(DATA // 8 + 10, 300, 3, store=True), copy(DATA // 8 + 20, 320, 4),
             Alu(alu_opcode=0, iter_out=7), Finish()]
    dram = image(insns)
    want, calm = model.run(dram, insn_addr=0, insn_count=len(insns))
    assert calm.stalls == (0, 0, 0)
    runs = [model.run(dram, insn_addr=0, insn_count=len(insns), stall=Stall(seed=seed)) for seed in (7, 7, 8)]
    for out, run in runs:
        np.testing.assert_array_equal(out, want)
        assert (run.rd_beats, run.wr_beats) == (calm.rd_beats, calm.wr_beats)
        assert run.cycles > calm.cycles and min(run.stalls) > 0
    (_, a), (_, b), (_, c) = runs
    assert (a.cycles, a.stalls, a.counters) == (b.cycles, b.stalls, b.counters), "the same seed, the same run"
    assert (a.cycles, a.stalls) != (c.cycles, c.stalls), "another seed, another run"
    out, heavy = model.run(dram, insn_addr=0, insn_count=len(insns),
                           stall=Stall(seed=1, rd_req=0.9, rd_data=0.9, wr=0.9, extra_latency=100))
    np.testing.assert_array_equal(out, want)
    assert heavy.cycles > a.cycles
    _, late = model.run(dram, insn_addr=0, insn_count=len(insns), stall=Stall(seed=1, rd_req=0, rd_data=0, wr=0,
                                                                              extra_latency=40))
    assert late.stalls == (0, 0, 0) and late.cycles > calm.cycles, "extra latency alone delays the reads"


def test_bad_backpressure_settings_are_named_at_once() -> None:
    with pytest.raises(ValueError, match=r"seed must be an integer from 0 to 2\*\*64-1, not -1; rd_req must be a "
                                         r"probability in \[0, 1\), not 1.0; wr must be a probability in \[0, 1\), "
                                         r"not 'x'; extra_latency must be a number of cycles"):
        Stall(seed=-1, rd_req=1.0, wr="x", extra_latency=-2)  # type: ignore[arg-type]
    assert Stall(seed=3, rd_req=0.5).units() == (32768, 16384, 16384)


def test_bad_arguments_are_rejected(model: Model) -> None:
    with pytest.raises(TypeError, match=r"must be a 1-D uint8 array, not 1-D int32"):
        model.run(np.zeros(64, np.int32), insn_addr=0, insn_count=1)
    with pytest.raises(TypeError, match=r"must be a numpy uint8 array, not list"):
        model.run([0] * 64, insn_addr=0, insn_count=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"insn_count must be between 0 and 4294967295, not -1"):
        model.run(np.zeros(64, np.uint8), insn_addr=0, insn_count=-1)
    with pytest.raises(ValueError, match=r"built without trace support"):
        model.run(np.zeros(64, np.uint8), insn_addr=0, insn_count=1, trace="x.vcd")
    with pytest.raises(ValueError, match=r"trace_window was given without trace="):
        model.run(np.zeros(64, np.uint8), insn_addr=0, insn_count=1, trace_window=(0, 5))
    with pytest.raises(ValueError, match=r"in_place=True needs a C-contiguous, writeable DRAM array"):
        model.run(np.zeros(128, np.uint8)[::2], insn_addr=0, insn_count=1, in_place=True)


def test_a_vcd_trace_records_only_its_window(tmp_path: Path) -> None:
    traced = Model(build(CFG, trace="vcd", generator=generate_standin, sources=SOURCES, progress=False))
    assert traced.trace_kind == "vcd"
    insns = [copy(DATA // 8, 256, 2), Finish()]
    path = tmp_path / "run.vcd"
    out, run = traced.run(image(insns), insn_addr=0, insn_count=2, trace=path, trace_window=(10, 20))
    text = path.read_text()
    assert "$enddefinitions" in text and "mem_rd_req_valid" in text
    times = [int(t) for t in re.findall(r"^#(\d+)$", text, flags=re.M)]
    assert times[0] == 20 and max(times) == 39
    assert list(out[2048:2064]) == list(image(insns)[DATA:DATA + 16])
    assert run.counters["inp_bytes_read"] == 16


@pytest.mark.skipif(_lz4_flags() is None, reason="FST needs the LZ4 library")
def test_an_fst_trace_records_only_its_window(tmp_path: Path) -> None:
    traced = Model(build(CFG, trace="fst", generator=generate_standin, sources=SOURCES, progress=False))
    assert traced.trace_kind == "fst"
    insns = [copy(DATA // 8, 256, 2), Finish()]
    path = tmp_path / "run.fst"
    traced.run(image(insns), insn_addr=0, insn_count=2, trace=path, trace_window=(5, 40))
    data = path.read_bytes()
    # FST header block: type 0, 8-byte length, then start and end times (big-endian): 2*5 and 2*39+1.
    assert data[0] == 0 and struct.unpack(">QQ", data[9:25]) == (10, 79)


def test_the_backend_runs_a_program_and_maps_counters_to_stats() -> None:
    backend = TSimBackend(generator=generate_standin, sources=SOURCES, progress=False)
    insns = [copy(DATA // 8, 256, 2), Alu(alu_opcode=0, iter_out=3), Finish()]
    program = SimpleNamespace(cfg=CFG, dram=image(insns), insn_offset=0, insns=insns)
    with pytest.raises(TypeError, match=r"check='fsim' runs the program on the functional simulator first, which "
                                        r"takes a vta.program.Program, not SimpleNamespace; pass check='none'"):
        backend.run(program)
    result = backend.run(program, check="none")
    assert result.backend == "tsim"
    assert {k: result.stats[k] for k in ("gemm_uops", "alu_uops", "insn_bytes_read", "inp_bytes_read", "macs",
                                         "load_insns", "compute_insns", "load_to_compute_pushes")} == {
        "gemm_uops": 0, "alu_uops": 3, "insn_bytes_read": 48, "inp_bytes_read": 16, "macs": 0, "load_insns": 1,
        "compute_insns": 2, "load_to_compute_pushes": 0}
    assert result.cycles == result.counters["cycles"] > 0
    np.testing.assert_array_equal(result.dram[2048:2064], program.dram[DATA:DATA + 16])
    with pytest.raises(TypeError, match=r"unknown tsim option\(s\) speed; known options are check, max_cycles, "
                                        r"trace, "):
        backend.run(program, speed=2)
    with pytest.raises(ValueError, match=r"the trace file must end in .fst or .vcd, not 'x.txt'"):
        backend.run(program, check="none", trace="x.txt")
    with pytest.raises(ValueError, match=r"check must be one of 'fsim', 'none', not 'spec'"):
        backend.run(program, check="spec")
    with pytest.raises(ValueError, match=r"max_cycles must be a non-negative number of cycles, not -1"):
        TSimBackend(max_cycles=-1)


def test_a_wider_bus_config() -> None:
    cfg = CFG.replace(bus_bytes=16, dram_latency=4)
    wide = Model(build(cfg, generator=generate_standin, sources=SOURCES, progress=False))
    insns = [copy(DATA // 16, 128, 3), Finish()]
    dram = image(insns, cfg)
    out, run = wide.run(dram, insn_addr=0, insn_count=2)
    np.testing.assert_array_equal(out[2048:2048 + 48], dram[DATA:DATA + 48])
    assert (run.rd_beats, run.wr_beats, run.counters["inp_bytes_read"]) == (2 + 3, 3, 48)
    narrow = Model(build(CFG, generator=generate_standin, sources=SOURCES, progress=False))
    with pytest.raises(ValueError, match=r"was built for a 8-byte bus, but config .*_bus16_lat4 has bus_bytes=16"):
        Model(dataclasses.replace(narrow.build, cfg=cfg))


def test_the_backend_passes_its_pgo_choice_to_the_build(monkeypatch) -> None:
    """TSimBackend(pgo=...) reaches vta.tsim.build.build (a sweep's exact points build without PGO); the default
    leaves the choice to build (None)."""
    import vta.tsim.backend as backend_module
    seen = []

    def fake_build(cfg, **kwargs):
        seen.append(kwargs["pgo"])
        raise RuntimeError("stop here")

    monkeypatch.setattr(backend_module, "build", fake_build)
    for pgo in (False, None):
        with pytest.raises(RuntimeError, match="stop here"):
            TSimBackend(pgo=pgo, progress=False).model(CFG)
    assert seen == [False, None]
