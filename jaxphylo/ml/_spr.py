"""Subtree pruning and regrafting within a radius: candidates built on the host, scored in batches on the device.

Pruning the subtree on `v`'s side of the edge `(v, u)` removes `u` and joins
its other neighbours `s1, s2` by one edge (lengths added); regrafting inserts
`u` in the middle of an edge `(x, y)` of the remaining tree whose distance from
that joined edge is at most `radius` edges (IQ-TREE's default radius: 6). The
pruned subtree keeps its branch. Candidates are then scored as whole trees,
a fixed-size batch per device call (no NNI-style shortcut here: the pruned
tree's partials differ from the current ones along the path), and the best
few get their branch lengths re-fitted before one is accepted, as RAxML's lazy
SPR does.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ._rooting import rooted_on_first_tip, unrooted


def spr_candidates(parent: np.ndarray, lengths: np.ndarray, radius: int, limit: int | None = None,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """SPRs of one kernel tree within `radius`: `(parents [K, M], lengths [K, M])`, rooted on tip 0.

    All of them, or with `limit`, those of prunings taken in random order until `limit` candidates are
    built (large trees: the candidates are whole trees, built on the host).
    """
    neighbours, root = unrooted(parent, lengths)
    parents, all_lengths = [], []
    prunings = [(u, v) for u, around in enumerate(neighbours) if len(around) == 3 for v in around]
    if limit is not None:
        prunings = [prunings[k] for k in np.random.default_rng(seed).permutation(len(prunings))]
    for u, v in prunings:
        if limit is not None and len(parents) >= limit:
            break
        s1, s2 = (k for k in neighbours[u] if k != v)
        pruned = [dict(d) for d in neighbours]
        for k in (v, s1, s2):
            del pruned[u][k], pruned[k][u]
        joined = neighbours[u][s1] + neighbours[u][s2]
        pruned[s1][s2] = pruned[s2][s1] = joined
        for x, y in _edges_near(pruned, (s1, s2), radius, blocked=v):
            tree = [dict(d) for d in pruned]
            half = tree[x].pop(y) / 2
            del tree[y][x]
            tree[u] = {x: half, y: half, v: neighbours[u][v]}
            tree[x][u] = tree[y][u] = half
            tree[v][u] = neighbours[u][v]
            p, l = rooted_on_first_tip(tree, root)
            parents.append(p)
            all_lengths.append(l)
    m = len(parent)
    if not parents:
        return np.zeros((0, m), np.int32), np.zeros((0,) + np.shape(lengths))
    return np.stack(parents), np.stack(all_lengths)


def _edges_near(tree, edge, radius, blocked):
    """Edges at distance 1..radius from `edge` (in edges), not entering `blocked` (the pruned subtree's root)."""
    found, seen = [], {edge[0], edge[1], blocked}
    queue = deque((end, other, 1) for end, other in (edge, edge[::-1]))
    while queue:
        node, came_from, depth = queue.popleft()
        for nxt in tree[node]:
            if nxt in (came_from, blocked) or (node, nxt) == edge or (nxt, node) == edge:
                continue
            found.append((node, nxt))
            if depth < radius and nxt not in seen:
                seen.add(nxt)
                queue.append((nxt, node, depth + 1))
    return found
