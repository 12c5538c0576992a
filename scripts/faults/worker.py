"""The fault campaign's library-API probes, each run in a subprocess of its own: ``python worker.py TASK JSON``.

The worker prints one line ``FAULT-RESULT {json}`` on standard output and exits 0 when the task ran to its end
(whatever the library did: a documented exception is a result, not a failure of the worker). An undocumented
exception escapes as a traceback, a crash kills the process: the campaign counts both.

Tasks:
- ``cosim {"config", "seed", "kind", "tsim"}``: a corrupted random program (:mod:`vta.testing`) on fsim and on tsim
  (default check), compared; when fsim rejects the program, tsim also runs it raw (``check="none"``) to see that the
  RTL stops cleanly. With ``"tsim": false`` (no build at that config) fsim runs it twice, which must agree.
- ``digest {"path", "kind"}``: load a ``.vtac`` (``Compiled``'s reader) or a ``.npz`` program and print a SHA-256
  of everything it holds, to compare with the original's.
- ``clean_stale {"root"}``: what a build does when it starts: :func:`vta.cache.clean_stale`.
- ``verify {"folder", "required"}``: :func:`vta.cache.verify_entry` of one cache entry.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

DOCUMENTED: tuple[str, ...] = ("ValueError", "TypeError", "SimulationError", "TsimError", "BuildError")
"""Base classes of the library's documented exceptions (a subclass of one of these is a clear error)."""

CORRUPTIONS = ("insn_bits", "uop_bits", "dram_bytes", "alloc_table", "insn_offset")
"""The ways :func:`corrupt_arrays` damages a program's arrays."""


def _describe(err: BaseException) -> dict[str, Any]:
    """An exception as data: its class, the documented base it has (or None), its instruction index, its message."""
    names = [cls.__name__ for cls in type(err).__mro__]
    documented = next((name for name in DOCUMENTED if name in names), None)
    return {"class": type(err).__name__, "documented": documented, "index": getattr(err, "insn_index", None),
            "message": str(err).splitlines()[0][:300] if str(err) else ""}


def corrupt_arrays(arrays: dict[str, np.ndarray], kind: str, rng: np.random.Generator, insn_bytes: int) -> str:
    """Damage the arrays of ``Program.to_arrays`` in place, keeping the stream in the DRAM image equal to ``insns``
    (so the damage reaches the decoder and the simulators, not only the consistency check). Returns a description."""
    meta = json.loads(str(arrays["meta"]))
    insns = arrays["insns"].copy()
    dram = arrays["dram"].copy()
    offset = int(meta["insn_offset"])
    allocs = {a["name"]: a for a in meta["allocations"]}
    if kind == "insn_bits":
        k = int(rng.integers(insns.shape[0]))
        bits = rng.choice(insn_bytes * 8, size=int(rng.integers(1, 4)), replace=False)
        for bit in bits:
            insns[k, bit // 8] ^= np.uint8(1 << (bit % 8))
        dram[offset:offset + insns.size] = insns.reshape(-1)
        what = f"flipped bits {sorted(int(b) for b in bits)} of instruction {k}"
    elif kind == "uop_bits":
        pool = allocs["uop_pool"]
        word = int(rng.integers(pool["offset"] // 4, (pool["offset"] + int(np.prod(pool["shape"])) * 4) // 4))
        bit = int(rng.integers(32))
        dram[word * 4 + bit // 8] ^= np.uint8(1 << (bit % 8))
        what = f"flipped bit {bit} of micro-op word at byte {word * 4}"
    elif kind == "dram_bytes":
        spots = rng.integers(0, offset, size=int(rng.integers(1, 9))) if offset else np.zeros(0, np.int64)
        for spot in spots:
            dram[spot] = np.uint8(rng.integers(256))
        what = f"overwrote DRAM bytes {sorted(int(s) for s in spots)}"
    elif kind == "alloc_table":
        name = str(rng.choice(sorted(allocs)))
        field = str(rng.choice(["offset", "shape", "dtype"]))
        if field == "offset":
            allocs[name]["offset"] = int(rng.choice([-64, dram.size, dram.size - 1, int(rng.integers(0, dram.size))]))
        elif field == "shape":
            allocs[name]["shape"] = [int(rng.integers(-2, 1 << 20))]
        else:
            allocs[name]["dtype"] = str(rng.choice(["object", "int64", "float32", "bogus", "O"]))
        what = f"allocation {name!r} field {field} -> {allocs[name][field]!r}"
    elif kind == "insn_offset":
        meta["insn_offset"] = int(rng.choice([-16, 1, offset + 16, dram.size, offset - 16]))
        what = f"insn_offset {offset} -> {meta['insn_offset']}"
    else:
        raise ValueError(f"unknown corruption {kind!r}; known: {', '.join(CORRUPTIONS)}")
    arrays.update(meta=np.array(json.dumps(meta)), insns=insns, dram=dram)
    return what


def _attempt(fn: Callable[[], Any]) -> tuple[Any, dict[str, Any] | None]:
    """``fn()`` and None, or None and the documented exception it raised (undocumented ones propagate)."""
    try:
        return fn(), None
    except Exception as err:  # classified: the campaign counts undocumented classes as tracebacks
        info = _describe(err)
        if info["documented"] is None:
            raise
        return None, info


def task_cosim(args: dict[str, Any]) -> dict[str, Any]:
    """A corrupted random program on fsim and tsim; the verdict is ``agree-ok``, ``agree-error``, ``load-error``
    or ``disagree`` (with what differs)."""
    from vta.backend import get_backend
    from vta.config import VTAConfig, load_config
    from vta.program import Program
    from vta.testing import random_program
    cfg = VTAConfig() if args["config"] == "default" else load_config(args["config"])
    rng = np.random.default_rng(args["seed"])
    program = random_program(cfg, rng, n_ops=int(rng.integers(6, 20)))
    arrays = program.to_arrays()
    what = corrupt_arrays(arrays, args["kind"], rng, program.insn_bytes)
    damaged, error = _attempt(lambda: Program.from_arrays(arrays, source="the corrupted program"))
    out: dict[str, Any] = {"corruption": what}
    if error is not None:
        return {**out, "verdict": "load-error", "error": error}
    fsim, fsim_err = _attempt(lambda: get_backend("fsim").run(damaged))
    if not args.get("tsim", True):  # no tsim build at this config: fsim alone, run twice (it must be deterministic)
        again, again_err = _attempt(lambda: get_backend("fsim").run(damaged))
        if (fsim_err is None) != (again_err is None) or (fsim_err is None and not np.array_equal(fsim.dram,
                                                                                                 again.dram)):
            return {**out, "fsim": fsim_err, "verdict": "disagree", "why": "two fsim runs differ"}
        return {**out, "fsim": fsim_err, "verdict": "fsim-ok" if fsim_err is None else "fsim-error"}
    tsim, tsim_err = _attempt(lambda: get_backend("tsim").run(damaged))
    out.update(fsim=fsim_err, tsim=tsim_err)
    if fsim_err is None and tsim_err is None:
        same = bool(np.array_equal(fsim.dram, tsim.dram)) and dict(fsim.stats) == dict(tsim.stats)
        return {**out, "verdict": "agree-ok" if same else "disagree", "why": "" if same else "results differ"}
    if fsim_err is None or tsim_err is None:
        return {**out, "verdict": "disagree", "why": "one backend failed, the other did not"}
    if (fsim_err["class"], fsim_err["index"]) != (tsim_err["class"], tsim_err["index"]):
        return {**out, "verdict": "disagree", "why": "different error class or instruction"}
    raw, raw_err = _attempt(lambda: get_backend("tsim", check="none").run(damaged))
    out["raw"] = raw_err if raw_err is not None else "finished"
    return {**out, "verdict": "agree-error"}


def _hash_arrays(h: Any, arrays: dict[str, np.ndarray]) -> None:
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{arr.dtype.str}:{arr.shape}\0".encode())
        h.update(arr.tobytes())


def task_digest(args: dict[str, Any]) -> dict[str, Any]:
    """The SHA-256 of what a ``.vtac`` or ``.npz`` program file holds as the library reads it, or its error."""
    h = hashlib.sha256()
    if args["kind"] == "vtac":
        from vta.compiler.runtime.artefact import read_artefact

        def decode(body: Any, arrays: Any, cfg: Any) -> None:
            h.update(json.dumps(body, sort_keys=True).encode())
            h.update(cfg.name.encode())
            _hash_arrays(h, dict(arrays))
        _, error = _attempt(lambda: read_artefact(args["path"], decode))
    else:
        from vta.program import Program
        program, error = _attempt(lambda: Program.load(args["path"]))
        if program is not None:
            _hash_arrays(h, program.to_arrays())
    return {"error": error} if error is not None else {"digest": h.hexdigest()}


def task_clean_stale(args: dict[str, Any]) -> dict[str, Any]:
    """Remove the temporary folders killed builds left in ``root``, as the next build does when it starts."""
    from vta.cache import clean_stale
    return {"removed": [str(p) for p in clean_stale(Path(args["root"]))]}


def task_verify(args: dict[str, Any]) -> dict[str, Any]:
    """Whether a cache entry passes its manifest check (``problem`` None) or what is wrong with it."""
    from vta.cache import verify_entry
    return {"problem": verify_entry(Path(args["folder"]), args.get("required", []))}


TASKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "cosim": task_cosim, "digest": task_digest, "clean_stale": task_clean_stale, "verify": task_verify}


def main(argv: list[str]) -> int:
    """Run one task and print its result line."""
    task, payload = argv[0], json.loads(argv[1])
    result = TASKS[task](payload)
    print("FAULT-RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
