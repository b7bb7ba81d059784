"""Character alphabets: which model states each observed symbol is compatible with.

A symbol (a character, or a triplet for codons) maps to the set of states it
allows. Missing data allows every state; an IUPAC code allows several. The
likelihood turns each distinct set into one row of a 0/1 "tip partial" table.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

from Bio.Data import CodonTable

from .._errors import InputError

NUCLEOTIDES = "ACGT"
AMINO_ACIDS = "ARNDCQEGHILKMFPSTWYV"  # PAML/IQ-TREE order

_IUPAC = {
    "A": "A", "C": "C", "G": "G", "T": "T", "U": "T",
    "R": "AG", "Y": "CT", "S": "CG", "W": "AT", "K": "GT", "M": "AC",
    "B": "CGT", "D": "AGT", "H": "ACT", "V": "ACG",
    "N": "ACGT", "-": "ACGT", "?": "ACGT", ".": "ACGT", "O": "ACGT",
}
_PROTEIN_AMBIGUITY = {"B": "DN", "Z": "EQ", "J": "IL"}
_PROTEIN_MISSING = "X?-."


@dataclass(frozen=True)
class Alphabet:
    """The states of a model and the symbols an alignment may use for them.

    `symbol_width` is 1 for nucleotides and amino acids, 3 for codons.
    """

    name: str
    states: tuple[str, ...]
    symbol_width: int = 1
    genetic_code: int | None = None

    @property
    def num_states(self) -> int:
        return len(self.states)

    @cached_property
    def _state_index(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.states)}

    def compatible(self, symbol: str) -> tuple[int, ...]:
        """Indices of the states `symbol` allows; raises KeyError if unknown.

        For codons, a fully resolved stop codon raises ValueError; an ambiguous
        triplet keeps only its sense-codon resolutions.
        """
        if self.name == "dna":
            return tuple(self._state_index[c] for c in _IUPAC[symbol])
        if self.name == "protein":
            if symbol in _PROTEIN_MISSING:
                return tuple(range(20))
            return tuple(self._state_index[c] for c in _PROTEIN_AMBIGUITY.get(symbol, symbol))
        options = [_IUPAC[c] for c in symbol]  # KeyError for unknown characters
        codons = ["".join(t) for t in itertools.product(*options)]
        sense = tuple(self._state_index[c] for c in codons if c in self._state_index)
        if not sense:
            raise ValueError(symbol)
        return sense

    @cached_property
    def amino_acid_of(self) -> tuple[str, ...]:
        """For codon alphabets: the amino acid each sense codon encodes."""
        table = CodonTable.unambiguous_dna_by_id[self.genetic_code]
        return tuple(table.forward_table[c] for c in self.states)


DNA = Alphabet("dna", tuple(NUCLEOTIDES))
PROTEIN = Alphabet("protein", tuple(AMINO_ACIDS))


def codon_alphabet(genetic_code: int = 1) -> Alphabet:
    """The sense codons of NCBI genetic code table `genetic_code`, in ACGT order."""
    try:
        table = CodonTable.unambiguous_dna_by_id[int(genetic_code)]
    except (KeyError, ValueError):
        known = ", ".join(str(k) for k in sorted(CodonTable.unambiguous_dna_by_id))
        raise InputError(f"unknown genetic code {genetic_code!r}; NCBI tables are {known}") from None
    sense = tuple(
        "".join(c) for c in itertools.product(NUCLEOTIDES, repeat=3)
        if "".join(c) not in table.stop_codons
    )
    return Alphabet("codon", sense, symbol_width=3, genetic_code=int(genetic_code))


def alphabet_for(data_type: str, genetic_code: int = 1) -> Alphabet:
    """The alphabet named by `data_type`: 'dna', 'protein' or 'codon'."""
    if data_type == "dna":
        return DNA
    if data_type == "protein":
        return PROTEIN
    if data_type == "codon":
        return codon_alphabet(genetic_code)
    raise InputError(f"unknown data type {data_type!r}; use 'dna', 'protein' or 'codon'")
