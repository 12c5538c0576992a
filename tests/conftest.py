"""Shared fixtures: a few configs every suite can use, and the generated core of configs/small1x8.toml."""
from __future__ import annotations

from pathlib import Path

import pytest

from vta.config import VTAConfig, load_config

# Small buffers and an unusual shape (BATCH 2, BLOCK 4): catches layout and depth mistakes; tiny queues catch
# token-capacity mistakes.
SMALL_CFG = VTAConfig(log_batch=1, log_block=2, log_uop_buff_size=7, log_inp_buff_size=8, log_wgt_buff_size=9,
                      log_acc_buff_size=10, cmd_queue_depth=2, token_queue_depth=2)


@pytest.fixture
def cfg() -> VTAConfig:
    """VTA's default design (1x16_i8w8a32_15_15_18_17)."""
    return VTAConfig()


@pytest.fixture
def small_cfg() -> VTAConfig:
    """BATCH 2, BLOCK 4, 32 entries in every buffer, queues of depth 2."""
    return SMALL_CFG


# BATCH 4, BLOCK 8 and buffers of 4 to 16 entries, queues of depth 2: the GEMM program and the program generators
# must fit even this.
TINY = VTAConfig(log_batch=2, log_block=3, log_uop_buff_size=6, log_inp_buff_size=8, log_wgt_buff_size=8,
                 log_acc_buff_size=9, cmd_queue_depth=2, token_queue_depth=2)


SMALL1X8_TOML = Path(__file__).resolve().parent.parent / "configs" / "small1x8.toml"
"""The shipped small config (BLOCK 8, bus 8 bytes): the one the bring-your-own-RTL tests and the conformance kit
build a core for."""


@pytest.fixture(scope="module")
def small_cfg8() -> VTAConfig:
    """configs/small1x8.toml."""
    return load_config(SMALL1X8_TOML)


@pytest.fixture(scope="module")
def small_core(tmp_path_factory: pytest.TempPathFactory, small_cfg8: VTAConfig) -> Path:
    """The generated core of configs/small1x8.toml, as a user would bring it (vta hw verilog -o DIR); one per test
    module, so a test that edits it (and restores it) cannot disturb another module's."""
    from vta.hw.verilog import generate_verilog  # Amaranth only for the tests that use the core
    return Path(generate_verilog(small_cfg8, tmp_path_factory.mktemp("small")))


@pytest.fixture
def unbuilt_parts_are_expected():
    """For tests that elaborate a component one level to look at its parts and never build them: Amaranth would warn
    about each part ("created but never used") as it is collected."""
    import gc
    import warnings

    from amaranth.hdl import UnusedElaboratable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        yield
        gc.collect()


@pytest.fixture(autouse=True)
def _same_random_values_in_any_order(request: pytest.FixtureRequest) -> None:
    """A module that sets ``RNG_SEED`` draws from a fresh ``RNG`` of that seed in each test, so each test draws the
    same values whichever worker runs it after whichever other test."""
    import numpy as np
    seed = getattr(request.module, "RNG_SEED", None)
    if seed is not None:
        request.module.RNG = np.random.default_rng(seed)
