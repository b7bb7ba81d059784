"""Search trees: kernel trees (binary, rooted; `TreeBatch`) kept rooted on the branch of tip 0.

Then the root's children are tip 0 and one internal node `w` whose branch is
fixed at zero (tip 0's branch carries the whole edge), and every internal
edge of the unrooted tree is the branch above an internal node `v` whose
parent `u` is not the root: NNIs need no special case at the root. On the
host, the same tree is also an *unrooted* adjacency (`neighbours[node] =
{other: length}`), the form in which SPR candidates are built.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def unrooted(parent: np.ndarray, lengths: np.ndarray) -> tuple[list[dict[int, float]], int]:
    """The unrooted tree of a kernel tree as adjacency dicts (the root merged away), and the root's id.
    Lengths `[M]`, or `[M, K]` (every part's, unlinked): a length is then a `[K]` row."""
    parent, lengths = np.asarray(parent), np.asarray(lengths, float)
    root = int(np.flatnonzero(parent < 0)[0])
    neighbours: list[dict[int, float]] = [dict() for _ in range(len(parent))]
    for node, up in enumerate(parent):
        if up >= 0 and up != root:
            neighbours[node][int(up)] = neighbours[int(up)][node] = lengths[node]
    a, b = (int(k) for k in np.flatnonzero(parent == root))  # the root's two branches are one edge
    neighbours[a][b] = neighbours[b][a] = lengths[a] + lengths[b]
    return neighbours, root


def rooted_on_first_tip(neighbours: list[dict[int, float]], root: int) -> tuple[np.ndarray, np.ndarray]:
    """Kernel `(parent, lengths)` of an unrooted adjacency, rooted on tip 0's branch at node id `root`."""
    m = len(neighbours)
    w = next(iter(neighbours[0]))
    parent, lengths = np.full(m, -1, np.int32), np.zeros((m,) + np.shape(neighbours[0][w]))  # [M] or [M, K]
    parent[0], parent[w], lengths[0] = root, root, neighbours[0][w]
    stack = [(w, 0)]
    while stack:
        node, came_from = stack.pop()
        for other, length in neighbours[node].items():
            if other != came_from:
                parent[other], lengths[other] = node, length
                stack.append((other, node))
    return parent, lengths


def root_on_first_tip(parent: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same unrooted tree, rooted on tip 0's branch; node ids are kept (the old root stays the root)."""
    return rooted_on_first_tip(*unrooted(parent, lengths))


def fixed_branches(parent):
    """Mask of the branches that are not free: the root's (unused) and its internal child's (zero)."""
    root = jnp.argmin(parent, axis=-1)
    node = jnp.arange(parent.shape[-1])
    return (node == root[..., None]) | ((parent == root[..., None]) & (node != 0))


def mask_like(mask, lengths):
    """A per-node mask `[..., M]` broadcastable against lengths `[..., M]` or unlinked ones `[..., M, K]`."""
    return mask.reshape(mask.shape + (1,) * (lengths.ndim - mask.ndim))
