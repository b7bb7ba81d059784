"""A graph network over an unrooted (partial) tree in kernel form: node embeddings for q(tree) and q(lengths).

The tree is a kernel parent array over `M = 2N - 1` nodes rooted on tip 0's
edge (`_topology`): the root `R = 2N - 2` has children tip 0 and the internal
node `w`, whose branch is empty. Unrooted, every edge is the branch above an
*edge node* `v` (any present node but `R` and `w`), joining `v` and `up[v]`,
its parent, except that tip 0's edge joins it to `w`.

Features follow VBPI-GNN (Zhang 2023), used by ARTree (Xie & Zhang 2023):

1. *Topological node features*: every present tip `t` carries a learned
   vector `E[t]`, and every internal node (approximately) the harmonic
   extension, the solution of `h_i = mean(h_j, j ~ i)` over its three
   neighbours (the minimiser of the tree's Dirichlet energy with the tips
   fixed), reached by `SWEEPS` Jacobi sweeps from zero (dense `[M, M]` solves
   inside the vmapped scan of `_topology` ran about 60 times slower on CPU; the
   features need not be exact, the layers after them are learned); absent
   nodes are held at zero.
2. `layers` rounds of message passing, `h_i <- h_i + MLP([h_i, mean_{j ~ i} h_j])`
   on present nodes (residual, so the features of step 1 survive).
3. An edge's feature is symmetric in its two ends: `MLP([h_v + h_u, h_v * h_u])`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

SWEEPS = 16


def unrooted_up(parent: Int[Array, " M"], w) -> Int[Array, " M"]:
    """The other end of every node's edge: its parent, except tip 0 (joined to `w`); -1 for the root and absent
    nodes."""
    root = parent.shape[0] - 1
    up = jnp.where(parent == root, -1, parent)
    return up.at[0].set(jnp.where(parent[0] >= 0, w, -1))


def edge_nodes(parent: Int[Array, " M"], w) -> Bool[Array, " M"]:
    """Which nodes stand for an edge of the unrooted tree: present, not the root, not `w`."""
    return (unrooted_up(parent, w) >= 0) & (jnp.arange(parent.shape[0]) != w)


def adjacency(parent: Int[Array, " M"], w) -> Float[Array, "M M"]:
    """The unrooted tree's symmetric adjacency matrix (root and absent nodes isolated)."""
    m = parent.shape[0]
    edges = edge_nodes(parent, w)
    ends = jax.nn.one_hot(unrooted_up(parent, w), m) * edges[:, None]  # row v: the other end of v's edge
    own = jnp.eye(m) * edges[:, None]
    return own.T @ ends + ends.T @ own


def tip_coordinates(distances: Float[np.ndarray, "N N"], width: int) -> Float[np.ndarray, "N d"]:
    """Starting tip embeddings: classical multidimensional scaling of the taxa's distances.

    With `B = -1/2 J D^2 J` (`J` the centring matrix) and its eigenpairs `(l_i, v_i)`, the coordinates
    `v_i sqrt(l_i)` of the `width` largest positive `l_i` place the taxa so that Euclidean distances
    approximate `D`. They are scaled to a mean squared norm of `width` (the scale of the N(0, 1) embeddings
    they replace); dimensions beyond the positive spectrum are zero (each q of a population adds its own small
    noise, which breaks ties between taxa at equal distances). The embeddings stay learned: this is where
    training starts, so that the graph networks see from the first step which taxa are near each other
    (random embeddings must learn it from the score-function gradient, thousands of steps on DS1).
    """
    d = np.nan_to_num(np.asarray(distances, float), nan=0.0, posinf=0.0)
    n = d.shape[0]
    centring = np.eye(n) - 1.0 / n
    values, vectors = np.linalg.eigh(-0.5 * centring @ (d ** 2) @ centring)
    order = np.argsort(values)[::-1][:width]
    keep = values[order] > 1e-12 * max(values.max(), 1e-300)
    coords = np.zeros((n, width))
    coords[:, :keep.sum()] = vectors[:, order[keep]] * np.sqrt(values[order[keep]])
    norm = np.sqrt(np.mean(np.sum(coords ** 2, 1)))
    return coords * (np.sqrt(width) / norm) if norm > 0 else coords


class TreeEncoder(eqx.Module):
    """Learned tip embeddings, harmonic internal features and residual message passing (see the module)."""

    tips: Float[Array, "N d"]
    layers: list
    edge: eqx.nn.MLP

    def __init__(self, num_tips: int, width: int, depth: int, key, tips=None):
        keys = jax.random.split(key, depth + 2)
        self.tips = jax.random.normal(keys[0], (num_tips, width)) if tips is None else jnp.asarray(tips)
        self.layers = [eqx.nn.MLP(2 * width, width, width, 1, activation=jax.nn.elu, key=k) for k in keys[1:-1]]
        self.edge = eqx.nn.MLP(2 * width, width, width, 1, activation=jax.nn.elu, key=keys[-1])

    def harmonic(self, parent: Int[Array, " M"], w, num_present: Int[Array, ""]):
        """Step 1 of the module: `(h [M, d], mean_of [M, M], present [M])` for tips `0 .. num_present - 1`."""
        m, n = parent.shape[0], self.tips.shape[0]
        node = jnp.arange(m)
        a = adjacency(parent, w)
        degree = a.sum(1)
        tip = (node < n) & (node < num_present)
        internal = (node >= n) & (degree > 0)
        fixed = jnp.zeros((m, self.tips.shape[1])).at[:n].set(self.tips) * tip[:, None]
        mean_of = a / jnp.maximum(degree, 1.0)[:, None]
        # unrolled: a rolled loop is a device while-loop whose every trip reads its predicate back on a GPU, and
        # these sweeps run inside the construction's scan, in both passes (DS3, 160 trees a step: 129 ms)
        h = jax.lax.fori_loop(0, SWEEPS, lambda _, h: jnp.where(internal[:, None], mean_of @ h, fixed), fixed,
                              unroll=True)
        return h, mean_of, tip | internal

    def edges(self, parent: Int[Array, " M"], w, num_present) -> tuple[Float[Array, "M d"], Float[Array, "M d"]]:
        """Every node's edge feature and the midpoint of its edge in the harmonic features (rows of non-edge
        nodes are meaningless: mask with `edge_nodes`)."""
        h, mean_of, present = self.harmonic(parent, w, num_present)
        other = jnp.maximum(unrooted_up(parent, w), 0)
        midpoints = 0.5 * (h + h[other])
        for layer in self.layers:
            mean = mean_of @ h
            h = jnp.where(present[:, None], h + jax.vmap(layer)(jnp.concatenate([h, mean], 1)), 0.0)
        features = jax.vmap(self.edge)(jnp.concatenate([h + h[other], h * h[other]], 1))
        return features, midpoints
