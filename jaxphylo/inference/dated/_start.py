"""A starting time tree from the data and the tip dates: a distance tree rooted and scaled by least squares.

As LSD and TempEst do, in two steps:

1. **Root.** BIONJ on the alignment's distances gives an unrooted tree with
   distances `D(x, t)` between nodes and tips. A root at distance `a` along
   edge `(v, p)` (length `L`) puts tip `t` at `d_t = D(v, t) + a` below `v`,
   else `D(p, t) + L - a`. Regressing `d_t = c - mu h_t` (`h_t` the tip
   heights) leaves residuals linear in `a`, so each edge's best `a` is a
   closed-form quadratic minimum, clipped to `[0, L]`. The root goes where the
   residual sum of squares is least; `mu` is the slope there, the clock rate
   (without dates, the regression is on the constant alone, and `mu = 1`).
2. **Heights.** Every internal node's height is the mean over the tips below
   it of `h_t + D(node, t) / mu`, then raised where needed to stay above its
   children (children first).

A rate that comes out non-positive (no temporal signal in the distances) is
replaced by `fallback_rate`.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Float, Int

from ...data import Alignment, distances
from ...tree import Topology, Tree, bionj


def start_time_tree(alignment: Alignment, tip_heights: Float[np.ndarray, " tips"], fallback_rate: float):
    """`(parents [M], heights [M], rate)`: a rooted binary time tree for `alignment.taxa` (tips first, root last)."""
    d = np.asarray(distances(alignment, "jc69" if alignment.alphabet.num_states == 4 else None, saturated=3.0))
    tree = bionj(d, alignment.taxa, allow_negative=False)
    n = len(alignment.taxa)
    edges = _edges(tree)
    between = _node_distances(edges, 2 * n - 2)
    h = np.asarray(tip_heights, float)
    dated = np.ptp(h) > 0
    design = np.stack([np.ones(n), -h], 1) if dated else np.ones((n, 1))
    best = min((_fit_edge(between, v, p, length, n, design) for v, p, length in edges), key=lambda fit: fit[0])
    _, v, p, a, coefficients = best
    rate = float(coefficients[1]) if dated else 1.0
    if not rate > 0:
        rate = fallback_rate
    parents = _rooted_parents(edges, v, p, n)
    return parents, _heights(parents, between, v, p, a, h, rate, n), rate


def _edges(tree) -> list[tuple[int, int, float]]:
    """`(child, parent, length)` for every edge of the unrooted tree (its nodes numbered as in the tree)."""
    parent = tree.topology.parent_array
    lengths = np.maximum(np.asarray(tree.branch_lengths, float), 0.0)
    return [(v, int(parent[v]), float(lengths[v])) for v in range(len(parent)) if parent[v] >= 0]


def _node_distances(edges, m: int) -> np.ndarray:
    """Path lengths between every pair of the unrooted tree's `m` nodes (a walk from each node)."""
    neighbours = [[] for _ in range(m)]
    for v, p, length in edges:
        neighbours[v].append((p, length))
        neighbours[p].append((v, length))
    out = np.zeros((m, m))
    for start in range(m):
        stack, seen = [(start, 0.0)], {start}
        while stack:
            node, dist = stack.pop()
            out[start, node] = dist
            for other, length in neighbours[node]:
                if other not in seen:
                    seen.add(other)
                    stack.append((other, dist + length))
    return out


def _side(between, v, p, n) -> np.ndarray:
    """Tips on `v`'s side of edge `(v, p)`."""
    return between[v, :n] < between[p, :n]


def _fit_edge(between, v, p, length, n, design):
    """The least-squares root on edge `(v, p)`: `(residual SS, v, p, a, coefficients)`."""
    below = _side(between, v, p, n)
    base = np.where(below, between[v, :n], between[p, :n] + length)  # root-to-tip distances at a = 0
    slope = np.where(below, 1.0, -1.0)  # d(d_t) / da
    projection = np.eye(n) - design @ np.linalg.pinv(design)  # residual maker of the regression
    r0, r1 = projection @ base, projection @ slope
    a = float(np.clip(-(r0 @ r1) / (r1 @ r1), 0.0, length)) if r1 @ r1 > 0 else length / 2
    residual = r0 + a * r1
    coefficients = np.linalg.pinv(design) @ (base + a * slope)
    return float(residual @ residual), v, p, a, coefficients


def _rooted_parents(edges, v, p, n) -> Int[np.ndarray, " M"]:
    """The rooted topology with a new root on edge `(v, p)`: tips `0..n-1`, internal nodes numbered after,
    the root last (`2n - 2`); old internal node ids are kept below it."""
    m_old = 2 * n - 2
    neighbours = [[] for _ in range(m_old)]
    for a, b, _ in edges:
        if {a, b} != {v, p}:
            neighbours[a].append(b)
            neighbours[b].append(a)
    root = m_old
    parents = np.full(m_old + 1, -1)
    parents[v] = parents[p] = root
    for top in (v, p):
        stack = [top]
        while stack:
            node = stack.pop()
            for other in neighbours[node]:
                if other != parents[node]:
                    parents[other] = node
                    stack.append(other)
    return parents


def _heights(parents, between, v, p, a, tip_heights, rate, n) -> np.ndarray:
    """Mean dated depth of the tips below every node, then each parent raised above its children."""
    m = len(parents)
    below = np.zeros((m, n), bool)
    below[np.arange(n), np.arange(n)] = True
    order = _children_first(parents)
    for node in order:
        if parents[node] >= 0:
            below[parents[node]] |= below[node]
    to_tips = np.zeros((m, n))
    to_tips[: m - 1] = between[:, :n]
    on_v = _side(between, v, p, n)
    to_tips[m - 1] = np.where(on_v, between[v, :n] + a, between[p, :n] + between[v, p] - a)
    heights = np.zeros(m)
    heights[:n] = tip_heights
    step = 1e-3 * max(float(np.ptp(tip_heights)), float(np.mean(to_tips[m - 1]) / rate), 1e-6)
    for node in order:
        if node >= n:
            tips = below[node]
            kids = parents == node
            estimate = np.mean(tip_heights[tips] + to_tips[node, tips] / rate)
            heights[node] = max(estimate, heights[kids].max() + step)
    return heights


def _children_first(parents) -> list[int]:
    """Nodes ordered so that every node comes after its children."""
    depth = np.zeros(len(parents), int)
    for node in range(len(parents)):
        walk, d = node, 0
        while parents[walk] >= 0:
            walk, d = parents[walk], d + 1
        depth[node] = d
    return list(np.argsort(-depth, kind="stable"))


def rooted_time_tree(parents: Int[np.ndarray, " M"], heights: Float[np.ndarray, " M"], taxa) -> Tree:
    """A sampler's time tree (`parents`, `heights`, internal nodes in any order) as a `Tree` whose branch lengths
    are durations, internal nodes renumbered by height (children first, the root last, as `Topology` wants)."""
    return height_ordered_tree(parents, heights, taxa)[0]


def _children_first(parents) -> list[int]:
    """Every node after all of its descendants (a post-order by repeated passes over the parent array)."""
    parents = np.asarray(parents)
    pending = np.bincount(parents[parents >= 0], minlength=len(parents))  # children not yet visited
    ready = [v for v in range(len(parents)) if pending[v] == 0]
    visited = []
    while ready:
        node = ready.pop()
        visited.append(node)
        if parents[node] >= 0:
            pending[parents[node]] -= 1
            if pending[parents[node]] == 0:
                ready.append(int(parents[node]))
    return visited


def height_ordered_tree(parents, heights, taxa) -> tuple[Tree, np.ndarray]:
    """`rooted_time_tree` and `order`, the old id of every new node: tips keep theirs, internal nodes follow
    sorted by height, children first. Summary heights (an MCC tree's medians) may put a child above its
    parent: the sort key is then the highest height below each node, ties broken by the node's level, and
    that branch's duration comes out negative for the caller to handle."""
    parents, heights = np.asarray(parents), np.asarray(heights, float)
    n = len(taxa)
    key, level = heights.copy(), np.zeros(len(parents), int)
    for node in _children_first(parents):
        if parents[node] >= 0:
            key[parents[node]] = max(key[parents[node]], key[node])
            level[parents[node]] = max(level[parents[node]], level[node] + 1)
    order = np.concatenate([np.arange(n), n + np.lexsort((level[n:], key[n:]))])
    new_id = np.empty(len(parents), int)
    new_id[order] = np.arange(len(parents))
    parent = tuple(int(new_id[parents[v]]) if parents[v] >= 0 else -1 for v in order)
    durations = np.where(parents >= 0, heights[np.maximum(parents, 0)] - heights, 0.0)[order]
    return Tree(durations, Topology(parent, tuple(taxa))), order
