"""Suggestions for a mistyped name: the close match that error messages offer ("did you mean ...?").

On the ground floor with no project imports, so that the config's validation and the command line can both use it.
"""
from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["close_matches", "did_you_mean"]


def close_matches(word: str, choices: Iterable[str], n: int = 1) -> list[str]:
    """Up to ``n`` of ``choices`` closest to ``word`` (closest first; difflib's ratio of at least 0.6), or none."""
    return difflib.get_close_matches(word, list(choices), n=n)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean NAME?)"`` naming the one of ``choices`` closest to ``word``, or ``""`` when none is close;
    appended right after the word in a message that names it."""
    close = close_matches(word, choices)
    return f" (did you mean {close[0]}?)" if close else ""
