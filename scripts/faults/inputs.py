"""Probe families of bad input: malformed programs (fsim vs tsim), damaged artefacts and program files, bad configs,
bad models and model inputs. Each family is a function ``(ctx, rng) -> list[Probe]``, seeded and deterministic."""
from __future__ import annotations

import gzip
import io
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .context import CONFIGS, Context
from .core import Probe, Run, Verdict, execute, judge_cli, judge_worker, vta_argv, worker_argv

MARKER = "PWNED"
"""The file a planted payload would create in the probe's folder."""


class Payload:
    """Unpickling this runs ``touch PWNED`` in the current folder: what a loader that unpickles must never do."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os
        return os.system, (f"touch {MARKER}",)


PAYLOAD_TEXT = f"__import__('os').system('touch {MARKER}')"
"""A string that creates the marker if anything ever evaluates it."""


def _pickled_member() -> bytes:
    """An ``.npy`` member holding an object array whose pickle runs :class:`Payload`."""
    buf = io.BytesIO()
    np.save(buf, np.array([Payload()], dtype=object), allow_pickle=True)
    return buf.getvalue()


# ---- malformed programs: fsim vs tsim ----------------------------------------------------------------------------
def program_probes(ctx: Context, rng: np.random.Generator, count: int) -> list[Probe]:
    """Random programs (:func:`vta.testing.random_program`) with corrupted instruction bits, micro-ops, DRAM bytes,
    allocation table or stream offset, run on fsim and tsim (when built) at three configs: they must agree."""
    from .worker import CORRUPTIONS
    probes = []
    for k in range(count):
        names = list(CONFIGS)
        config = names[k % len(names)]
        kind = CORRUPTIONS[k % len(CORRUPTIONS)]  # 5 kinds, 3 configs: every pair within 15 probes
        payload = {"config": CONFIGS[config], "seed": int(rng.integers(1 << 31)), "kind": kind,
                   "tsim": config in ctx.tsim_configs}
        probes.append(Probe("programs", f"{config} {kind} seed={payload['seed']}", worker_argv("cosim", payload),
                            judge=lambda run: judge_worker(run, _cosim_verdict), timeout=180))
    return probes


def _cosim_verdict(result: dict[str, Any]) -> Verdict:
    verdict = result["verdict"]
    what = result.get("corruption", "")
    if verdict in ("agree-ok", "fsim-ok"):
        return Verdict("ok", f"{what}: {'fsim and tsim agree' if verdict == 'agree-ok' else 'fsim only'}")
    if verdict in ("agree-error", "load-error", "fsim-error"):
        err = result.get("error") or result.get("fsim") or {}
        return Verdict("clear", f"{what}: {err.get('class')} at {err.get('index')}")
    return Verdict("wrong", f"{what}: fsim and tsim disagree ({result.get('why')}): fsim {result.get('fsim')}, "
                            f"tsim {result.get('tsim')}")


# ---- damaged artefacts and program files -------------------------------------------------------------------------
def _zip_members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(info.filename, z.read(info.filename)) for info in z.infolist()]


def _write_zip(path: Path, members: list[tuple[str, bytes]]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in members:
            z.writestr(name, content)


def _damage(kind: str, original: bytes, rng: np.random.Generator) -> Callable[[Path], None]:
    """A setup that writes ``original`` damaged by ``kind`` to ``target`` in the probe folder."""
    def setup(path: Path) -> None:
        data = bytearray(original)
        if kind == "flip":
            for spot in rng.integers(0, len(data), size=int(rng.integers(1, 9))):
                data[int(spot)] ^= int(rng.integers(1, 256))
            path.write_bytes(bytes(data))
        elif kind == "truncate":
            path.write_bytes(bytes(data[:int(rng.integers(0, len(data)))]))
        elif kind == "swap":
            members = _zip_members(original)
            i, j = rng.choice(len(members), size=2, replace=False)
            (ni, ci), (nj, cj) = members[i], members[j]
            members[i], members[j] = (ni, cj), (nj, ci)
            _write_zip(path, members)
        elif kind == "pickle_member":
            members = _zip_members(original)
            i = int(rng.integers(len(members)))
            members[i] = (members[i][0], _pickled_member())
            _write_zip(path, members)
        elif kind == "pickle_extra":
            _write_zip(path, _zip_members(original) + [("evil.npy", _pickled_member())])
        elif kind == "pickle_v1":
            path.write_bytes(gzip.compress(pickle.dumps(Payload())))
        elif kind == "raw_pickle":
            path.write_bytes(pickle.dumps(Payload()))
        else:
            raise ValueError(kind)
    return setup


ARTEFACT_DAMAGE = ("pickle_member", "pickle_v1", "flip", "pickle_extra", "raw_pickle", "truncate", "swap")
"""The kinds of damaged file, in the order the probes cycle through them (the four pickles within the first five)."""


def artefact_probes(ctx: Context, rng: np.random.Generator, count: int) -> list[Probe]:
    """Damaged ``.vtac`` artefacts to ``vta run`` and damaged ``.npz`` programs to ``vta run``/``vta disasm``; a
    command that succeeds must have read exactly the original (its digest, read again, equals the reference's)."""
    probes = []
    for k in range(count):
        kind = ARTEFACT_DAMAGE[k % len(ARTEFACT_DAMAGE)]
        ref = ["vtac", "npz"][k % 2]  # 7 kinds, 2 files: every pair within 14 probes
        name = "model.vtac" if ref == "vtac" else "prog.npz"
        setup = _damage(kind, ctx.refs[ref].read_bytes(), np.random.default_rng(rng.integers(1 << 31)))
        if ref == "vtac":
            argv = vta_argv("run", name, "--no-progress")
        else:
            argv = vta_argv("disasm", name) if k % 3 else vta_argv("run", name)
        probes.append(Probe("artefacts", f"{ref} {kind} #{k}", argv, setup=_at(name, setup), marker=MARKER,
                            judge=_same_content(ctx, ref, name)))
    probes.append(Probe("artefacts", "vtac with a payload string in a valid manifest",
                        vta_argv("run", "model.vtac", "--no-progress"), setup=_at("model.vtac", _payload_manifest(ctx)),
                        marker=MARKER))
    return probes


def _at(name: str, setup: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda folder: setup(folder / name)


def _same_content(ctx: Context, ref: str, name: str) -> Callable[[Run], Verdict]:
    """Exit 0 is right only if the file, read again by the library, holds exactly the reference's content."""
    def check(run: Run) -> Verdict:
        kind = "vtac" if ref == "vtac" else "npz"
        again = execute(Probe("check", "digest", worker_argv("digest", {"path": str(run.folder / name),
                                                                        "kind": kind})), run.folder, ctx.env)
        result = again.result() or {}
        if result.get("digest") == ctx.digests[ref]:
            return Verdict("ok", "read back identical to the original")
        return Verdict("wrong", f"exit 0, but the file does not hold the original: {result}")
    return lambda run: judge_cli(run, check)


def _payload_manifest(ctx: Context) -> Callable[[Path], None]:
    """A correctly signed artefact whose manifest carries the payload string in the graph's name and a meta value."""
    def setup(path: Path) -> None:
        from vta.compiler.runtime.artefact import _canonical, _digest
        members = dict(_zip_members(ctx.refs["vtac"].read_bytes()))
        manifest = json.loads(np.load(io.BytesIO(members["manifest.npy"])).tobytes())
        manifest["body"]["graph"]["name"] = PAYLOAD_TEXT
        manifest["body"]["meta"] = {"x": PAYLOAD_TEXT}
        manifest.pop("sha256", None)
        manifest["sha256"] = _digest(_canonical(manifest))
        buf = io.BytesIO()
        np.save(buf, np.frombuffer(_canonical(manifest), np.uint8))
        members["manifest.npy"] = buf.getvalue()
        _write_zip(path, list(members.items()))
    return setup


# ---- bad configs -------------------------------------------------------------------------------------------------
CONFIG_KEYS = ("TARGET", "HW_VER", "LOG_INP_WIDTH", "LOG_WGT_WIDTH", "LOG_ACC_WIDTH", "LOG_BATCH", "LOG_BLOCK",
               "LOG_UOP_BUFF_SIZE", "LOG_INP_BUFF_SIZE", "LOG_WGT_BUFF_SIZE", "LOG_ACC_BUFF_SIZE")


def _bad_config(kind: str, rng: np.random.Generator) -> tuple[str, str]:
    """(file suffix, text) of a damaged config of the given kind."""
    base: dict[str, Any] = json.loads((CONFIGS_DIR / "vta_config.json").read_text())
    key = str(rng.choice([k for k in base if k.startswith("LOG_")]))
    if kind == "range":
        base[key] = int(rng.choice([-1, 0, 7, 31, 64, 1 << 40]))
    elif kind == "block64":
        base["LOG_BLOCK"] = 6
    elif kind == "type":
        base[key] = [str(rng.choice(["4", "x"])), 4.5, [4], None, True, {"a": 1}][int(rng.integers(6))]
    elif kind == "unknown":
        base["LOG_BLOKC"] = 4
    elif kind == "payload":
        base[key] = PAYLOAD_TEXT
    elif kind == "missing":
        base.pop(key)
    if kind in ("toml_garbage", "json_garbage"):
        text = _toml(base) if kind == "toml_garbage" else json.dumps(base)
        cut = int(rng.integers(1, len(text)))
        text = text[:cut] + str(rng.choice(["", "[[", "= =", "\x00\xff", "{", '"'])) + text[cut + 1:]
        return (".toml" if kind == "toml_garbage" else ".json"), text
    if kind == "binary":
        return ".toml", bytes(rng.integers(0, 256, 200, dtype=np.uint8)).decode("latin-1")
    return (".json", json.dumps(base)) if rng.integers(2) else (".toml", _toml(base))


def _toml(data: dict[str, Any]) -> str:
    lines = []
    for key, value in data.items():
        if value is None:
            continue
        lines.append(f"{key} = {json.dumps(value) if not isinstance(value, bool) else str(value).lower()}")
    return "\n".join(lines) + "\n"


CONFIGS_DIR = Path(CONFIGS["small1x8"]).parent
CONFIG_DAMAGE = ("range", "payload", "toml_garbage", "block64", "type", "binary", "unknown", "missing", "json_garbage")


def config_probes(ctx: Context, rng: np.random.Generator, count: int) -> list[Probe]:
    """Bad configs to ``vta config check`` and ``vta run --config`` (a small GEMM); a run that succeeds must say its
    result is correct."""
    probes = []
    for k in range(count):
        kind = CONFIG_DAMAGE[k % len(CONFIG_DAMAGE)]
        suffix, text = _bad_config(kind, rng)
        name = f"cfg{suffix}"
        if k % 2 == 0:  # 9 kinds, 2 commands: every pair within 18 probes
            argv = vta_argv("config", "check", name)
            judge: Callable[[Run], Verdict] = judge_cli
        else:
            argv = vta_argv("run", "--config", name, "--m", "16", "--k", "16", "--n", "16", "--json")
            judge = _gemm_correct
        probes.append(Probe("configs", f"{kind} {suffix} #{k}", argv, setup=_text_file(name, text), judge=judge,
                            marker=MARKER))
    return probes


def _text_file(name: str, text: str) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        (folder / name).write_text(text, encoding="latin-1")
    return setup


def _gemm_correct(run: Run) -> Verdict:
    def check(r: Run) -> Verdict:
        try:
            correct = json.loads(r.stdout)["correct"]
        except (ValueError, KeyError):
            return Verdict("wrong", "exit 0 without a JSON report")
        return Verdict("ok", "a valid config") if correct else Verdict("wrong", "exit 0 with a wrong GEMM result")
    return judge_cli(run, check)
