"""Stationary frequencies estimated from an alignment."""

from __future__ import annotations


import numpy as np

from ..data import Alignment, NUCLEOTIDES


def empirical_frequencies(alignment: Alignment, iterations: int = 20) -> np.ndarray:
    """State frequencies counted over all tips and sites.

    An ambiguous symbol is shared among its states in proportion to the current
    estimate (iterated to a fixed point); wholly missing data is ignored.
    """
    patterns = alignment.site_patterns()
    table = patterns.tip_table
    informative = table.sum(axis=1) < table.shape[1]
    counts = np.zeros(len(table))
    np.add.at(counts, patterns.codes, np.broadcast_to(patterns.weights, patterns.codes.shape))
    counts, table = counts[informative], table[informative]
    pi = np.full(table.shape[1], 1.0 / table.shape[1])
    for _ in range(iterations):
        share = table * pi
        pi = (counts[:, None] * share / share.sum(axis=1, keepdims=True)).sum(axis=0)
        pi /= pi.sum()
    return pi


def _resolved_codons(alignment: Alignment) -> list[str]:
    states = set(alignment.alphabet.states)
    return [s[i : i + 3] for s in alignment.sequences for i in range(0, len(s), 3) if s[i : i + 3] in states]


def codon_frequencies(alignment: Alignment, method: str) -> np.ndarray:
    """Codon frequencies by 'F1X4', 'F3X4' (products of nucleotide frequencies) or 'F61'.

    Counts use fully resolved sense codons, as PAML's codeml does; products
    are renormalised over the sense codons of the genetic code.
    """
    codons = alignment.alphabet.states
    observed = _resolved_codons(alignment)
    if method == "F61":
        counts = np.array([observed.count(c) for c in codons], float)
        return counts / counts.sum()
    joined = "".join(observed)
    if method == "F1X4":
        nuc = np.array([joined.count(n) for n in NUCLEOTIDES], float)
        position = [nuc / nuc.sum()] * 3
    else:
        position = []
        for k in range(3):
            column = joined[k::3]
            nuc = np.array([column.count(n) for n in NUCLEOTIDES], float)
            position.append(nuc / nuc.sum())
    index = {n: i for i, n in enumerate(NUCLEOTIDES)}
    pi = np.array([np.prod([position[k][index[c[k]]] for k in range(3)]) for c in codons])
    return pi / pi.sum()

