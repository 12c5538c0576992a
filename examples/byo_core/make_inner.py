"""Write the inner core of the byo_core example: the generated ``vta_core`` for a config, renamed ``vta_core_inner``.

    python examples/byo_core/make_inner.py [--config FILE] -o DIR    writes DIR/vta_core_inner.v and DIR/core.f

``core.f`` lists a copy of the hand-written wrapper (``byo_core.v`` beside this script, its bus-width parameter ``B``
set to the config's ``bus_bytes``) and the inner core, so ``vta conform --rtl DIR/core.f --top byo_core`` finds
everything.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from vta.config import VTAConfig, load_config
from vta.hw.verilog import generate_verilog

HERE = Path(__file__).resolve().parent


def make_inner(cfg: VTAConfig, out_dir: Path) -> Path:
    """Write ``vta_core_inner.v``, ``byo_core.v`` (the wrapper with ``B`` set to ``cfg.bus_bytes``) and ``core.f``
    listing both into ``out_dir``; returns the ``core.f``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = Path(generate_verilog(cfg, out_dir)).read_text()
    header = "module vta_core("
    if text.count(header) != 1:
        raise ValueError(f"expected one '{header}' in the generated Verilog, found {text.count(header)}")
    (out_dir / "vta_core_inner.v").write_text(text.replace(header, "module vta_core_inner("))
    (out_dir / "vta_core.v").unlink()
    wrapper = (HERE / "byo_core.v").read_text()
    default = "module byo_core #(parameter B = 8)"
    if wrapper.count(default) != 1:
        raise ValueError(f"expected one '{default}' in byo_core.v")
    (out_dir / "byo_core.v").write_text(wrapper.replace(default, f"module byo_core #(parameter B = {cfg.bus_bytes})"))
    listing = out_dir / "core.f"
    listing.write_text("// the byo_core example: the hand-written wrapper and the renamed generated core\n"
                       "byo_core.v\nvta_core_inner.v\n")
    return listing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="accelerator config (default: VTA's defaults)")
    parser.add_argument("-o", "--output", required=True, help="folder to write into")
    args = parser.parse_args()
    cfg = load_config(args.config) if args.config else VTAConfig()
    print(make_inner(cfg, Path(args.output)))


if __name__ == "__main__":
    main()
