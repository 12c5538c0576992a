"""vta.hw: the Amaranth generator of the VTA-like core (installed from hw/)."""
