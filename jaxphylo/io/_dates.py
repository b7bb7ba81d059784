"""Tip sampling dates: a TSV file or dates written in the taxon names.

Date forms and their decimal years (TreeTime's convention; leap years counted):

- a decimal number with a point, `1999.5` or `2004.0`: that exact decimal year;
- a full ISO date, `2004-07-12`: the middle of that day, exact,
  `year + (day_of_year - 0.5) / days_in_year` (2004-07-12 -> 2004 + 193.5/366);
- a month, `2004-07`: the interval from the start of its first day to the end
  of its last, `[year + (d_first - 1) / D, year + d_last / D]`;
- an integer year with no point, `2004`: the whole year `[2004, 2005]`, as
  BEAST and TreeTime read a bare year (write `2004.0` for the exact value);
- empty, `NA` or `?` (TSV), or `|?`, `_NA` at the end of a name: undated.

A date whose first moment is after today (`datetime.date.today()`) is an
error; an interval that runs past today (this year, this month) ends today.

`read_tip_dates` and `tip_dates_from_names` give a `TipDates`; its `heights`
turns them into tip heights for a tree's taxa. The older `read_dates`,
`dates_from_names` and `tip_heights` read numbers only, each one exact.
"""

from __future__ import annotations

import calendar
import datetime
import hashlib
import os
import re
from dataclasses import dataclass

import numpy as np
from jaxtyping import Float

from .._errors import InputError

_NAME_DATE = re.compile(r"[_|/@]([0-9]+(?:\.[0-9]*)?)$")
_NAME_ANY_DATE = re.compile(r"[_|/@]([0-9]{4}-[0-9]{1,2}(?:-[0-9]{1,2})?|[0-9]+(?:\.[0-9]*)?|NA|\?)$", re.IGNORECASE)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_YEAR = re.compile(r"[+-]?[0-9]+$")
_ISO = re.compile(r"([0-9]{4})-([0-9]{1,2})(?:-([0-9]{1,2}))?$")
_UNDATED = {"", "na", "n/a", "?"}
_TAXON_COLUMNS = ("taxon", "name", "strain")


@dataclass(frozen=True)
class TipHeights:
    """Tip heights before the decimal year `reference`, `lower <= height <= upper` per tip.

    A tip is fixed where `lower == upper`, and has a uniform prior on
    `[lower, upper]` otherwise. `height = reference - date`.
    """

    lower: Float[np.ndarray, " tips"]
    upper: Float[np.ndarray, " tips"]
    reference: float

    @property
    def fixed(self) -> bool:
        return bool(np.all(self.lower == self.upper))


@dataclass(frozen=True)
class TipDates:
    """Sampling dates in decimal years: taxon `taxa[i]` lies in `[lower[i], upper[i]]`, exact when equal.

    `undated` taxa have no date; `heights` gives them a uniform prior over a
    default range.
    """

    taxa: tuple[str, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    undated: tuple[str, ...] = ()
    source: str = "dates"

    @property
    def exact(self) -> bool:
        """Every taxon dated, to a single value."""
        return not self.undated and self.lower == self.upper

    def as_dict(self) -> dict[str, tuple[float, float] | None]:
        """`taxon -> (lower, upper)`, `None` for the undated."""
        return {**dict(zip(self.taxa, zip(self.lower, self.upper))), **{t: None for t in self.undated}}

    def digest(self) -> str:
        """A short hash of the dates, for the record of a run (for exact dates the one `{taxon: year}` had)."""
        items = sorted(zip(self.taxa, self.lower)) if self.exact else sorted(self.as_dict().items(), key=lambda item: item[0])
        return hashlib.sha256(repr(items).encode()).hexdigest()[:16]

    def heights(self, taxa) -> TipHeights:
        """Heights for `taxa` in order, measured back from the latest upper bound.

        Height 0 is the latest date any tip may have, `reference = max(upper)`
        (the latest tip's date when it is exact, as before), so
        `height in [reference - upper, reference - lower]`. An undated tip gets
        the range `[earliest - span, latest]`, `earliest`/`latest` the extreme
        bounds of the dated tips and `span = latest - earliest`: from one sampled
        span before the first sample to the last. Give it `lower`/`upper`
        columns to choose another.
        """
        taxa = list(taxa)
        _check_taxa(self, taxa)
        bounds = dict(zip(self.taxa, zip(self.lower, self.upper)))
        default = _undated_range(self, [bounds[t] for t in taxa if t in bounds])
        low = np.array([bounds.get(t, default)[0] for t in taxa], float)
        high = np.array([bounds.get(t, default)[1] for t in taxa], float)
        reference = float(high.max())
        return TipHeights(reference - high, reference - low, reference)


def _check_taxa(dates: TipDates, taxa: list[str]) -> None:
    known, given = set(taxa), set(dates.taxa) | set(dates.undated)
    if extra := sorted(given - known):
        raise InputError(f"{dates.source}: taxon {extra[0]!r} has a date but is not in the tree or alignment")
    if missing := [t for t in taxa if t not in given]:
        raise InputError(f"{dates.source}: taxon {missing[0]!r} of the tree has no date "
                         "(mark it NA to estimate its date)")


def _undated_range(dates: TipDates, dated: list[tuple[float, float]]) -> tuple[float, float]:
    """`[earliest - span, latest]` over the dated tips (see `TipDates.heights`)."""
    if not dated:
        raise InputError(f"{dates.source}: no taxon of the tree has a date")
    earliest, latest = min(b[0] for b in dated), max(b[1] for b in dated)
    if dates.undated and not latest > earliest:
        raise InputError(f"{dates.source}: taxon {dates.undated[0]!r} has no date and every dated taxon has "
                         f"the same date, so no default range can be set; give its lower and upper bounds")
    return earliest - (latest - earliest), latest


def _day_bounds(day: datetime.date) -> tuple[float, float]:
    """The decimal years at the start and the end of `day`."""
    length = 366 if calendar.isleap(day.year) else 365
    number = day.timetuple().tm_yday
    return day.year + (number - 1) / length, day.year + number / length


def _today_end() -> float:
    return _day_bounds(datetime.date.today())[1]


def _iso_interval(year: int, month: int, day: int | None) -> tuple[float, float]:
    """A day (its middle, exact) or a month (first day's start to last day's end)."""
    if not 1 <= month <= 12:
        raise ValueError(f"month {month} does not exist")
    days = calendar.monthrange(year, month)[1]
    if day is None:
        return _day_bounds(datetime.date(year, month, 1))[0], _day_bounds(datetime.date(year, month, days))[1]
    if not 1 <= day <= days:
        leap = " (not a leap year)" if month == 2 and day == 29 else ""
        raise ValueError(f"{calendar.month_name[month]} {year} has {days} days{leap}")
    start, end = _day_bounds(datetime.date(year, month, day))
    middle = (start + end) / 2
    return middle, middle


def parse_date(text: str) -> tuple[float, float] | None:
    """`(lower, upper)` decimal years of one date (see the module's forms); `None` when undated.

    Raises `ValueError` with the reason for an impossible or unreadable date or
    one after today; an interval running past today is cut at today's end.
    """
    text = text.strip()
    if text.lower() in _UNDATED:
        return None
    if _DECIMAL.match(text):
        low = high = float(text)
    elif _YEAR.match(text):
        low, high = float(int(text)), float(int(text) + 1)
    elif match := _ISO.match(text):
        year, month, day = match.groups()
        low, high = _iso_interval(int(year), int(month), None if day is None else int(day))
    else:
        raise ValueError("is not a number, an ISO date (2004-07-12, 2004-07) or a year")
    today = _today_end()
    if low > today:
        raise ValueError(f"is after today ({datetime.date.today().isoformat()})")
    return low, min(high, today)


def _read_lines(path: str) -> list[tuple[int, list[str]]]:
    """Numbered tab-split lines, without blank lines and `#` comments."""
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError as err:
        raise InputError(f"{path}: cannot read dates: {err.strerror}") from None
    return [(n, line.split("\t")) for n, line in enumerate(lines, 1) if line.strip() and not line.startswith("#")]


def _header_columns(path: str, first: list[str]) -> dict[str, int] | None:
    """Column indices named by a header row (`taxon`/`name`/`strain`, `date`, `lower`, `upper`); None if unnamed."""
    names = [field.strip().lower() for field in first]
    if not {"date", "lower", "upper"} & set(names):
        return None
    if ("lower" in names) != ("upper" in names):
        raise InputError(f"{path}: line 1: a 'lower' column needs an 'upper' column and the reverse")
    columns = {key: names.index(key) for key in ("date", "lower", "upper") if key in names}
    columns["taxon"] = next((names.index(k) for k in _TAXON_COLUMNS if k in names), 0)
    return columns


def _columns(path: str, rows: list[tuple[int, list[str]]]) -> tuple[dict[str, int], list]:
    """The column layout and the data rows: a named header, an unnamed one (old form) or none."""
    first = rows[0][1]
    named = _header_columns(path, first)
    if named is not None:
        return named, rows[1:]
    header = len(first) >= 2 and not _looks_like_date(first[1])  # as before: a first line with no date
    return {"taxon": 0, "date": 1}, rows[1:] if header else rows


def _looks_like_date(text: str) -> bool:
    """Written in one of the date forms (it may still be impossible)."""
    text = text.strip()
    return text.lower() in _UNDATED or any(form.match(text) for form in (_DECIMAL, _YEAR, _ISO))


def _field(fields: list[str], columns: dict[str, int], key: str) -> str:
    index = columns.get(key)
    return "" if index is None or index >= len(fields) else fields[index].strip()


def _parse_field(where: str, taxon: str, kind: str, text: str) -> tuple[float, float] | None:
    try:
        return parse_date(text)
    except ValueError as err:
        raise InputError(f"{where}: {kind} {text!r} of {taxon!r} {err}") from None


def _row_interval(where: str, taxon: str, fields: list[str], columns: dict[str, int]) -> tuple[float, float] | None:
    """A row's `(lower, upper)`: its date, else its lower and upper bounds; None when undated."""
    date = _parse_field(where, taxon, "date", _field(fields, columns, "date"))
    low = _parse_field(where, taxon, "lower bound", _field(fields, columns, "lower"))
    high = _parse_field(where, taxon, "upper bound", _field(fields, columns, "upper"))
    if date is not None:
        if low is not None or high is not None:
            raise InputError(f"{where}: taxon {taxon!r} has both a date and lower/upper bounds")
        return date
    if (low is None) != (high is None):
        raise InputError(f"{where}: taxon {taxon!r} needs both a lower and an upper bound")
    if low is None:
        return None
    if low[0] > high[1]:
        raise InputError(f"{where}: taxon {taxon!r} has its lower bound {low[0]:.6g} after its upper bound "
                         f"{high[1]:.6g}")
    return low[0], high[1]


def _collect(entries, source: str) -> TipDates:
    """`TipDates` from `(taxon, interval or None)` pairs."""
    dated = [(taxon, interval) for taxon, interval in entries if interval is not None]
    undated = tuple(taxon for taxon, interval in entries if interval is None)
    return TipDates(tuple(t for t, _ in dated), tuple(i[0] for _, i in dated), tuple(i[1] for _, i in dated),
                    undated, source)


def _tsv_row(where: str, fields: list[str], columns: dict[str, int]) -> tuple[str, tuple[float, float] | None]:
    if len(fields) < 2:
        raise InputError(f"{where}: expected 'taxon<TAB>date', got {fields[0]!r}")
    taxon = _field(fields, columns, "taxon")
    if not taxon:
        raise InputError(f"{where}: no taxon name")
    return taxon, _row_interval(where, taxon, fields, columns)


def read_tip_dates(path) -> TipDates:
    """Tip dates from a tab-separated file.

    With a header naming `date`, or `lower` and `upper` (any order; the taxon in
    a column `taxon`, `name` or `strain`, else the first), each row gives a
    date or the bounds of an interval, in any form of the module docstring.
    Without such a header, `taxon<TAB>date` per line (a first line whose date
    does not read is a header, skipped). Empty, `NA` or `?` means undated.
    """
    path = os.fspath(path)
    rows = _read_lines(path)
    columns, rows = _columns(path, rows) if rows else ({}, [])
    entries, seen = [], set()
    for number, fields in rows:
        taxon, interval = _tsv_row(f"{path}: line {number}", fields, columns)
        if taxon in seen:
            raise InputError(f"{path}: line {number}: taxon {taxon!r} has two dates")
        seen.add(taxon)
        entries.append((taxon, interval))
    if not entries:
        raise InputError(f"{path}: no dates found")
    return _collect(entries, path)


def _name_date(name: str) -> tuple[float, float] | None:
    match = _NAME_ANY_DATE.search(name)
    if match is None:
        raise InputError(f"taxon names: taxon {name!r} has no date at the end of its name "
                         "(e.g. 'name_1999.5', 'name|2004-07-12', or 'name|?' for unknown)")
    return _parse_field("taxon names", name, "date", match.group(1))


def tip_dates_from_names(taxa) -> TipDates:
    """Dates at the end of the names, after `_`, `|`, `/` or `@`, in any form of the module docstring.

    `A/Brazil/x|2004-07-12`, `seq_2004-07`, `A/Brazil/1982` (the year 1982),
    `x_1999.5`; `x|?` or `x_NA` leaves `x` undated. A name with none of these
    is an error.
    """
    taxa = list(taxa)
    if len(set(taxa)) < len(taxa):
        twice = next(t for i, t in enumerate(taxa) if t in taxa[:i])
        raise InputError(f"taxon names: taxon {twice!r} appears twice")
    return _collect([(name, _name_date(name)) for name in taxa], "taxon names")


def read_dates(path) -> dict[str, float]:
    """`taxon<TAB>decimal year` per line, every number exact; a first line whose date is not a number is a header.

    The older reader: `read_tip_dates` also reads ISO and partial dates.
    """
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
    """Decimal years at the end of the names, after `_`, `|`, `/` or `@`: `A/Brazil/1982`, `seq_1999.5`.

    The older reader, every number exact: `tip_dates_from_names` also reads ISO and partial dates.
    """
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
