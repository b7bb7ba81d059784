"""PHYLIP square distance matrices: a count line, then one row per taxon (relaxed names)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._errors import InputError


def write_distance_matrix(matrix, taxa, path) -> None:
    """Write `matrix` with rows named by `taxa`; infinite (saturated) entries are written as `inf`."""
    width = max(10, max(len(t) for t in taxa))
    with open(path, "w") as handle:
        handle.write(f"{len(taxa)}\n")
        for name, row in zip(taxa, np.asarray(matrix)):
            handle.write(f"{name:<{width}} " + " ".join(f"{x:.10f}" for x in row) + "\n")


def read_distance_matrix(path) -> tuple[np.ndarray, tuple[str, ...]]:
    """`(matrix, taxa)` from a square PHYLIP distance file (rows may wrap over several lines)."""
    tokens = [(n + 1, t) for n, line in enumerate(Path(path).read_text().splitlines()) for t in line.split()]
    if not tokens:
        raise InputError(f"{path}: empty distance matrix file")
    try:
        count = int(tokens[0][1])
    except ValueError:
        raise InputError(f"{path}: line 1: expected the number of taxa, found {tokens[0][1]!r}") from None
    taxa, rows, position = [], [], 1
    for _ in range(count):
        if position + count >= len(tokens) + 1:
            raise InputError(f"{path}: expected {count} rows of {count} distances; the file ends early")
        line, name = tokens[position]
        values = tokens[position + 1: position + 1 + count]
        try:
            rows.append([float(v) for _, v in values])
        except ValueError:
            bad = next((n, v) for n, v in values if not _is_number(v))
            raise InputError(f"{path}: line {bad[0]}: {bad[1]!r} is not a distance") from None
        taxa.append(name)
        position += 1 + count
    return np.array(rows), tuple(taxa)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
