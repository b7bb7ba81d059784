"""Metropolis-Hastings proposals on rooted time trees held as arrays on the device (BEAST's tree operators).

A time tree is `parents [M]` (the root's entry -1; tips `0..N-1`, internal
nodes `N..M-1` in any order) and `heights [M]` (tips fixed, every internal
node above its two children). The state space is labelled histories with
labelled internal nodes; the densities of a coalescent or Yule prior do not
depend on the internal labels, so their marginals over ranked topologies are
the usual ones. Clock rates of a relaxed clock ride with their nodes (the
branch above node `v` keeps rate `v`), so no move needs a rate Jacobian.

Each proposal is `(key, parents, heights, tuning) -> (parents', heights', log q)`,
`log q = log q(x' -> x) - log q(x -> x')` (times the height map's Jacobian,
1 for all of them), accepted with `min(1, exp(dlog posterior + log q))`. A
proposal that draws an invalid choice returns the state unchanged with
`log q = -inf`: a rejection (the proposal has no density there), counted as
one by the tuning. It keeps every choice's probability the same for every
tree of a size, which is what makes the counts below simple.

Pointer jumping (`ceil(log2 M)` rounds) finds the subtrees and ancestors the
sliding moves need, so a move costs O(M log M) fully vectorised work.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ...tree import ancestors_of, jump_rounds, jumps, node_children
from ..base import uniform_choice

TIME_TREE_MOVES = ("narrow_exchange", "wide_exchange", "subtree_slide", "wilson_balding", "node_height",
                   "root_height")
START_SLIDE = 0.1  # subtree-slide window, as a fraction of the starting root height
ROOT_TUNING = 2.0 * math.log(2.0)  # the root-height multiplier's lambda: m in [1/2, 2]


def _other_child(kids: Int[Array, "M 2"], parent, child) -> Int[Array, ""]:
    pair = kids[parent]
    return jnp.where(pair[0] == child, pair[1], pair[0])


def in_subtree(parents: Int[Array, "M"], node) -> Bool[Array, "M"]:
    """`node` is an ancestor-or-self of each node: OR over ancestors at distance `< 2^r` after round `r`."""
    flag = jnp.arange(parents.shape[0]) == node
    jump = jumps(parents)
    for _ in range(jump_rounds(parents.shape[0])):
        flag = flag | flag[jump]
        jump = jump[jump]
    return flag


def _valid(ok, new, old):
    return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def _rejected(ok, log_q):
    """`log q`, or `-inf` (a certain rejection) where the move drew an invalid choice."""
    return jnp.where(ok, log_q, -jnp.inf).astype(log_q.dtype)


def narrow_exchange(key, parents: Int[Array, "M"], heights: Float[Array, "M"], tuning=None):
    """Swap a node `i` with its parent's sibling `u` (BEAST's narrow exchange).

    `i` is drawn uniformly from the `M - 1` non-root nodes; with `p` its parent,
    `g` the grandparent and `u` the other child of `g`, the move needs `p` not
    the root and `u` younger than `p`. Then `i` hangs from `g` and `u` from
    `p`. From the new tree, drawing `u` (probability `1 / (M - 1)`) proposes
    the way back (`i` is younger than `p`), so `log q = 0`.
    """
    kids = node_children(parents)
    i = uniform_choice(key, parents >= 0)
    p = parents[i]
    g = parents[p]
    u = _other_child(kids, g, p)
    ok = (g >= 0) & (heights[u] < heights[p])
    swapped = parents.at[i].set(g).at[u].set(p)
    return _valid(ok, swapped, parents), heights, _rejected(ok, jnp.zeros((), heights.dtype))


def wide_exchange(key, parents: Int[Array, "M"], heights: Float[Array, "M"], tuning=None):
    """Swap the parents of two random nodes (BEAST's wide exchange).

    `(i, j)` is an ordered pair of distinct non-root nodes drawn uniformly; the
    swap is valid when each is younger than the other's parent (which also
    rules out one being the other's ancestor). The same pair, equally likely
    from the new tree, swaps back: `log q = 0`.
    """
    k1, k2 = jax.random.split(key)
    i = uniform_choice(k1, parents >= 0)
    j = uniform_choice(k2, (parents >= 0) & (jnp.arange(parents.shape[0]) != i))
    pi, pj = parents[i], parents[j]
    ok = (heights[i] < heights[pj]) & (heights[j] < heights[pi]) & (pi != pj)
    swapped = parents.at[i].set(pj).at[j].set(pi)
    return _valid(ok, swapped, parents), heights, _rejected(ok, jnp.zeros((), heights.dtype))


def _pruned(parents, kids, i):
    """Remove `i`'s parent `p`: `i`'s sibling `s` takes `p`'s place. Returns `(pruned, p, s, g)`; in `pruned`,
    `p` and `i` hang nowhere (-1), so `i`'s subtree is cut off from the rest."""
    p = parents[i]
    s = _other_child(kids, p, i)
    g = parents[p]
    pruned = parents.at[s].set(g).at[p].set(-1).at[i].set(-1)
    return pruned, p, s, g


def _detached(parents, p, i) -> Bool[Array, "M"]:
    """`p`, `i` and `i`'s subtree: the nodes a pruning takes out of the tree."""
    return in_subtree(parents, i) | (jnp.arange(parents.shape[0]) == p)


def _spanning(pruned, heights, level, exclude) -> Bool[Array, "M"]:
    """Edges of the pruned tree that cross height `level`: a node below it whose parent is above it."""
    above = jnp.where(pruned >= 0, heights[jnp.maximum(pruned, 0)], jnp.inf)
    return (heights < level) & (above > level) & ~exclude


def _regraft(pruned, heights, p, i, c, height):
    """Insert `p` (with child `i`) on the edge above `c` at `height`; above the root when `c` is its root."""
    return pruned.at[p].set(pruned[c]).at[c].set(p).at[i].set(p), heights.at[p].set(height)


def subtree_slide(key, parents: Int[Array, "M"], heights: Float[Array, "M"], window):
    """Slide a subtree's parent up or down the tree (BEAST's subtree slide).

    Draw a non-root node `i` (parent `p`, sibling `s`) and `h' = h_p + U(-w, w)`;
    `h' <= h_i` is rejected. Prune `p` (`s` takes its place), then:
    - `h' > h_s`: the one edge at `h'` on the path from `s` up (above the root
      when `h'` is past it; `p` becomes the root);
    - `h' < h_s`: one of the `K` edges at `h'` strictly below `s`, uniformly
      (`K = 0`: rejected).
    The way back draws `i` again and the old height from the same window; it
    goes up where the move went down and the other way, so with `K(x, h)` the
    number of choices from sibling `x` at height `h` (1 going up)

        log q = log K(s, h') - log K(c, h_p),

    `c` the node whose edge received `p`. Heights map by a translation: Jacobian 1.
    """
    k_node, k_step, k_edge = jax.random.split(key, 3)
    kids = node_children(parents)
    i = uniform_choice(k_node, parents >= 0)
    pruned, p, s, g = _pruned(parents, kids, i)
    height = heights[p] + window * jax.random.uniform(k_step, minval=-1.0, maxval=1.0, dtype=heights.dtype)
    detached = _detached(parents, p, i)
    crossing = _spanning(pruned, heights, height, detached)
    upward = height > heights[s]
    up_edge = crossing & ancestors_of(pruned, s)
    down_edges = crossing & in_subtree(pruned, s) & (jnp.arange(parents.shape[0]) != s)
    count = jnp.sum(down_edges)
    c = jnp.where(upward, uniform_choice(k_edge, up_edge), uniform_choice(k_edge, down_edges))
    node = jnp.arange(parents.shape[0])
    back = _spanning(pruned, heights, heights[p], detached) & in_subtree(pruned, c) & (node != c)
    back_count = jnp.where(heights[p] > heights[c], 1, jnp.sum(back))
    log_q = jnp.log(jnp.where(upward, 1, count).astype(heights.dtype)) - jnp.log(back_count.astype(heights.dtype))
    ok = (height > heights[i]) & (upward | (count > 0))
    new_parents, new_heights = _regraft(pruned, heights, p, i, c, height)
    return (_valid(ok, new_parents, parents), _valid(ok, new_heights, heights),
            _rejected(ok, log_q.astype(heights.dtype)))


def wilson_balding(key, parents: Int[Array, "M"], heights: Float[Array, "M"], tuning=None):
    """Prune a subtree and regraft it on a random edge (Wilson & Balding 1998, as BEAST's operator).

    Draw a non-root node `i` whose parent `p` is not the root (else rejected);
    prune `p` (its other child `s` joins the grandparent `g`). Draw uniformly one
    of the `K` edges `(c, parent c)` of the pruned tree that are not above its
    root and whose top is older than `i`, and a height `h'` uniform on
    `(max(h_i, h_c), h_(parent c))`. The way back prunes the same `p` from the
    same pruned tree (so the same `K`), draws `s`'s edge and the old height:

        log q = log(h_(parent c) - max(h_i, h_c)) - log(h_g - max(h_i, h_s)).
    """
    k_node, k_edge, k_height = jax.random.split(key, 3)
    kids = node_children(parents)
    i = uniform_choice(k_node, parents >= 0)
    pruned, p, s, g = _pruned(parents, kids, i)
    detached = _detached(parents, p, i)
    top = heights[jnp.maximum(pruned, 0)]
    edges = (pruned >= 0) & ~detached & (top > heights[i])
    c = uniform_choice(k_edge, edges)
    low = jnp.maximum(heights[i], heights[c])
    height = low + (top[c] - low) * jax.random.uniform(k_height, dtype=heights.dtype)
    log_q = jnp.log(top[c] - low) - jnp.log(heights[g] - jnp.maximum(heights[i], heights[s]))
    ok = (g >= 0) & jnp.any(edges)
    new_parents, new_heights = _regraft(pruned, heights, p, i, c, height)
    return (_valid(ok, new_parents, parents), _valid(ok, new_heights, heights),
            _rejected(ok, log_q.astype(heights.dtype)))


def node_height(key, parents: Int[Array, "M"], heights: Float[Array, "M"], tuning=None):
    """A non-root internal node's height, uniform between its older child and its parent (BEAST's uniform
    operator): the window depends on neither the old nor the new height, so `log q = 0`."""
    k_node, k_height = jax.random.split(key)
    m = parents.shape[0]
    kids = node_children(parents)
    internal = kids[:, 0] >= 0
    v = uniform_choice(k_node, internal & (parents >= 0))
    low = jnp.max(heights[kids[v]])
    high = heights[jnp.maximum(parents[v], 0)]
    height = low + (high - low) * jax.random.uniform(k_height, dtype=heights.dtype)
    ok = jnp.any(internal & (parents >= 0)) & (m > 3)
    return parents, _valid(ok, heights.at[v].set(height), heights), _rejected(ok, jnp.zeros((), heights.dtype))


def root_height(key, parents: Int[Array, "M"], heights: Float[Array, "M"], scale):
    """The root's height above its older child, `d`, times `m = exp(lambda (U - 1/2))`.

    `d -> m d` has Jacobian `m` and the reverse draws `1/m` with the same
    density in `log m`, so `log q = log m`.
    """
    kids = node_children(parents)
    root = jnp.argmin(parents)
    low = jnp.max(heights[kids[root]])
    log_m = scale * (jax.random.uniform(key, dtype=heights.dtype) - 0.5)
    height = low + (heights[root] - low) * jnp.exp(log_m)
    return parents, heights.at[root].set(height), log_m


_PROPOSALS = (narrow_exchange, wide_exchange, subtree_slide, wilson_balding, node_height, root_height)
TUNED = {"subtree_slide": 0, "root_height": 1}  # move -> column of a chain's tree-move tunings


def propose_time_tree(kind, key, parents: Int[Array, "M"], heights: Float[Array, "M"],
                      tunings: Float[Array, " 2"], enabled: tuple):
    """The proposal of move `kind` (an index into `TIME_TREE_MOVES`); disabled moves are not compiled."""
    branches = [
        (lambda k, p, h, t, f=f: f(k, p, h, t[TUNED[f.__name__]] if f.__name__ in TUNED else None))
        if on else (lambda k, p, h, t: (p, h, jnp.zeros((), h.dtype)))
        for f, on in zip(_PROPOSALS, enabled)
    ]
    return jax.lax.switch(kind, branches, key, parents, heights, tunings)
