"""Reading the text files a person hands the command line (configs, technology files, assembly source): every
failure is a :class:`TextFileError` whose message names the file and says what is wrong with it, never a decoder's
bare message or a traceback.

* :func:`read_text` reads a file as UTF-8 text of at most ``limit`` bytes; :func:`read_stream` does the same for an
  open binary stream (standard input). Both read in chunks and decode as they go, so an endless stream of invalid
  bytes fails at the first one and an endless valid one at the limit, not by running out of memory.
* :func:`parse_json` and :func:`parse_toml` turn a document into Python data. Nesting deeper than the parsers can
  follow (Python's recursion limit: about 1000 arrays or objects inside one another in JSON, fewer in TOML) and, in
  JSON, a key given twice in one object are errors too; TOML refuses a repeated key itself.

On the ground floor: imports nothing from the package.
"""
from __future__ import annotations

import codecs
import json
import os
import tomllib
from typing import Any, BinaryIO

__all__ = ["TextFileError", "read_text", "read_stream", "parse_json", "parse_toml", "MAX_DOCUMENT_BYTES"]

MAX_DOCUMENT_BYTES = 1 << 20
"""The largest config or technology file read, bytes (1 MiB; a complete one is under 2 KiB)."""
_CHUNK = 1 << 20


class TextFileError(ValueError):
    """A file could not be read as the text or document it should be. ``source`` names the file, ``reason`` says
    what is wrong (a sentence without the file's name, for callers that name the file themselves)."""

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


def read_text(path: str | os.PathLike[str], *, limit: int | None = MAX_DOCUMENT_BYTES) -> str:
    """The text of the file at ``path``, decoded as UTF-8 (a leading byte-order mark is kept, as ``read_text``
    keeps it). Raises :class:`OSError` when the file cannot be opened or read, :class:`TextFileError` when it is
    not UTF-8 or holds more than ``limit`` bytes (None: no limit)."""
    with open(path, "rb") as stream:
        return read_stream(stream, os.fspath(path), limit=limit)


def read_stream(stream: BinaryIO, source: str, *, limit: int | None = MAX_DOCUMENT_BYTES,
                what: str = "the file") -> str:
    """The text of the binary ``stream`` (named ``source`` in errors, called ``what`` in their sentences) up to its
    end, decoded as UTF-8 chunk by chunk: :class:`TextFileError` at the first byte that is not UTF-8 or as soon as
    it holds more than ``limit`` bytes (None: no limit)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    parts: list[str] = []
    total = 0  # bytes read so far
    while True:
        chunk = stream.read(_CHUNK if limit is None else min(_CHUNK, limit + 1 - total))
        if limit is not None and total + len(chunk) > limit:
            raise TextFileError(source, f"{what} holds more than {limit:,} bytes, the most that is read; give a "
                                        f"smaller one")
        pending = len(decoder.getstate()[0])  # bytes of a character split across chunks, decoded with this one
        try:
            parts.append(decoder.decode(chunk, final=not chunk))
        except UnicodeDecodeError as err:
            raise TextFileError(source, f"{what} is not UTF-8 text: byte 0x{err.object[err.start]:02x} at position "
                                        f"{total - pending + err.start} cannot be decoded ({err.reason}); save it "
                                        f"as UTF-8") from None
        total += len(chunk)
        if not chunk:
            return "".join(parts)


class _DuplicateKey(ValueError):
    pass


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An ``object_pairs_hook``: the object as a dict, or :class:`_DuplicateKey` naming a key given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


_TOO_DEEP = "the file is nested too deeply (arrays or tables inside one another beyond what the parser can follow)"


def parse_json(text: str, source: str) -> Any:
    """The JSON document ``text`` (from ``source``) as Python data; :class:`TextFileError` when it is not valid
    JSON, is nested too deeply, or gives one key twice in an object."""
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as err:
        raise TextFileError(source, f"the key {err.args[0]!r} is given twice in one object; give each key once"
                            ) from None
    except json.JSONDecodeError as err:
        raise TextFileError(source, f"the file is not valid JSON: {err}") from None
    except RecursionError:
        raise TextFileError(source, _TOO_DEEP) from None


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """The TOML document ``text`` (from ``source``) as a dict; :class:`TextFileError` when it is not valid TOML or
    is nested too deeply."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise TextFileError(source, f"the file is not valid TOML: {err}") from None
    except RecursionError:
        raise TextFileError(source, _TOO_DEEP) from None
