"""vta/counters.py: every counter named once; the RTL register map, fsim's Stats, tsim's statistics and the report's
columns all agree with it."""
from __future__ import annotations

import dataclasses
import re

import pytest

from vta import counters
from vta.config import VTAConfig
from vta.counters import (
    BYTE_COUNTERS,
    CATALOGUE,
    CSR_COUNTERS,
    CYCLE_CLASSES,
    HARDWARE,
    HARDWARE_STATISTICS,
    INSN_COUNTERS,
    MODULE_CYCLE_COUNTERS,
    MODULES,
    STAT_COUNTERS,
    STATISTICS,
    STREAM,
    STREAM_STATISTICS,
    TOKEN_COUNTERS,
    UNITS,
    UOP_COUNTERS,
    Counter,
    counter,
    csr_address,
)
from vta.fsim import Stats, run
from vta.gemm import gemm_program
from vta.isa import TOKEN_QUEUES

# The register map as shipped: the CSR address of a counter is its index here. Append only.
CSR_MAP = (
    "cycles",
    "fetch_busy", "fetch_wait_token", "fetch_wait_mem",
    "load_busy", "load_wait_token", "load_wait_mem",
    "compute_busy", "compute_wait_token", "compute_wait_mem",
    "store_busy", "store_wait_token", "store_wait_mem",
    "gemm_uops", "alu_uops",
    "insn_bytes_read", "uop_bytes_read", "wgt_bytes_read", "inp_bytes_read", "acc_bytes_read", "out_bytes_written",
    "fetch_insns", "load_insns", "compute_insns", "store_insns",
)

SMALL = VTAConfig(log_block=3, log_uop_buff_size=10, log_inp_buff_size=10, log_wgt_buff_size=12,
                  log_acc_buff_size=11, cmd_queue_depth=4, token_queue_depth=4)


# ---- the catalogue itself --------------------------------------------------------------------------------------------
def test_csr_order_is_unchanged():
    assert CSR_COUNTERS == CSR_MAP
    assert csr_address("cycles") == 0
    assert csr_address("fetch_busy") == 1
    assert csr_address("fetch_wait_token") == 2
    assert csr_address("fetch_wait_mem") == 3
    assert csr_address("load_busy") == 4
    assert csr_address("gemm_uops") == 13
    assert csr_address("alu_uops") == 14
    assert csr_address("insn_bytes_read") == 15
    assert csr_address("out_bytes_written") == 20
    assert csr_address("fetch_insns") == 21
    assert csr_address("store_insns") == 24


def test_every_counter_has_a_unit_and_a_meaning():
    assert len(CATALOGUE) == len(CSR_MAP) + 1 + 2 * len(TOKEN_QUEUES)
    for name, c in CATALOGUE.items():
        assert isinstance(c, Counter) and c.name == name
        assert c.unit in UNITS
        assert c.meaning.strip() and c.meaning[0].isupper() and c.meaning.endswith(".")
        assert c.source in (HARDWARE, STREAM)
    assert {name: c.unit for name, c in CATALOGUE.items() if c.unit != "cycles"} == {
        "gemm_uops": "micro-ops", "alu_uops": "micro-ops",
        **{name: "bytes" for name in BYTE_COUNTERS.values()},
        **{name: "instructions" for name in INSN_COUNTERS},
        "macs": "MACs",
        **{name: "tokens" for name in TOKEN_COUNTERS},
    }
    assert [n for n, c in CATALOGUE.items() if c.unit == "cycles"] == ["cycles", *MODULE_CYCLE_COUNTERS]


def test_sources():
    assert tuple(n for n, c in CATALOGUE.items() if c.source == HARDWARE) == CSR_COUNTERS
    assert STREAM_STATISTICS == ("macs", *TOKEN_COUNTERS)
    assert all(CATALOGUE[n].source == STREAM and CATALOGUE[n].statistic for n in STREAM_STATISTICS)
    timing = {"cycles", *MODULE_CYCLE_COUNTERS}
    assert {n for n in CSR_COUNTERS if not CATALOGUE[n].statistic} == timing
    assert set(STATISTICS) == set(CSR_COUNTERS) - timing | set(STREAM_STATISTICS)


def test_derived_tuples():
    assert MODULES == ("fetch", "load", "compute", "store")
    assert CYCLE_CLASSES == ("busy", "wait_token", "wait_mem")
    assert MODULE_CYCLE_COUNTERS == tuple(f"{m}_{c}" for m in MODULES for c in CYCLE_CLASSES)
    assert UOP_COUNTERS == ("gemm_uops", "alu_uops")
    assert BYTE_COUNTERS == {"insn": "insn_bytes_read", "uop": "uop_bytes_read", "wgt": "wgt_bytes_read",
                             "inp": "inp_bytes_read", "acc": "acc_bytes_read", "out": "out_bytes_written"}
    assert INSN_COUNTERS == ("fetch_insns", "load_insns", "compute_insns", "store_insns")
    assert TOKEN_COUNTERS == tuple(f"{q}_{k}" for q in TOKEN_QUEUES for k in ("pushes", "pops"))
    assert STAT_COUNTERS == ("gemm_uops", "alu_uops", "insn_bytes_read", "uop_bytes_read", "wgt_bytes_read",
                             "inp_bytes_read", "acc_bytes_read", "out_bytes_written")
    assert HARDWARE_STATISTICS == STAT_COUNTERS + INSN_COUNTERS


def test_lookup_errors_name_the_known_counters():
    assert counter("macs").unit == "MACs"
    with pytest.raises(KeyError, match=r"unknown counter 'bogus'; counters are cycles, fetch_busy, .*, "
                                       r"store_to_compute_pops"):
        counter("bogus")
    with pytest.raises(KeyError, match=r"unknown counter 'macs'; counters are cycles, .*, store_insns\"?$"):
        csr_address("macs")


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "Gemm uops"}, r"^Counter name 'Gemm uops' is not a lower-case identifier such as 'gemm_uops'\.$"),
    ({"unit": "beats"}, r"^Counter 'x' has unit 'beats'; units are cycles, micro-ops, bytes, instructions, MACs, "
                        r"tokens\.$"),
    ({"meaning": " "}, r"^Counter 'x' has an empty meaning; say what one count is\.$"),
    ({"source": "rtl"}, r"^Counter 'x' has source 'rtl'; sources are hardware, stream\.$"),
    ({"source": STREAM, "statistic": False},
     r"^Counter 'x' comes from the instruction stream, so it must be a statistic\.$"),
])
def test_counter_checks_its_fields(kwargs, message):
    fields = {"name": "x", "unit": "bytes", "meaning": "Bytes.", "source": HARDWARE, "statistic": True, **kwargs}
    with pytest.raises(ValueError, match=message):
        Counter(**fields)


def test_counters_is_on_the_ground_floor():
    source = open(counters.__file__, encoding="utf-8").read()
    imports = re.findall(r"^(?:from|import) (\S+)", source, re.M)
    assert imports and all(m in ("__future__", "re", "dataclasses", ".isa") for m in imports), imports


# ---- the RTL register map --------------------------------------------------------------------------------------------
def test_hw_regs_derive_from_counters():
    from vta.hw import regs
    assert regs.COUNTERS == CSR_MAP
    assert regs.MODULES == MODULES and regs.CYCLE_CLASSES == CYCLE_CLASSES
    assert regs.CSR_ADDR_BITS == 6 and len(regs.COUNTERS) <= 1 << regs.CSR_ADDR_BITS


def test_core_serves_each_counter_at_its_csr_address():
    from vta.hw.verilog import verilog_text
    text = verilog_text(SMALL)
    body = text[text.index("casez (csr_addr)"):]
    body = body[:body.index("endcase")]
    served = {int(addr, 16): name for addr, name in re.findall(r"6'h([0-9a-f]{2}):\s*csr_rdata = cnt_(\w+);", body)}
    assert served == dict(enumerate(CSR_MAP))


# ---- fsim, tsim and the report ---------------------------------------------------------------------------------------
def test_fsim_stats_fields_are_the_statistics():
    fields = dataclasses.fields(Stats)
    assert tuple(f.name for f in fields) == STATISTICS
    assert all(f.type in (int, "int") and f.default == 0 for f in fields)
    assert tuple(Stats().as_dict()) == STATISTICS


def test_tsim_statistics_from_counters_equal_fsim(small_cfg):
    from vta.tsim.backend import INSN_COUNTERS as TSIM_INSN
    from vta.tsim.backend import STAT_COUNTERS as TSIM_STAT
    from vta.tsim.backend import stats_from_counters
    assert TSIM_STAT == STAT_COUNTERS and TSIM_INSN == INSN_COUNTERS
    prog, _ = gemm_program(small_cfg, 6, 10, 9)
    stats = run(prog).stats.as_dict()
    hardware = {name: stats.get(name, 7) for name in CSR_COUNTERS}  # timing counters: any value
    assert stats_from_counters(hardware) == {name: stats[name] for name in HARDWARE_STATISTICS}
    derived = stats_from_counters(hardware, prog)
    assert set(derived) == set(STATISTICS)
    assert derived == stats
    assert all(stats[name] > 0 for name in ("macs", "gemm_uops", "wgt_bytes_read", "load_to_compute_pushes"))


def test_report_columns_are_counters():
    from vta.compiler import report
    from vta.compiler.runtime import executor as runtime
    assert report.MODULE_COLUMNS == MODULE_CYCLE_COUNTERS
    assert {"macs", "gemm_uops", "alu_uops", "cycles"} <= set(report.COLUMNS) & set(CATALOGUE)
    stats = {name: 10 ** k for k, name in enumerate(STATISTICS)}
    assert runtime._stat_bytes(stats) == sum(stats[name] for name in BYTE_COUNTERS.values())
    hardware = {name: k for k, name in enumerate(CSR_COUNTERS)}
    modules = runtime._module_cycles(hardware)
    assert modules is not None
    assert {f"{m}_{c}": v for m, classes in modules.items() for c, v in classes.items()} == {
        name: hardware[name] for name in MODULE_CYCLE_COUNTERS}
