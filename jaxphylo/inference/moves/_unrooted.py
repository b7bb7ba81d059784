"""Metropolis-Hastings proposals on unrooted trees held as arrays on the device.

Trees are in the tip-0 view (`jaxphylo.tree.to_view`): `up[v]` the neighbour of `v` towards tip 0 and
`edge[v]` the length of the edge between them, so every node but tip 0 and the kernel root owns exactly one
edge of the unrooted tree. Branch lengths travel with their nodes, so relabelling moves have Jacobian 1.

Lengths are `edge [M]`, or `[M, K]` for a partitioned model with unlinked
lengths (`-Q`: every part its own). Then the topology choices are shared by
the parts and every variate that moves lengths (split fraction, multiplier,
slider position) is drawn for each part independently, so the parts' length
maps are independent and the log Hastings ratio is the sum of the parts'
length terms plus the topology's (once).

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

from ...tree import descendants, neighbours, node_children, sibling
from ..base import uniform_choice

MULTIPLIER_TUNING = 2.0 * math.log(2.0)  # MrBayes's default lambda for multiplier moves: m in [1/2, 2]


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
    kids = node_children(up)
    v = uniform_choice(k1, _internal_edges(up, num_tips))
    u, s = up[v], sibling(up, kids, v)
    x = kids[v, jax.random.bernoulli(k2).astype(jnp.int32)]
    return up.at[x].set(u).at[s].set(v), edge, jnp.zeros(())


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
    kids = node_children(up)
    w = jnp.argmax(up == 0)
    p = uniform_choice(k1, (node != 0) & (up >= 0) & (node != w))
    q = up[p]
    r, g = sibling(up, kids, p), up[q]
    remaining = ~descendants(up, p) & (node != q) & (node != 0) & (up >= 0) & (node != r)
    t = uniform_choice(k2, remaining)
    merged = edge[r] + edge[q]
    target = edge[t]
    split = jax.random.uniform(k3, edge.shape[1:])
    moved_up = up.at[r].set(g)
    moved_up = moved_up.at[q].set(moved_up[t]).at[t].set(q)
    moved_edge = edge.at[r].set(merged).at[t].set(split * target).at[q].set((1 - split) * target)
    possible = jnp.any(remaining)  # tiny trees: no other edge, no move
    return (jnp.where(possible, moved_up, up), jnp.where(possible, moved_edge, edge),
            jnp.where(possible, jnp.sum(jnp.log(target) - jnp.log(merged)), 0.0))


def _multiplier(key, tuning, shape=()):
    """`m = exp(tuning (U - 1/2))`: log-uniform on [exp(-tuning/2), exp(tuning/2)], density 1/(tuning m)
    (one per part: `shape`)."""
    return jnp.exp(tuning * (jax.random.uniform(key, shape) - 0.5))


def branch_multiplier(key, up, edge, tuning):
    """One uniformly chosen edge scaled by `m` (MrBayes's Multiplier(V)).

    `x' = m x` with `m` of density `1/(lambda m)`; the reverse needs `1/m`,
    of density `m/lambda`, and `dx'/dm = x`: `log q = log m`.
    """
    k1, k2 = jax.random.split(key)
    v = uniform_choice(k1, up >= 0)
    m = _multiplier(k2, tuning, edge.shape[1:])
    return up, edge.at[v].multiply(m), jnp.sum(jnp.log(m))


def tree_length_multiplier(key, up, edge, tuning):
    """Every edge scaled by one `m` (MrBayes's TLMultiplier): `2N - 3` lengths move, `log q = (2N - 3) log m`."""
    m = _multiplier(key, tuning, edge.shape[1:])
    edges = jnp.sum(up >= 0)
    return up, jnp.where((up >= 0).reshape(up.shape + (1,) * (edge.ndim - 1)), edge * m, edge), \
        edges * jnp.sum(jnp.log(m))


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
    v = uniform_choice(k1, (up >= 0) & (node != w))
    u = up[v]
    m = _multiplier(k2, tuning, edge.shape[1:])
    total = m * (edge[v] + edge[u])
    place = jax.random.uniform(k3, edge.shape[1:])
    return up, edge.at[v].set(place * total).at[u].set((1 - place) * total), 2 * jnp.sum(jnp.log(m))


EXTENSION = 0.5  # probability of walking one more edge in the extending moves (a half: log q of the walk is 0)
MAX_STEPS = 8  # the walk stops there (a forced stop, counted in the Hastings ratio); P(reaching it) = 1 / 128


def extending_walk(key, nb: Int[Array, "M 3"], start, steps: int = MAX_STEPS, extension: float = EXTENSION):
    """A walk from the edge `start = (a, b)` across at least one node, each further node with probability
    `extension`, never back, stopping at tips and after `steps` nodes.

    Returns `(x, y, path, log g)`: the last edge, from `x` (crossed) to its far
    end `y`; the crossed nodes in order (`[steps]`, -1 after the last); and
    `log g = log c(E) - log s(E)` of the start minus that of the end, where
    `c(E)` is the walk's chance of heading the way it went from an edge (1/2
    when both ends are internal, else 1) and `s(E)` its chance of stopping
    there (1 when the far end is a tip or the walk is `steps` long, else
    `1 - extension`). The reverse walk, from the end back to the start along
    the same (unique) path, has every middle factor equal, so the log Hastings
    ratio of the walk is `log g(end) - log g(start)`, returned as one number:
    it is 0 for `extension = 1/2` unless a stop was forced by the step limit.
    `ok` is False when both ends of `start` are tips (a tree of one edge).
    """
    internal = jnp.sum(nb >= 0, axis=1) == 3
    a, b = start
    keys = jax.random.split(key, steps + 1)
    both = internal[a] & internal[b]
    head_b = jnp.where(both, jax.random.bernoulli(keys[0]), internal[b])
    x, y = jnp.where(head_b, a, b), jnp.where(head_b, b, a)  # crossing y next
    start_far_is_tip = ~internal[x]
    path = jnp.full(steps, -1, nb.dtype)
    walking = internal[y]
    ok = walking
    length = jnp.zeros((), jnp.int32)
    for k in range(steps):
        k1, k2 = jax.random.split(keys[k + 1])
        options = (nb[y] >= 0) & (nb[y] != x)
        nxt = nb[y, uniform_choice(k1, options)]
        go = walking & ((k == 0) | (jax.random.uniform(k2) < extension))
        path = path.at[k].set(jnp.where(go, y, -1))
        x, y = jnp.where(go, y, x), jnp.where(go, nxt, y)
        length = length + go
        walking = go & internal[y]
    forced_end = (~internal[y]) | (length == steps)
    forced_start = start_far_is_tip | (length == steps)
    log_c = lambda far_is_tip: jnp.where(far_is_tip, 0.0, jnp.log(0.5))  # noqa: E731
    log_s = lambda forced: jnp.where(forced, 0.0, jnp.log1p(-extension))  # noqa: E731
    log_ratio = (log_c(~internal[y]) - log_s(forced_end)) - (log_c(start_far_is_tip) - log_s(forced_start))
    return x, y, path, jnp.where(ok, log_ratio, 0.0), ok


def _prune(key, up, edge):
    """The common start of the SPR moves: a uniformly chosen `p` (not 0, `R`, `w`), its parent `q` taken out
    (`p`'s sibling `r` takes the merged edge to `q`'s parent `g`), `q` detached with `p` still below it."""
    node = jnp.arange(up.shape[0])
    kids = node_children(up)
    w = jnp.argmax(up == 0)
    p = uniform_choice(key, (node != 0) & (up >= 0) & (node != w))
    q = up[p]
    r, g = sibling(up, kids, p), up[q]
    pruned = up.at[r].set(g).at[q].set(-1)
    return p, q, r, g, pruned, edge.at[r].add(edge[q])


def _regraft(up, edge, q, x, y, split):
    """`q` (with its subtree) inserted in the edge between `x` and `y` of the pruned view, whose lower end owns
    the edge; its length `T` split `(split T, (1 - split) T)` below and above `q`. Returns `(up, edge, T)`."""
    t = jnp.where(up[x] == y, x, y)
    target = edge[t]
    up = up.at[q].set(up[t]).at[t].set(q)
    return up, edge.at[t].set(split * target).at[q].set((1 - split) * target), target


def _extending_spr(key, up, edge):
    k1, k2, k3 = jax.random.split(key, 3)
    p, q, r, g, pruned, merged_edge = _prune(k1, up, edge)
    x, y, _, log_walk, ok = extending_walk(k2, neighbours(pruned), (r, g))
    moved_up, moved_edge, target = _regraft(pruned, merged_edge, q, x, y, jax.random.uniform(k3, edge.shape[1:]))
    log_q = log_walk + jnp.sum(jnp.log(target) - jnp.log(merged_edge[r]))
    return p, jnp.where(ok, moved_up, up), jnp.where(ok, moved_edge, edge), jnp.where(ok, log_q, 0.0)


def extending_spr(key, up, edge, num_tips: int):
    """MrBayes's extending SPR: the subtree below a random `p` is pruned and its attachment point walks away
    from where it was (`extending_walk`) to a nearby edge.

    Topology: `p` is uniform as in `subtree_prune_regraft`; the reverse move
    prunes the same `p` and walks back along the same path: the walk's ratio
    (see `extending_walk`). Lengths: as in `subtree_prune_regraft` (merge `A`,
    split `T` with `U ~ Uniform(0, 1)`): `log T - log A`.
    `log q = log T - log A + walk`.
    """
    _, moved_up, moved_edge, log_q = _extending_spr(key, up, edge)
    return moved_up, moved_edge, log_q


def _reroot_subtree(key, up, edge, p):
    """The subtree below `p` re-rooted by a walk (see `extending_tbr`): `(up, edge, log q, moved)`."""
    k1, k2, k3 = jax.random.split(key, 3)
    a, b = node_children(up)[p]
    is_tip = a < 0
    a, b = jnp.where(is_tip, 0, a), jnp.where(is_tip, 0, b)  # a tip: a walk from tip 0 to itself, not possible
    nb = neighbours(up)
    joined = nb.at[a].set(jnp.where(nb[a] == p, b, nb[a])).at[b].set(jnp.where(nb[b] == p, a, nb[b]))
    x, y, path, log_walk, possible = extending_walk(k1, joined, (a, b))
    moved = possible & jax.random.bernoulli(k2)
    m = up.shape[0]
    h0 = path[0]
    other = jnp.where(h0 == a, b, a)
    new_up = up.at[other].set(h0)
    new_edge = edge.at[other].set(edge[a] + edge[b])
    for k in range(path.shape[0] - 1):  # every crossed node but the last turns to face the next one
        at = jnp.where(path[k + 1] >= 0, path[k], m)
        new_up = new_up.at[at].set(path[k + 1], mode="drop")
        new_edge = new_edge.at[at].set(edge[jnp.maximum(path[k + 1], 0)], mode="drop")
    split = jax.random.uniform(k3, edge.shape[1:])
    new_up = new_up.at[x].set(p).at[y].set(p)
    new_edge = new_edge.at[y].set(split * edge[y]).at[x].set((1 - split) * edge[y])
    log_q = log_walk + jnp.sum(jnp.log(edge[y]) - jnp.log(edge[a] + edge[b]))
    return jnp.where(moved, new_up, up), jnp.where(moved, new_edge, edge), jnp.where(moved, log_q, 0.0)


def extending_tbr(key, up, edge, num_tips: int):
    """MrBayes's extending TBR: an extending SPR, and with probability 1/2 (when the subtree has at least two
    edges once `p` is taken out) the pruned subtree is also re-rooted by a walk inside it.

    The subtree's side: `p` is taken out of the subtree (its children `a`, `b`
    joined by one edge of length `A' = edge[a] + edge[b]`), a walk from that
    edge (only downwards: it cannot cross `p`) ends at an edge of length `T'`
    where `p` is put back, splitting it with `U' ~ Uniform(0, 1)`; the path's
    nodes turn to face the new `p`, each taking the length of the edge below
    it (a relabelling: Jacobian `T' / A'` as for the other side). The reverse
    move chooses the same `p`, re-roots back along the same path with the
    same 1/2, and the two sides are independent:
    `log q = log q(extending SPR) + walk' + log T' - log A'`.
    """
    k1, k2 = jax.random.split(key)
    p, moved_up, moved_edge, log_q = _extending_spr(k1, up, edge)
    rerooted_up, rerooted_edge, log_r = _reroot_subtree(k2, moved_up, moved_edge, p)
    return rerooted_up, rerooted_edge, log_q + log_r


TOPOLOGY_MOVES = ("nni", "spr", "espr", "etbr")
BRANCH_MOVES = ("branch_multiplier", "tree_length", "node_slider")


def propose_tree(kind: Int[Array, ""], key, up, edge, num_tips: int, tunings: Float[Array, "3"],
                 enabled: tuple[bool, ...] | None = None):
    """The proposal of move `kind` (index into `TOPOLOGY_MOVES + BRANCH_MOVES`): `(up', edge', log q)`.

    Every enabled move is computed and one is selected: under `vmap` a
    `switch` would do the same, and the moves are cheap beside the likelihood.
    Moves not `enabled` (static: zero weight) are not computed at all.
    """
    keys = jax.random.split(key, 7)
    moves = [
        lambda: stochastic_nni(keys[0], up, edge, num_tips),
        lambda: subtree_prune_regraft(keys[1], up, edge, num_tips),
        lambda: extending_spr(keys[2], up, edge, num_tips),
        lambda: extending_tbr(keys[3], up, edge, num_tips),
        lambda: branch_multiplier(keys[4], up, edge, tunings[0]),
        lambda: tree_length_multiplier(keys[5], up, edge, tunings[1]),
        lambda: node_slider(keys[6], up, edge, tunings[2]),
    ]
    enabled = enabled or (True,) * len(moves)
    unchanged = (up, edge, jnp.zeros((), edge.dtype))
    options = [move() if on else unchanged for move, on in zip(moves, enabled)]
    return jax.tree.map(lambda *xs: jnp.stack(xs)[kind], *options)
