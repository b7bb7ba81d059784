"""Neighbour-joining (Saitou & Nei 1987) and BIONJ (Gascuel 1997): distance matrix to tree.

Each step joins the pair `i, j` that minimises `Q_ij = (m - 2) d_ij - r_i - r_j`
(`r` the row sums over the `m` current nodes), with branch lengths
`v_i = d_ij / 2 + (r_i - r_j) / (2 (m - 2))` and `v_j = d_ij - v_i`. The new
node `u` gets `d_uk = lam (d_ik - v_i) + (1 - lam)(d_jk - v_j)`: NJ takes
`lam = 1/2`; BIONJ chooses `lam` to minimise the variance of `d_uk`, from a
variance matrix that starts as `d` and is updated as
`V_uk = lam V_ik + (1 - lam) V_jk - lam (1 - lam) V_ij`. The last three nodes
meet at the root of an unrooted tree. Ties go to the first pair in row order.
Each step is O(m^2) vectorised NumPy, O(N^3) in all.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Float

from ..runtime import to_device
from .._errors import InputError
from ._topology import Topology, Tree


def _checked(matrix, taxa) -> np.ndarray:
    d = np.asarray(matrix, dtype=float)
    taxa = tuple(taxa)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise InputError(f"distance matrix must be square, not {d.shape}")
    if d.shape[0] != len(taxa):
        raise InputError(f"distance matrix has {d.shape[0]} rows but {len(taxa)} taxa were named")
    if len(set(taxa)) != len(taxa):
        raise InputError(f"duplicate taxon name {next(t for t in taxa if taxa.count(t) > 1)!r}")
    if len(taxa) < 2:
        raise InputError("a tree needs at least two taxa")
    bad = ~np.isfinite(d)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise InputError(f"distance between {taxa[i]!r} and {taxa[j]!r} is {d[i, j]} (saturated or "
                         "undefined); give distances(..., saturated=VALUE) a finite value")
    if (d < 0).any():
        i, j = np.argwhere(d < 0)[0]
        raise InputError(f"distance between {taxa[i]!r} and {taxa[j]!r} is negative ({d[i, j]})")
    asymmetric = np.abs(d - d.T) > 1e-9 * max(1.0, np.abs(d).max())
    if asymmetric.any():
        i, j = np.argwhere(asymmetric)[0]
        raise InputError(f"distance matrix is not symmetric at {taxa[i]!r}, {taxa[j]!r}")
    return d.copy()


def _reduction(d, v, i, j, vi, vj, active, m, bionj):
    """Distances (and variances) from the new node to every node, and BIONJ's lambda."""
    lam = 0.5
    if bionj and v[i, j] > 0:
        # Sum over k != i, j; the k = i and k = j terms cancel, so sum over all active k.
        lam = 0.5 + np.sum(v[j, active] - v[i, active]) / (2 * (m - 2) * v[i, j])
        lam = min(1.0, max(0.0, lam))
    new_d = lam * (d[i] - vi) + (1 - lam) * (d[j] - vj)
    new_v = lam * v[i] + (1 - lam) * v[j] - lam * (1 - lam) * v[i, j]
    return new_d, new_v


def _join(matrix, taxa, bionj: bool, allow_negative: bool) -> Tree:
    d = _checked(matrix, taxa)
    v = d.copy()
    n = len(d)
    parent = np.full(max(2 * n - 2, 3), -1)
    length = np.zeros(len(parent))
    node = np.arange(n)  # the tree node each matrix slot stands for
    active = np.ones(n, bool)
    next_node = n
    for m in range(n, 3, -1):
        slots = np.flatnonzero(active)
        sub = d[np.ix_(slots, slots)]
        r = sub.sum(axis=1)
        q = (m - 2) * sub - r[:, None] - r[None, :]
        np.fill_diagonal(q, np.inf)
        a, b = sorted(np.unravel_index(int(np.argmin(q)), q.shape))
        i, j = slots[a], slots[b]
        vi = 0.5 * d[i, j] + (r[a] - r[b]) / (2 * (m - 2))
        vj = d[i, j] - vi
        parent[[node[i], node[j]]] = next_node
        length[[node[i], node[j]]] = vi, vj
        new_d, new_v = _reduction(d, v, i, j, vi, vj, active, m, bionj)
        d[i, :] = d[:, i] = new_d
        v[i, :] = v[:, i] = new_v
        d[i, i] = v[i, i] = 0.0
        node[i] = next_node
        active[j] = False
        next_node += 1
    last = np.flatnonzero(active)
    if n == 2:
        a, b = last
        parent[[a, b]] = 2
        length[[a, b]] = d[a, b] / 2
        parent, length = parent[:3], length[:3]
    else:
        a, b, c = last
        for x, y, z in ((a, b, c), (b, a, c), (c, a, b)):  # three-point formula
            parent[node[x]] = next_node
            length[node[x]] = 0.5 * (d[x, y] + d[x, z] - d[y, z])
    if not allow_negative:
        length = np.maximum(length, 0.0)
    topology = Topology(tuple(int(p) for p in parent), tuple(taxa), rooted=False)
    return Tree(to_device(length), topology)


def neighbor_joining(
    matrix: Float[np.ndarray, "taxa taxa"], taxa, *, allow_negative: bool = False
) -> Tree:
    """The neighbour-joining tree of a distance matrix, unrooted (a trifurcating root).

    Negative branch lengths, which NJ can produce, are set to zero unless
    `allow_negative`: the likelihood code accepts only lengths >= 0.
    """
    return _join(matrix, taxa, bionj=False, allow_negative=allow_negative)


def bionj(matrix: Float[np.ndarray, "taxa taxa"], taxa, *, allow_negative: bool = False) -> Tree:
    """Gascuel's BIONJ tree of a distance matrix (NJ with variance-weighted reduction)."""
    return _join(matrix, taxa, bionj=True, allow_negative=allow_negative)
