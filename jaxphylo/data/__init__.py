"""Sequence data: alphabets (DNA, protein, codons), alignments compressed to weighted site patterns, distances."""

from ._alignment import Alignment as Alignment, SitePatterns as SitePatterns
from ._alphabet import (
    DNA as DNA,
    NUCLEOTIDES as NUCLEOTIDES,
    PROTEIN as PROTEIN,
    Alphabet as Alphabet,
    alphabet_for as alphabet_for,
    codon_alphabet as codon_alphabet,
)
from ._distances import distances as distances
