"""Tip sampling dates: a TSV file or dates written in the taxon names."""

from __future__ import annotations

import os
import re

import numpy as np

from .._errors import InputError

_NAME_DATE = re.compile(r"[_|/@]([0-9]+(?:\.[0-9]*)?)$")


def read_dates(path) -> dict[str, float]:
    """`taxon<TAB>decimal year` per line; a first line whose date is not a number is a header."""
    path = os.fspath(path)
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError as err:
        raise InputError(f"{path}: cannot read dates: {err.strerror}") from None
    dates: dict[str, float] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.rstrip("\n").split("\t")
        if len(fields) < 2:
            raise InputError(f"{path}: line {number}: expected 'taxon<TAB>date', got {line!r}")
        name, text = fields[0].strip(), fields[1].strip()
        try:
            value = float(text)
        except ValueError:
            if number == 1:
                continue  # a header
            raise InputError(f"{path}: line {number}: date {text!r} of {name!r} is not a number") from None
        if not np.isfinite(value):
            raise InputError(f"{path}: line {number}: date of {name!r} is not finite")
        if name in dates:
            raise InputError(f"{path}: line {number}: taxon {name!r} has two dates")
        dates[name] = value
    if not dates:
        raise InputError(f"{path}: no dates found")
    return dates


def dates_from_names(taxa) -> dict[str, float]:
    """Dates at the end of the names, after `_`, `|`, `/` or `@`: `A/Brazil/1982`, `seq_1999.5`."""
    dates = {}
    for name in taxa:
        match = _NAME_DATE.search(name)
        if match is None:
            raise InputError(f"taxon {name!r} has no date at the end of its name (e.g. 'name_1999.5')")
        dates[name] = float(match.group(1))
    return dates


def tip_heights(dates: dict[str, float], taxa, source: str = "dates") -> np.ndarray:
    """Heights before the latest sample, `max(date) - date`, in the order of `taxa`."""
    known = set(taxa)
    if extra := sorted(set(dates) - known):
        raise InputError(f"{source}: taxon {extra[0]!r} has a date but is not in the tree")
    if missing := [t for t in taxa if t not in dates]:
        raise InputError(f"{source}: taxon {missing[0]!r} of the tree has no date")
    values = np.array([dates[t] for t in taxa])
    return values.max() - values
