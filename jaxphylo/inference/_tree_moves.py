"""Metropolis-Hastings proposals on unrooted trees held as arrays on the device.

A tree is the search's kernel tree (`ml._rooting`): `parents [M]` of a binary
tree whose root `R` has two children, tip 0 and an internal node `w` whose
branch is fixed at zero, so tip 0's branch carries the edge between tip 0 and
`w`. The moves work on the *tip-0 view* of the same tree: the unrooted tree
hung from tip 0, `up[v]` the neighbour of `v` towards tip 0 (`up[w] = 0`,
`up[0] = up[R] = -1`) and `edge[v]` the length of the edge between `v` and
`up[v]` (`edge[w]` is tip 0's kernel branch). Every node but 0 and `R` then
owns exactly one edge: the 2N - 3 edges of the unrooted tree. Branch lengths
travel with their nodes, so relabelling moves have Jacobian 1.

Each proposal is a pure function `(key, up, edge) -> (up', edge', log q)`
with `log q` the log Hastings ratio (times the Jacobian) derived in its
docstring; the acceptance of a chain at inverse temperature `beta` is
`min(1, exp(beta (dlog L + dlog prior) + log q))`. The number of choices each
move draws from (internal edges, prunable nodes, ...) is the same for every
tree of a given size, which is what makes the topology parts symmetric.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

MULTIPLIER_TUNING = 2.0 * math.log(2.0)  # MrBayes's default lambda for multiplier moves: m in [1/2, 2]


def to_view(parents: Int[Array, "M"], lengths: Float[Array, "M"]):
    """Kernel tree -> tip-0 view `(up, edge)`; the root `R` keeps its id and is marked -1."""
    root = jnp.argmin(parents)
    w = jnp.argmax((parents == root) & (jnp.arange(parents.shape[0]) != 0))
    up = parents.at[w].set(0).at[0].set(-1).at[root].set(-1)
    edge = lengths.at[w].set(lengths[0]).at[0].set(0.0).at[root].set(0.0)
    return up, edge


def from_view(up: Int[Array, "M"], edge: Float[Array, "M"], root: Int[Array, ""]):
    """Tip-0 view -> kernel tree rooted on tip 0's edge at node `root`."""
    w = jnp.argmax(up == 0)
    parents = up.at[w].set(root).at[0].set(root).at[root].set(-1)
    lengths = edge.at[0].set(edge[w]).at[w].set(0.0).at[root].set(0.0)
    return parents, lengths


def children(up: Int[Array, "M"]) -> Int[Array, "M 2"]:
    """The (at most two) children of every node in the view, -1 where absent (tips; tip 0 has one)."""
    m = up.shape[0]
    node = jnp.arange(m)
    slot = jnp.where(up >= 0, up, m)  # parentless nodes write nowhere
    first = jnp.full(m, m, up.dtype).at[slot].min(node.astype(up.dtype), mode="drop")
    second = jnp.full(m, -1, up.dtype).at[slot].max(node.astype(up.dtype), mode="drop")
    first = jnp.where(first == m, -1, first)
    return jnp.stack([first, jnp.where(second == first, -1, second)], axis=-1)


def sibling(up: Int[Array, "M"], kids: Int[Array, "M 2"], v) -> Int[Array, ""]:
    pair = kids[up[v]]
    return jnp.where(pair[0] == v, pair[1], pair[0])


def _uniform_choice(key, mask):
    """A uniformly random index where `mask` is True (argmax of masked uniforms)."""
    return jnp.argmax(jnp.where(mask, jax.random.uniform(key, mask.shape), -1.0)).astype(jnp.int32)


def _internal_edges(up, num_tips):
    """Internal edges of the unrooted tree: above internal nodes whose view parent is internal."""
    node = jnp.arange(up.shape[0])
    return (node >= num_tips) & (up >= num_tips)


def stochastic_nni(key, up, edge, num_tips: int):
    """Swap a random child of `v` with `v`'s sibling across a uniformly chosen internal edge (u, v).

    Forward: an internal edge with probability 1/(N - 3), one of `v`'s two
    children with 1/2. The reverse chooses the same edge (v stays below u) and
    the child just moved there: the same 1/(2 (N - 3)). Every node keeps its
    edge length (a permutation of lengths: Jacobian 1). So `log q = 0`.
    """
    k1, k2 = jax.random.split(key)
    kids = children(up)
    v = _uniform_choice(k1, _internal_edges(up, num_tips))
    u, s = up[v], sibling(up, kids, v)
    x = kids[v, jax.random.bernoulli(k2).astype(jnp.int32)]
    return up.at[x].set(u).at[s].set(v), edge, jnp.zeros(())


def descendants(up: Int[Array, "M"], node) -> Array:
    """Mask of `node` and every node below it in the view (parents followed up to M times)."""
    m = up.shape[0]

    def climb(_, state):
        current, hit = state
        hit = hit | (current == node)
        return jnp.where(current >= 0, up[jnp.maximum(current, 0)], -1), hit

    _, hit = jax.lax.fori_loop(0, m, climb, (jnp.arange(m, dtype=up.dtype), jnp.zeros(m, bool)))
    return hit


def subtree_prune_regraft(key, up, edge, num_tips: int):
    """Prune the subtree below a random node `p`, regraft it on a random edge of the rest.

    `p` is uniform over the 2N - 4 nodes other than tip 0, `R` and `w` (the
    subtree that is not all of the tree but tip 0). Its parent `q` is removed:
    `p`'s sibling `r` takes the merged edge `A = edge[r] + edge[q]` to `q`'s
    parent. The target is uniform over the edges of the remaining tree except
    `r`'s: their number depends only on the size of `p`'s subtree, so the
    reverse move (same `p`, target `r`) has the same probability. `q` is
    inserted in the target edge above `t`, splitting its length `T` as
    `(U T, (1 - U) T)` with `U ~ Uniform(0, 1)`. The reverse splits `A` back
    with `U' = edge[r] / A`. The map `(edge[q], edge[r], T, U) -> (A, U',
    U T, (1 - U) T)` has Jacobian `T / A`, so `log q = log T - log A`. The
    sum of the lengths is unchanged, hence so is an i.i.d. exponential prior.
    """
    k1, k2, k3 = jax.random.split(key, 3)
    m = up.shape[0]
    node = jnp.arange(m)
    kids = children(up)
    w = jnp.argmax(up == 0)
    p = _uniform_choice(k1, (node != 0) & (up >= 0) & (node != w))
    q = up[p]
    r, g = sibling(up, kids, p), up[q]
    remaining = ~descendants(up, p) & (node != q) & (node != 0) & (up >= 0) & (node != r)
    t = _uniform_choice(k2, remaining)
    merged = edge[r] + edge[q]
    target = edge[t]
    split = jax.random.uniform(k3)
    moved_up = up.at[r].set(g)
    moved_up = moved_up.at[q].set(moved_up[t]).at[t].set(q)
    moved_edge = edge.at[r].set(merged).at[t].set(split * target).at[q].set((1 - split) * target)
    possible = jnp.any(remaining)  # tiny trees: no other edge, no move
    return (jnp.where(possible, moved_up, up), jnp.where(possible, moved_edge, edge),
            jnp.where(possible, jnp.log(target) - jnp.log(merged), 0.0))


def _multiplier(key, tuning):
    """`m = exp(tuning (U - 1/2))`: log-uniform on [exp(-tuning/2), exp(tuning/2)], density 1/(tuning m)."""
    return jnp.exp(tuning * (jax.random.uniform(key) - 0.5))


def branch_multiplier(key, up, edge, tuning):
    """One uniformly chosen edge scaled by `m` (MrBayes's Multiplier(V)).

    `x' = m x` with `m` of density `1/(lambda m)`; the reverse needs `1/m`,
    of density `m/lambda`, and `dx'/dm = x`: `log q = log m`.
    """
    k1, k2 = jax.random.split(key)
    v = _uniform_choice(k1, up >= 0)
    m = _multiplier(k2, tuning)
    return up, edge.at[v].multiply(m), jnp.log(m)


def tree_length_multiplier(key, up, edge, tuning):
    """Every edge scaled by one `m` (MrBayes's TLMultiplier): `2N - 3` lengths move, `log q = (2N - 3) log m`."""
    m = _multiplier(key, tuning)
    edges = jnp.sum(up >= 0)
    return up, jnp.where(up >= 0, edge * m, edge), edges * jnp.log(m)


def node_slider(key, up, edge, tuning):
    """Two adjacent edges (above `v` and above its parent `u`) rescaled together and the node between them
    placed uniformly: `S' = m S`, `edge[v] = V S'`, `edge[u] = (1 - V) S'`, `V ~ Uniform(0, 1)`.

    `v` is uniform over the 2N - 4 nodes with an edge whose parent also has one
    (all but 0, `R`, `w`). The new pair's density is `q(m) / |d(a, b)/d(m, V)|
    = 1/(lambda m) / (m S^2) = 1/(lambda S'^2)`; the reverse's is
    `1/(lambda S^2)`: `log q = 2 log m`.
    """
    k1, k2, k3 = jax.random.split(key, 3)
    node = jnp.arange(up.shape[0])
    w = jnp.argmax(up == 0)
    v = _uniform_choice(k1, (up >= 0) & (node != w))
    u = up[v]
    m = _multiplier(k2, tuning)
    total = m * (edge[v] + edge[u])
    place = jax.random.uniform(k3)
    return up, edge.at[v].set(place * total).at[u].set((1 - place) * total), 2 * jnp.log(m)


TOPOLOGY_MOVES = ("nni", "spr")
BRANCH_MOVES = ("branch_multiplier", "tree_length", "node_slider")


def propose_tree(kind: Int[Array, ""], key, up, edge, num_tips: int, tunings: Float[Array, "3"]):
    """The proposal of move `kind` (index into `TOPOLOGY_MOVES + BRANCH_MOVES`): `(up', edge', log q)`.

    Every move is computed and one is selected: under `vmap` a `switch`
    would do the same, and the moves are cheap beside the likelihood.
    """
    keys = jax.random.split(key, 5)
    options = [
        stochastic_nni(keys[0], up, edge, num_tips),
        subtree_prune_regraft(keys[1], up, edge, num_tips),
        branch_multiplier(keys[2], up, edge, tunings[0]),
        tree_length_multiplier(keys[3], up, edge, tunings[1]),
        node_slider(keys[4], up, edge, tunings[2]),
    ]
    return jax.tree.map(lambda *xs: jnp.stack(xs)[kind], *options)
