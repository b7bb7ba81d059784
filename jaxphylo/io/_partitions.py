"""Partition schemes: which alignment columns form which part, and each part's model.

Three formats, told apart by their first word (`#NEXUS` or not):

- NEXUS `sets` (or `assumptions`, `mrbayes`, ...) blocks:
  `charset gene1 = 1-500 501-1000\\3;`. A range is `a`, `a-b` or `a-.`
  (`.` is the last column), optionally with a stride `\\k` (columns `a, a+k,
  ..., <= b`), 1-based and inclusive; ranges are separated by blanks or
  commas, and may name charsets defined before. IQ-TREE's data-type prefix
  (`charset g = CODON, 1-300;`) is read too.
- IQ-TREE's NEXUS charpartition, `charpartition mine = HKY+G4:gene1,
  GTR+I+G4:gene2;`: one part per entry, in order, each with the model before
  the colon (braces in the model may hold commas). A `{value}` after the
  charset name (IQ-TREE's best_model.nex writes one) is ignored. Standard
  NEXUS `label: ranges` entries are read as parts named `label`. An entry
  with nothing before the colon (`:gene3`; a bare `gene3` too, which IQ-TREE
  rejects) names no model: the default model's part. Without a
  charpartition every charset is a part (as IQ-TREE does); with several, the
  first is used.
- RAxML-style files, one part per line: `DNA, gene1 = 1-500, 501-1000\\3`.
  As in IQ-TREE 2 (2.0.7, checked), the first word names the substitution
  model, and `partitioned_model` appends the terms after the base of its
  default model (IQ-TREE appends those of `-m`: `-m HKY+G4` on a `DNA` line
  gives GTR+F+G4; without `-m` it takes the model bare, GTR+F, as
  `partitioned_model` does without a default): `DNA`/`NUC` is GTR (RAxML's
  only DNA model), a model name (`WAG, p2 = ...`, `HKY, p3 = ...`) is that
  model, with the data type its own (a protein matrix: protein);
  `AA`/`PROT`/`PROTEIN` and `CODON` (or `CODONk`, NCBI genetic code `k`) fix
  the data type and name no model: they take the default model whole. `#`
  starts a comment.

Sites in no part are left out of the analysis without a message, exactly as
IQ-TREE 2 (2.0.7, checked) does; `PartitionScheme.unassigned(num_sites)` lists
them. A site in two parts is an error (IQ-TREE 2.0.7 silently counts it
twice), and so is a site beyond the alignment's length (checked when the
scheme is applied to an alignment, since `.` needs that length).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np
from jaxtyping import Int

from .._errors import InputError
from ._alignment_files import read_text

DATA_TYPES = ("dna", "protein", "codon")
_RANGE = re.compile(r"^(\d+)(?:-(\d+|\.))?(?:\\(\d+))?$")
_RAXML_TYPES = {"DNA": "dna", "NUC": "dna", "AA": "protein", "PROT": "protein", "PROTEIN": "protein"}
_UNSUPPORTED_TYPES = ("BIN", "MULTI", "MORPH", "NT2AA", "CODON_AA")


@dataclass(frozen=True)
class SiteRange:
    """Columns `start, start + step, ..., <= stop` (1-based, inclusive; `stop` None is `.`, the last column)."""

    start: int
    stop: int | None
    step: int = 1

    def indices(self, num_sites: int | None) -> Int[np.ndarray, " sites"]:
        """0-based column indices; `num_sites` is needed only when `stop` is `.`."""
        stop = num_sites if self.stop is None else self.stop
        return np.arange(self.start - 1, stop, self.step, dtype=np.int64)

    def __str__(self) -> str:
        text = str(self.start) if self.stop == self.start and self.step == 1 else (
            f"{self.start}-{'.' if self.stop is None else self.stop}")
        return text + (f"\\{self.step}" if self.step != 1 else "")


@dataclass(frozen=True, eq=False)
class PartitionScheme:
    """Parts of an alignment: names, 0-based columns, and optionally a model and data type each.

    `ranges[k]` are part `k`'s ranges as written; `sites(num_sites)` gives
    their 0-based column indices, sorted (`num_sites` resolves `.`; `sites()`
    without it works when no range uses `.`). Columns are characters of the
    sequences (nucleotides for codon parts too: a codon part takes its
    columns in order, three to a codon). `models[k]` is an IQ-TREE model
    string or None (the default model), `data_types[k]` 'dna', 'protein',
    'codon' or None (the alignment's), `genetic_codes[k]` an NCBI table for
    codon parts. `lines[k]` is the line of the file that defined part `k`
    (for messages). Equality and hashing are by identity (it holds arrays).
    """

    names: tuple[str, ...]
    ranges: tuple[tuple[SiteRange, ...], ...]
    models: tuple[str | None, ...]
    data_types: tuple[str | None, ...]
    genetic_codes: tuple[int, ...]
    source: str = "<memory>"
    lines: tuple[int, ...] = ()
    format: str = "nexus"

    def __post_init__(self):
        count = len(self.names)
        if not count:
            raise InputError(f"{self.source}: no partitions defined")
        for field in ("ranges", "models", "data_types", "genetic_codes"):
            if len(getattr(self, field)) != count:
                raise InputError(f"{self.source}: {field} has {len(getattr(self, field))} entries for {count} parts")
        if not self.lines:
            object.__setattr__(self, "lines", (0,) * count)
        if len(set(self.names)) != count:
            second = next(k for k, n in enumerate(self.names) if n in self.names[:k])
            raise InputError(f"{self._where(second)}: part {self.names[second]!r} is defined twice")
        for k, data_type in enumerate(self.data_types):
            if data_type is not None and data_type not in DATA_TYPES:
                raise InputError(f"{self._where(k)}: unknown data type {data_type!r} of part {self.names[k]!r}")
        if not any(r.stop is None for part in self.ranges for r in part):
            self.sites()  # check overlaps now, when the file is read

    @property
    def num_parts(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        """A one-line summary, e.g. `PartitionScheme(3 parts: pos1, pos2, pos3)`."""
        shown = ", ".join(self.names[:6]) + (", ..." if self.num_parts > 6 else "")
        return f"PartitionScheme({self.num_parts} part{'s' * (self.num_parts != 1)}: {shown})"

    def _where(self, part: int) -> str:
        line = self.lines[part] if self.lines else 0
        return f"{self.source}: line {line}" if line else self.source

    def sites(self, num_sites: int | None = None) -> tuple[Int[np.ndarray, " part_sites"], ...]:
        """Every part's 0-based column indices, sorted; checks overlaps and, given `num_sites`, the length.

        Raises `InputError` naming the file, the line, the column (1-based) and the parts.
        """
        if num_sites is None and any(r.stop is None for part in self.ranges for r in part):
            raise InputError(f"{self.source}: a range ends at '.', so the alignment length is needed "
                             "(apply the scheme to an alignment)")
        owner: dict[int, int] = {}
        result = []
        for k, part in enumerate(self.ranges):
            columns = np.unique(np.concatenate([r.indices(num_sites) for r in part]))
            if num_sites is not None and columns.size and columns[-1] >= num_sites:
                bad = next(r for r in part if r.indices(num_sites).size and r.indices(num_sites)[-1] >= num_sites)
                raise InputError(f"{self._where(k)}: part {self.names[k]!r} has site {int(columns[-1]) + 1} "
                                 f"(range {bad}) beyond the alignment's {num_sites} sites")
            if not columns.size:
                raise InputError(f"{self._where(k)}: part {self.names[k]!r} has no sites")
            for column in columns.tolist():
                other = owner.setdefault(column, k)
                if other != k:
                    raise InputError(f"{self._where(k)}: site {column + 1} is in part {self.names[other]!r} "
                                     f"and in part {self.names[k]!r}")
            result.append(columns)
        return tuple(result)

    def unassigned(self, num_sites: int) -> Int[np.ndarray, " sites"]:
        """0-based columns in no part (they take no part in the likelihood, as in IQ-TREE)."""
        used = np.zeros(num_sites, bool)
        for columns in self.sites(num_sites):
            used[columns] = True
        return np.flatnonzero(~used)


def read_partitions(path) -> PartitionScheme:
    """Read a NEXUS sets/charpartition file or a RAxML-style partition file (see the module docstring)."""
    path = os.fspath(path)
    text = read_text(path, "partition file")
    if text.lstrip()[:6].upper() == "#NEXUS":
        return _read_nexus(text, path)
    return _read_raxml(text, path)


def _parse_ranges(tokens: list[str], where: str, known: dict[str, tuple[SiteRange, ...]]) -> tuple[SiteRange, ...]:
    ranges: list[SiteRange] = []
    for token in tokens:
        if token in known:
            ranges.extend(known[token])
            continue
        match = _RANGE.match(token)
        if not match:
            raise InputError(f"{where}: malformed site range {token!r} (expected a, a-b, a-. or a-b\\k)")
        start = int(match.group(1))
        stop = None if match.group(2) == "." else int(match.group(2) or start)
        step = int(match.group(3) or 1)
        if start < 1 or step < 1 or (stop is not None and stop < start):
            raise InputError(f"{where}: malformed site range {token!r} (sites count from 1, a <= b, k >= 1)")
        ranges.append(SiteRange(start, stop, step))
    if not ranges:
        raise InputError(f"{where}: no site ranges")
    return tuple(ranges)


def _range_tokens(text: str) -> list[str]:
    """`1 - 500 \\3, 7` -> ['1-500\\3', '7']: blanks around '-' and '\\' dropped, split at blanks and commas."""
    text = re.sub(r"\s*([-\\])\s*", r"\1", text.strip())
    return [t for t in re.split(r"[\s,]+", text) if t]


def _type_word(word: str, where: str) -> tuple[str | None, int, str | None]:
    """`(data type, genetic code, model)` of a RAxML first word or a NEXUS charset prefix."""
    upper = word.upper()
    if upper in _RAXML_TYPES:
        return _RAXML_TYPES[upper], 1, None
    codon = re.fullmatch(r"CODON(\d*)", upper)
    if codon:
        return "codon", int(codon.group(1) or 1), None
    if upper in _UNSUPPORTED_TYPES:
        raise InputError(f"{where}: data type {word!r} is not supported (DNA, protein and codon are)")
    return None, 1, word


# ---------------------------------------------------------------- RAxML-style


def _read_raxml(text: str, path: str) -> PartitionScheme:
    names, ranges, models, types, codes, lines = [], [], [], [], [], []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}: line {number}"
        head, equals, body = line.partition("=")
        word, comma, name = head.partition(",")
        if not equals or not comma or not word.strip() or not name.strip():
            raise InputError(f"{where}: expected 'TYPE, NAME = RANGES', got {line[:60]!r}")
        data_type, code, model = _type_word(word.strip(), where)
        if data_type == "dna":  # IQ-TREE: a DNA line is GTR, with -m's terms after the base
            model = "GTR"
        names.append(name.strip())
        ranges.append(_parse_ranges(_range_tokens(body), where, {}))
        models.append(model)
        types.append(data_type)
        codes.append(code)
        lines.append(number)
    if not names:
        raise InputError(f"{path}: no partitions defined (neither NEXUS nor 'TYPE, NAME = RANGES' lines)")
    return PartitionScheme(tuple(names), tuple(ranges), tuple(models), tuple(types), tuple(codes), path,
                           tuple(lines), "raxml")


# ---------------------------------------------------------------- NEXUS

_SKIPPED_BLOCKS = ("DATA", "CHARACTERS", "TAXA", "TREES", "UNALIGNED", "DISTANCES")


def _nexus_commands(text: str):
    """`(line, block name, command text)` for every command outside the data-like blocks, comments removed."""
    depth, cleaned = 0, []
    for ch in text:  # comments [...] become blanks, newlines kept for line numbers
        if ch == "[":
            depth += 1
        if depth and ch != "\n":
            cleaned.append(" ")
        else:
            cleaned.append(ch)
        if ch == "]" and depth:
            depth -= 1
    text = "".join(cleaned)
    block, line = None, 1
    for piece in text.split(";"):
        stripped = piece.strip()
        start_line = line + piece[: len(piece) - len(piece.lstrip())].count("\n")
        line += piece.count("\n")
        if not stripped:
            continue
        word = stripped.split(None, 1)[0].upper()
        if word == "#NEXUS":
            stripped = stripped[6:].strip()
            if not stripped:
                continue
            word = stripped.split(None, 1)[0].upper()
        if word == "BEGIN":
            parts = stripped.split()
            block = parts[1].upper() if len(parts) > 1 else ""
            continue
        if word in ("END", "ENDBLOCK"):
            block = None
            continue
        if block is not None and block not in _SKIPPED_BLOCKS:
            yield start_line, block, stripped


def _split_outside_braces(text: str, separator: str = ",") -> list[str]:
    pieces, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "{") - (ch == "}")
        if ch == separator and depth == 0:
            pieces.append(current)
            current = ""
        else:
            current += ch
    pieces.append(current)
    return [p.strip() for p in pieces]


def _name(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _read_nexus(text: str, path: str) -> PartitionScheme:
    charsets: dict[str, tuple[SiteRange, ...]] = {}
    charset_info: dict[str, tuple[int, str | None, int]] = {}  # name -> (line, data type, genetic code)
    partition = None
    for line, _, command in _nexus_commands(text):
        where = f"{path}: line {line}"
        word, rest = (command.split(None, 1) + [""])[:2]
        word = word.upper()
        if word not in ("CHARSET", "CHARPARTITION"):
            continue
        head, equals, body = rest.partition("=")
        name = _name(head.replace("*", ""))
        if not equals or not name:
            raise InputError(f"{where}: expected '{word.lower()} NAME = ...'")
        if word == "CHARPARTITION":
            if partition is None:
                partition = (line, body)
            continue
        data_type, code = None, 1
        first, comma, remainder = body.partition(",")
        if comma and ":" in first:
            raise InputError(f"{where}: charset {name!r} names an alignment file; give one alignment instead")
        first_tokens = _range_tokens(first)
        if comma and first_tokens and not first_tokens[0][0].isdigit() and first.strip() not in charsets:
            data_type, code, model = _type_word(first.strip(), where)
            if model is not None:
                raise InputError(f"{where}: unknown data type {first.strip()!r} in charset {name!r}")
            body = remainder
        if name in charsets:
            raise InputError(f"{where}: charset {name!r} is defined twice")
        charsets[name] = _parse_ranges(_range_tokens(body), where, charsets)
        charset_info[name] = (line, data_type, code)
    if partition is None:
        if not charsets:
            raise InputError(f"{path}: no charset or charpartition found")
        names = tuple(charsets)
        info = [charset_info[n] for n in names]
        return PartitionScheme(names, tuple(charsets[n] for n in names), (None,) * len(names),
                               tuple(i[1] for i in info), tuple(i[2] for i in info), path,
                               tuple(i[0] for i in info), "nexus")
    line, body = partition
    where = f"{path}: line {line}"
    names, ranges, models, types, codes, lines = [], [], [], [], [], []
    for entry in _split_outside_braces(body):
        if not entry:
            raise InputError(f"{where}: empty entry in charpartition")
        model, colon, target = entry.rpartition(":")
        target = re.sub(r"\{[^{}]*\}\s*$", "", target).strip()  # IQ-TREE's part rate/length, ignored
        model = model.strip() or None
        if _name(target) in charsets:
            name = _name(target)
            names.append(name)
            ranges.append(charsets[name])
            _, data_type, code = charset_info[name]
            lines.append(charset_info[name][0])
        elif colon and model and all(_RANGE.match(t) or t in charsets for t in _range_tokens(target)):
            name, model = _name(model), None  # standard NEXUS: `label: ranges`
            names.append(name)
            ranges.append(_parse_ranges(_range_tokens(target), where, charsets))
            data_type, code = None, 1
            lines.append(line)
        else:
            raise InputError(f"{where}: charpartition names unknown charset {_name(target)!r}")
        models.append(model)
        types.append(data_type)
        codes.append(code)
    return PartitionScheme(tuple(names), tuple(ranges), tuple(models), tuple(types), tuple(codes), path,
                           tuple(lines), "nexus")
