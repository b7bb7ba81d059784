"""Alignments as arrays: tip codes, the tip partial table, and site patterns."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from jaxtyping import Float, Int

from ._alphabet import Alphabet
from .._errors import InputError


def _data_type(alphabet: Alphabet) -> str:
    """The data type as a summary prints it: 'DNA', 'protein' or 'codon (genetic code k)'."""
    if alphabet.genetic_code is not None:
        return f"{alphabet.name} (genetic code {alphabet.genetic_code})"
    return {"dna": "DNA"}.get(alphabet.name, alphabet.name)


@dataclass(frozen=True)
class SitePatterns:
    """Distinct alignment columns and how often each occurs.

    `codes[t, c]` indexes a row of `tip_table`, the 0/1 vector of states that
    taxon `t` may have at pattern `c` (several ones for ambiguity, all ones for
    missing data). `site_pattern[j]` is the pattern of alignment column `j`.
    """

    taxa: tuple[str, ...]
    codes: Int[np.ndarray, "taxa patterns"]
    weights: Float[np.ndarray, " patterns"]
    tip_table: Float[np.ndarray, "codes states"]
    alphabet: Alphabet
    site_pattern: Int[np.ndarray, " sites"]

    @property
    def num_patterns(self) -> int:
        return self.codes.shape[1]

    def __repr__(self) -> str:
        """A one-line summary, e.g. `SitePatterns(27 taxa, 934 patterns of 1949 sites, DNA)`."""
        return (f"SitePatterns({len(self.taxa)} taxa, {self.num_patterns} patterns of {len(self.site_pattern)} sites, "
                f"{_data_type(self.alphabet)})")

    def tip_partials(self) -> Float[np.ndarray, "taxa patterns states"]:
        return self.tip_table[self.codes]


@dataclass(frozen=True)
class Alignment:
    """Aligned sequences of one data type; `taxa` lists the names in file order."""

    taxa: tuple[str, ...]
    sequences: tuple[str, ...]
    alphabet: Alphabet
    source: str = field(default="<memory>", compare=False)

    def __post_init__(self):
        seen = set()
        for name in self.taxa:
            if name in seen:
                raise InputError(f"{self.source}: duplicate taxon name {name!r}")
            seen.add(name)
        lengths = {len(s) for s in self.sequences}
        if len(lengths) > 1:
            first = len(self.sequences[0])
            bad = next(t for t, s in zip(self.taxa, self.sequences) if len(s) != first)
            raise InputError(
                f"{self.source}: sequences differ in length: {self.taxa[0]!r} has {first}, "
                f"{bad!r} has {len(self.sequences[self.taxa.index(bad)])}"
            )
        if not self.taxa:
            raise InputError(f"{self.source}: no sequences")
        width = self.alphabet.symbol_width
        if width > 1 and len(self.sequences[0]) % width:
            raise InputError(
                f"{self.source}: codon alignment length {len(self.sequences[0])} is not a multiple of 3"
            )
        self._encoded  # validate every symbol now, once

    @property
    def num_sites(self) -> int:
        """Number of columns in model units (codons for a codon alignment)."""
        return len(self.sequences[0]) // self.alphabet.symbol_width

    def __repr__(self) -> str:
        """A one-line summary (the sequences are in `sequences`), e.g.
        `Alignment(27 taxa, 1949 sites, 934 patterns, DNA, source='DS1/alignment.fasta')`."""
        patterns = self.site_patterns().num_patterns
        return (f"Alignment({len(self.taxa)} taxa, {self.num_sites} sites, {patterns} patterns, "
                f"{_data_type(self.alphabet)}, source={self.source!r})")

    @property
    def shape(self) -> tuple[()]:
        """`()`: NumPyro's view of an alignment observed by `PhyloCTMC`, one event with no array shape.

        NumPyro's model checks read `jnp.shape(value)` and `jnp.ndim(value)` of
        every site; these attributes answer them without a deprecation warning.
        Sizes are `len(taxa)` and `num_sites`.
        """
        return ()

    @property
    def ndim(self) -> int:
        """`0`, as `shape`."""
        return 0

    @cached_property
    def _encoded(self) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
        """(codes [taxa, sites], tip_table [codes, states], symbol of each code), every symbol checked."""
        width = self.alphabet.symbol_width
        raw = np.frombuffer("".join(self.sequences).upper().encode("ascii", "replace"), np.uint8)
        raw = raw.reshape(len(self.taxa), -1, width).astype(np.int64)
        keys = np.zeros(raw.shape[:2], np.int64)
        for k in range(width):
            keys = keys * 256 + raw[..., k]
        symbols, codes = np.unique(keys, return_inverse=True)
        codes = codes.reshape(keys.shape)
        table = np.zeros((len(symbols), self.alphabet.num_states))
        names = tuple("".join(chr((int(key) >> (8 * k)) & 255) for k in reversed(range(width))) for key in symbols)
        for row, symbol in enumerate(names):
            try:
                table[row, list(self.alphabet.compatible(symbol))] = 1.0
            except (KeyError, ValueError) as err:
                taxon, site = np.argwhere(codes == row)[0]
                what = "stop codon" if isinstance(err, ValueError) else f"unknown {self.alphabet.name} character"
                position = f"codon {site + 1}" if width > 1 else f"site {site + 1}"
                raise InputError(
                    f"{self.source}: {what} {symbol!r} in taxon {self.taxa[taxon]!r} at {position}"
                ) from None
        return codes.astype(np.int32), table, names

    def encoded(self) -> tuple[Int[np.ndarray, "taxa sites"], Float[np.ndarray, "codes states"], tuple[str, ...]]:
        """Every cell as a code: `(codes, table, symbols)`; row `k` of `table` holds the
        states symbol `symbols[k]` allows (upper-cased)."""
        return self._encoded

    @cached_property
    def _patterns(self) -> SitePatterns:
        codes, table, _ = self._encoded
        columns, site_pattern, counts = np.unique(codes.T, axis=0, return_inverse=True, return_counts=True)
        return SitePatterns(
            self.taxa, np.ascontiguousarray(columns.T), counts.astype(np.float64), table, self.alphabet,
            site_pattern.reshape(-1).astype(np.int64),
        )

    def site_patterns(self) -> SitePatterns:
        """Identical columns compressed into patterns with integer weights (computed once)."""
        return self._patterns
