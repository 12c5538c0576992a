"""The compiled-model file (``.vtac``): a zip of plain numpy arrays and one JSON manifest, with no pickle.

Loading a pickle can run arbitrary code, so an artefact holds only data: it is an ``.npz`` container (a zip of
``.npy`` members, written by :func:`numpy.savez_compressed`, read by :func:`numpy.load` with ``allow_pickle=False``)
whose members are

* ``manifest``: ``uint8`` bytes of a UTF-8 JSON object (canonical form: sorted keys, no spaces) with

  - ``format``: ``"vta-lab compiled model"``; ``version``: :data:`FORMAT_VERSION`; ``vta_lab``: the writing
    ``vta.__version__``;
  - ``config``: ``{"name": canonical name, "fields": VTAConfig.to_dict()}``;
  - ``members``: every other member's name -> ``{"dtype": numpy dtype string, "shape": [...], "sha256": hex digest
    of the array's bytes in C order}``;
  - ``body``: what the writer stores (for a :class:`~.runtime.Compiled`, see :meth:`~.runtime.Compiled.to_data`);
  - ``sha256``: the digest of the canonical JSON of the manifest without this field.

* the arrays the body names, e.g. ``graph/constants/3`` or ``steps/4/program/dram``.

Reading (:func:`read_artefact`) is strict: an unknown format or version, a damaged zip, a missing, extra or duplicate
member, a member holding Python objects (refused before anything is unpickled), a dtype or shape other than the
manifest's, a digest mismatch or a body that does not decode all raise one :class:`ArtefactError` naming the file
and what is wrong. A file that loads is therefore bit-identical, in every array and every manifest value, to the one
written. Writing (:func:`write_artefact`) is atomic (:mod:`vta.fileio`).
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from os import PathLike
from typing import Any, Callable, Mapping, TypeVar

import numpy as np

from vta import __version__
from vta.config import VTAConfig
from vta.fileio import atomic_path

__all__ = ["ArtefactError", "FORMAT_NAME", "FORMAT_VERSION", "MANIFEST", "write_artefact", "read_artefact"]

FORMAT_NAME = "vta-lab compiled model"
FORMAT_VERSION = 2
"""Version 1 was a gzip'ed pickle (no longer read); version 2 is this zip of arrays and a JSON manifest."""
MANIFEST = "manifest"
_ALLOWED_KINDS = "biufU"  # bool, signed, unsigned, float, unicode: plain data, never objects
_ZIP_MAGIC = b"PK\x03\x04"
_GZIP_MAGIC = b"\x1f\x8b"
_READ_ERRORS = (Exception,)
"""What reading untrusted bytes through zipfile and numpy may raise, caught whole: the kinds are many and not part of
either library's contract (BadZipFile for a bad CRC, zlib.error for bad deflate data, EOFError for a cut-off stream,
NotImplementedError for an unknown compression method, RuntimeError for a flipped encryption flag, ValueError,
SyntaxError or tokenize.TokenError from numpy's .npy header parser, OverflowError or MemoryError for absurd sizes).
Only calls into those libraries are wrapped, so a bug of this module still shows its traceback."""
_DECODE_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError)
T = TypeVar("T")


class ArtefactError(ValueError):
    """A compiled-model file is not one this version wrote intact: not an artefact, another version, damaged or
    crafted. The message names the file and the problem."""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _array_digest(arr: np.ndarray) -> str:
    return _digest(np.ascontiguousarray(arr).tobytes())


def _canonical(manifest: Mapping[str, Any]) -> bytes:
    """The manifest's canonical JSON (sorted keys, no spaces, ASCII), without its ``sha256`` field."""
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")


# ---- writing --------------------------------------------------------------------------------------------------------
def write_artefact(path: str | PathLike[str], cfg: VTAConfig, body: Mapping[str, Any],
                   arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``body`` (JSON-able data) and ``arrays`` (member name -> plain numpy array) for ``cfg`` to ``path``
    atomically. Raises :class:`ValueError` for a member name or array this format cannot hold, :class:`TypeError`
    when ``body`` is not JSON-able, :class:`OSError` naming ``path`` when it cannot be written."""
    members: dict[str, dict[str, Any]] = {}
    for name, arr in arrays.items():
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"member {name} must be a numpy array, not {type(arr).__name__}")
        if not name or name == MANIFEST or name.endswith("/") or "\\" in name:
            raise ValueError(f"member name {name!r} is reserved or not a valid name; use names like 'graph/0'")
        if arr.dtype.kind not in _ALLOWED_KINDS:
            raise ValueError(f"member {name} has dtype {arr.dtype}; an artefact holds only bool, integer, float and "
                             f"unicode arrays")
        members[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "sha256": _array_digest(arr)}
    manifest: dict[str, Any] = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "vta_lab": __version__,
                                "config": {"name": cfg.name, "fields": cfg.to_dict()}, "members": members,
                                "body": body}
    manifest["sha256"] = _digest(_canonical(manifest))
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode("ascii")
    payload: dict[str, Any] = {MANIFEST: np.frombuffer(text, dtype=np.uint8), **arrays}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez_compressed(f, **payload)


# ---- reading --------------------------------------------------------------------------------------------------------
def read_artefact(path: str | PathLike[str],
                  decode: Callable[[Mapping[str, Any], Mapping[str, np.ndarray], VTAConfig], T]) -> T:
    """Read the artefact at ``path``, check it whole, and return ``decode(body, arrays, cfg)``.

    ``decode`` builds the caller's object; any ``KeyError``, ``TypeError``, ``ValueError``, ``IndexError`` or
    ``AttributeError`` it raises becomes an :class:`ArtefactError` (the body, though intact, does not describe what
    the caller expects). Raises :class:`ArtefactError` for every other problem (see the module docstring) and
    :class:`OSError` when the file cannot be opened at all.
    """
    where = str(path)
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == _GZIP_MAGIC:
        raise ArtefactError(f"{where} is a gzip file, as compiled models of artefact version 1 were (a pickle); "
                            f"loading a pickle can run arbitrary code, so this version of vta-lab refuses it; "
                            f"compile the model again with `vta compile`")
    if head != _ZIP_MAGIC:
        raise ArtefactError(f"{where} is not a vta-lab compiled model: it is not a zip file (it starts with "
                            f"{head!r}); write one with `vta compile MODEL -o FILE.vtac`")
    try:
        data = np.load(path, allow_pickle=False)
    except _READ_ERRORS as err:
        raise ArtefactError(f"{where} is truncated or damaged: its zip directory cannot be read ({err})") from None
    with data:
        manifest = _read_manifest(data, where)
        arrays = _read_members(data, manifest, where)
    cfg = _config(manifest, where)
    try:
        return decode(manifest["body"], arrays, cfg)
    except _DECODE_ERRORS as err:
        raise ArtefactError(f"the manifest of {where} does not describe a compiled model: {err}") from None


def _member_names(data: Any, where: str) -> list[str]:
    """The members of the npz (names without ``.npy``); refuses duplicates and members that are not ``.npy``."""
    names = [info.filename for info in data.zip.infolist()]
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:
        raise ArtefactError(f"{where} is damaged or crafted: member(s) {', '.join(twice)} appear more than once")
    return [name[:-4] if name.endswith(".npy") else name for name in names]


def _peek_dtype_shape(data: Any, name: str, where: str) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape in member ``name``'s .npy header, read without reading (or unpickling) its data."""
    try:
        with data.zip.open(f"{name}.npy") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    except _READ_ERRORS as err:
        raise ArtefactError(f"member {name} of {where} is corrupt: its array header cannot be read ({err})") from None
    if dtype.hasobject:
        raise ArtefactError(f"member {name} of {where} holds Python objects (dtype {dtype}), that is pickled data; an "
                            f"artefact holds plain arrays only, so it is refused without unpickling")
    return dtype, tuple(shape)


def _read_array(data: Any, name: str, where: str) -> np.ndarray:
    try:
        return np.asarray(data[name])
    except _READ_ERRORS as err:
        raise ArtefactError(f"member {name} of {where} is corrupt: it cannot be read ({err})") from None


def _read_manifest(data: Any, where: str) -> dict[str, Any]:
    """The manifest, checked: an object of this format and version whose digest matches its content."""
    names = _member_names(data, where)
    if MANIFEST not in names:
        raise ArtefactError(f"{where} is not a vta-lab compiled model: it has no {MANIFEST} member")
    dtype, shape = _peek_dtype_shape(data, MANIFEST, where)
    if dtype != np.uint8 or len(shape) != 1:
        raise ArtefactError(f"the manifest of {where} is corrupt: it is a {dtype} array of shape {shape}, not "
                            f"one-dimensional uint8 bytes")
    raw = _read_array(data, MANIFEST, where)
    try:
        manifest = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ArtefactError(f"the manifest of {where} is corrupt: it is not UTF-8 JSON ({err})") from None
    if not isinstance(manifest, dict):
        raise ArtefactError(f"the manifest of {where} is corrupt: it is a JSON {type(manifest).__name__}, not an "
                            f"object")
    if manifest.get("format") != FORMAT_NAME:
        raise ArtefactError(f"{where} is not a vta-lab compiled model: its manifest names format "
                            f"{manifest.get('format')!r}, not {FORMAT_NAME!r}")
    if manifest.get("version") != FORMAT_VERSION:
        raise ArtefactError(f"{where} has artefact version {manifest.get('version')!r} (written by vta-lab "
                            f"{manifest.get('vta_lab')}); this vta-lab ({__version__}) reads version "
                            f"{FORMAT_VERSION}; compile the model again")
    recorded, actual = manifest.get("sha256"), _digest(_canonical(manifest))
    if recorded != actual:
        raise ArtefactError(f"the manifest of {where} is corrupt: its SHA-256 is {actual}, it records {recorded!r}")
    expected = {"format", "version", "vta_lab", "config", "members", "body", "sha256"}
    if set(manifest) != expected or not isinstance(manifest["members"], dict):
        raise ArtefactError(f"the manifest of {where} does not describe a compiled model: it has fields "
                            f"{', '.join(sorted(manifest))}, not {', '.join(sorted(expected))}")
    return manifest


def _read_members(data: Any, manifest: Mapping[str, Any], where: str) -> dict[str, np.ndarray]:
    """Every member the manifest lists, each checked against its recorded dtype, shape and SHA-256."""
    listed: dict[str, Any] = manifest["members"]
    present = set(_member_names(data, where)) - {MANIFEST}
    missing, extra = sorted(set(listed) - present), sorted(present - set(listed))
    if missing:
        raise ArtefactError(f"{where} lacks member(s) {', '.join(missing)} that its manifest lists; the file is "
                            f"damaged")
    if extra:
        raise ArtefactError(f"{where} has member(s) {', '.join(extra)} that its manifest does not list; an artefact "
                            f"holds exactly the members its manifest lists")
    arrays = {}
    for name, entry in listed.items():
        want_dtype, want_shape, want_digest = _entry(entry, name, where)
        dtype, shape = _peek_dtype_shape(data, name, where)
        if dtype.str != want_dtype or list(shape) != want_shape:
            raise ArtefactError(f"member {name} of {where} has dtype {dtype.str} and shape {list(shape)}; its "
                                f"manifest records dtype {want_dtype} and shape {want_shape}")
        arr = _read_array(data, name, where)
        digest = _array_digest(arr)
        if digest != want_digest:
            raise ArtefactError(f"member {name} of {where} is corrupt: its SHA-256 is {digest}, the manifest records "
                                f"{want_digest}")
        arrays[name] = arr
    return arrays


def _entry(entry: Any, name: str, where: str) -> tuple[str, list[int], str]:
    """The (dtype, shape, sha256) a manifest entry records, checked to be of the kinds the writer produces."""
    ok = (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "sha256"}
          and isinstance(entry["dtype"], str) and isinstance(entry["sha256"], str)
          and isinstance(entry["shape"], list) and all(type(d) is int for d in entry["shape"]))
    if ok:
        try:
            ok = np.dtype(entry["dtype"]).kind in _ALLOWED_KINDS
        except (TypeError, ValueError):
            ok = False
    if not ok:
        raise ArtefactError(f"the manifest of {where} does not describe a compiled model: its entry for member "
                            f"{name} is {entry!r}, not a plain dtype, shape and sha256")
    return entry["dtype"], entry["shape"], entry["sha256"]


def _config(manifest: Mapping[str, Any], where: str) -> VTAConfig:
    """The config the manifest records, validated again; its canonical name must match."""
    config = manifest["config"]
    if not isinstance(config, dict) or set(config) != {"name", "fields"} or not isinstance(config["fields"], dict):
        raise ArtefactError(f"the manifest of {where} does not describe a compiled model: its config is {config!r}, "
                            f"not an object with a name and fields")
    try:
        cfg = VTAConfig.from_dict(config["fields"], source=where)
    except (TypeError, ValueError) as err:
        raise ArtefactError(f"the config in {where} is not valid: {err}") from None
    if cfg.name != config["name"]:
        raise ArtefactError(f"the config in {where} is named {config['name']!r} but its fields make "
                            f"{cfg.name!r}")
    return cfg
