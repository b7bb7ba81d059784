"""Split (bipartition) helpers for comparing topology posteriors.

A split of an unrooted tree is written as the frozenset of taxa on the side
that does NOT contain the alphabetically first taxon, so that each split has a
single canonical form. Only non-trivial splits (at least two taxa on each
side) are kept.

    from validation.mc3.golden import golden_split_probabilities
    probs = golden_split_probabilities("/work/shared/data/DS1/topology_posterior_pooled.tsv")

Dependency-free: the Newick reader below handles plain taxon names (as in the
golden TSV and in MrBayes .t files), branch lengths, internal labels and
bracketed comments; it does not handle quoted names.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping

Split = frozenset  # frozenset[str]


def split_of_side(side: Iterable[str], taxa: Iterable[str]) -> frozenset[str]:
    """Canonical form of the split that separates `side` from the other taxa.

    Returns the side that does not contain min(taxa): `side` itself, or its
    complement in `taxa`.
    """
    side, taxa = frozenset(side), frozenset(taxa)
    return taxa - side if min(taxa) in side else side


def _clades(newick: str) -> tuple[list[frozenset[str]], frozenset[str]]:
    """Leaf sets of every parenthesised group of a Newick string, and all its leaves."""
    text = re.sub(r"\[[^\]]*\]", "", newick).strip().rstrip(";")
    stack: list[set[str]] = [set()]
    clades: list[frozenset[str]] = []
    previous = ""
    for token in re.findall(r"[(),]|:[^(),;]*|[^(),:;\s]+", text):
        if token == "(":
            stack.append(set())
        elif token == ")":
            clade = frozenset(stack.pop())
            clades.append(clade)
            stack[-1] |= clade
        elif token != "," and not token.startswith(":") and previous != ")":
            stack[-1].add(token)  # a leaf (a name right after ')' is an internal label)
        previous = token
    return clades, frozenset(stack[-1])


def newick_splits(newick: str, translate: Mapping[str, str] | None = None) -> frozenset[frozenset[str]]:
    """Non-trivial splits of a Newick tree (rooted or not), in canonical form.

    `translate` maps leaf tokens to taxon names (e.g. a MrBayes translate block).
    """
    clades, leaves = _clades(newick)
    if translate:
        clades = [frozenset(translate[t] for t in c) for c in clades]
        leaves = frozenset(translate[t] for t in leaves)
    splits = set()
    for clade in clades:
        if 2 <= len(clade) <= len(leaves) - 2:
            splits.add(split_of_side(clade, leaves))
    return frozenset(splits)


def split_probabilities(topologies: Mapping[frozenset, float]) -> dict[frozenset[str], float]:
    """Sum, for each split, the probabilities of the topologies (split sets) containing it."""
    probs: Counter = Counter()
    for splits, p in topologies.items():
        for s in splits:
            probs[s] += p
    return dict(probs)


def golden_topology_probabilities(path: str | Path) -> dict[frozenset, float]:
    """Topology probabilities (keyed by split set) from a TSV with columns rank, pooled_prob, newick."""
    out: Counter = Counter()
    with open(path, newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            out[newick_splits(row["newick"])] += float(row["pooled_prob"])
    return dict(out)


def golden_split_probabilities(path: str | Path) -> dict[frozenset[str], float]:
    """Split probabilities implied by the golden topology posterior at `path`.

    Each non-trivial split gets the sum of the probabilities of the listed
    topologies that contain it (the TSV is truncated, so the sums can fall
    slightly short of the true value; the listed probabilities total ~0.9997 for DS1).
    """
    return split_probabilities(golden_topology_probabilities(path))
