"""q(tree): ARTree's autoregressive construction of unrooted topologies (Xie & Zhang, NeurIPS 2023).

Taxa are added one at a time in a FIXED order, the alignment's: the tree of
taxa 0, 1, 2 (one topology), then taxon `k = 3 .. N-1` attached to one of the
`2k - 3` edges of the current tree, drawn from `softmax(logits)` over those
edges. Every unrooted binary topology of `N` taxa arises from exactly one
sequence of choices in this order (remove the taxa from the last back: each
removal is forced, and it fixes the edge the taxon was attached to), so

    q(tree) = prod_{k=3}^{N-1} softmax(logits_k)[edge chosen at step k],

exactly, and the probabilities of the `(2N - 5)!!` topologies sum to 1 (the
choices' probabilities multiply along a tree of choices with 3 x 5 x ... x
(2N - 5) leaves). No tree has probability zero.

The logits at step `k` come from a graph network over the current partial
tree (`_graph.TreeEncoder`): the feature of every edge and the embedding of
the taxon being added, through a small MLP.

Kernel form, built in place: nodes `0 .. N-1` are tips, `N .. 2N-3` internal
(the node of step `k` is `N + k - 2`), `R = 2N - 2` the root, rooted on tip 0's
edge (`R`'s children: tip 0 and `w`; `w`'s branch is empty). Attaching taxon
`k` to the edge of node `v` puts a new node `u` above `v` (above `w` when
`v = 0`: tip 0's edge runs through `R`; `u` is then the new `w`).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ._graph import TreeEncoder, edge_nodes


def double_factorial_log(num_tips: int) -> float:
    """`log (2N - 5)!!`, the number of unrooted binary topologies of `N >= 3` taxa."""
    return float(sum(math.log(k) for k in range(3, 2 * num_tips - 4, 2)))


def star_tree(num_tips: int) -> tuple[Int[Array, " M"], Int[Array, ""]]:
    """The tree of taxa 0, 1, 2 in a kernel array of `2N - 1` nodes (absent nodes' parent -1), and `w`."""
    n = num_tips
    root = 2 * n - 2
    nodes, parents = jnp.array([0, n, 1, 2]), jnp.array([root, root, n, n], jnp.int32)
    parent = jnp.full(2 * n - 1, -1, jnp.int32).at[nodes].set(parents)
    return parent, jnp.asarray(n, jnp.int32)


def attach(parent: Int[Array, " M"], w, k, v) -> tuple[Int[Array, " M"], Int[Array, ""]]:
    """Taxon `k` attached to the edge of node `v` through the new internal node `N + k - 2`."""
    n = (parent.shape[0] + 1) // 2
    u = n + k - 2
    below = jnp.where(v == 0, w, v)  # tip 0's edge is 0 - R - w: cut it between R and w
    parent = parent.at[u].set(parent[below]).at[below].set(u).at[k].set(u)
    return parent, jnp.where(v == 0, u, w).astype(jnp.int32)


class TopologyModel(eqx.Module):
    """Insertion-edge logits from a graph network over the partial tree, plus a learned proximity term.

    `logit(k, e) = MLP([f_e, x_k]) - a ||m_e - t_k||^2 / (2d)`: `f_e` the edge's feature, `x_k` the added taxon's
    embedding, `m_e` the midpoint of the edge in the harmonic features, `t_k` the taxon's tip embedding (`d` its
    size) and `a` a learned weight. With tip embeddings started from the taxa's distances (`tip_coordinates`),
    the second term makes the untrained q a randomised distance-guided stepwise addition, so training begins
    among plausible trees instead of uniform ones; every tree keeps positive probability for any `a`.
    """

    encoder: TreeEncoder
    taxon: Float[Array, "N d"]
    score: eqx.nn.MLP
    proximity: Float[Array, ""]

    def __init__(self, num_tips: int, width: int = 32, depth: int = 2, *, key, tips=None, proximity: float = 0.0):
        k1, k2, k3 = jax.random.split(key, 3)
        self.encoder = TreeEncoder(num_tips, width, depth, k1, tips)
        self.taxon = 0.1 * jax.random.normal(k2, (num_tips, width)) + (0.0 if tips is None else jnp.asarray(tips))
        self.score = eqx.nn.MLP(2 * width, 1, width, 1, activation=jax.nn.elu, key=k3)
        self.proximity = jnp.asarray(proximity, float)

    def logits(self, parent, w, k) -> Float[Array, " M"]:
        """`[M]` logits of attaching taxon `k` to each node's edge; `-inf` where a node has no edge yet."""
        edges, midpoints = self.encoder.edges(parent, w, k)
        added = jnp.broadcast_to(self.taxon[k], edges.shape)
        raw = jax.vmap(self.score)(jnp.concatenate([edges, added], 1))[:, 0]
        near = jnp.sum((midpoints - self.encoder.tips[k]) ** 2, 1) / (2 * edges.shape[1])
        return jnp.where(edge_nodes(parent, w), raw - self.proximity * near, -jnp.inf)

    def walk(self, num_tips: int, key=None, choices=None):
        """Build a tree, drawing the edges (`key`) or following given `choices` `[N - 3]` (node ids).

        Returns `(parent [M], choices [N - 3], log q(tree))`; the log-probability is differentiable in the
        network's parameters (the choices are integers).
        """
        return self.explore(num_tips, None, key=key, choices=choices)[:3]

    def explore(self, num_tips: int, share, key=None, choices=None):
        """`walk` drawing each edge from `(1 - share) softmax(logits) + share / (2k - 3)`: q with a `share` of
        uniform insertion at every step (a defensive proposal `r`: any leaf may land anywhere, so trees that q has
        stopped drawing are still met; `share=None`: r = q). Returns `(parent, choices, log q(tree),
        log r(tree))`, exact for both (the same fixed-order construction)."""
        steps = jnp.arange(3, num_tips, dtype=jnp.int32)
        keys = jax.random.split(key, num_tips - 3) if choices is None else jnp.zeros((num_tips - 3, 2), jnp.uint32)
        given = jnp.zeros(num_tips - 3, jnp.int32) if choices is None else jnp.asarray(choices, jnp.int32)

        def step(carry, inputs):
            parent, w, log_q, log_r = carry
            k, key_k, chosen = inputs
            logits = self.logits(parent, w, k)
            own = jax.nn.log_softmax(logits)
            uniform = jnp.where(jnp.isfinite(logits), -jnp.log(2.0 * k - 3.0), -jnp.inf)
            mixed = jnp.logaddexp(jnp.log1p(-share) + own, jnp.log(share) + uniform) if share is not None else own
            v = (jax.random.categorical(key_k, mixed) if choices is None else chosen).astype(jnp.int32)
            parent, w = attach(parent, w, k, v)
            return (parent, w, log_q + own[v], log_r + mixed[v]), v

        parent, w = star_tree(num_tips)
        zero = jnp.zeros(())
        (parent, w, log_q, log_r), picked = jax.lax.scan(step, (parent, w, zero, zero), (steps, keys, given))
        return parent, picked, log_q, log_r

    def sample(self, key, num_tips: int):
        return self.walk(num_tips, key=key)

    def log_prob(self, choices, num_tips: int):
        return self.walk(num_tips, choices=choices)[2]

def all_choices(num_tips: int) -> list[tuple[int, ...]]:
    """Every choice sequence of the construction (host side, small `N`): one per topology, `(2N - 5)!!` of them.

    At step `k` the candidate edges are the present nodes but `R` and `w` (tracked as `attach` moves it).
    """
    n = num_tips
    out = []

    def extend(prefix, k, w):
        if k == n:
            out.append(tuple(prefix))
            return
        present = list(range(k)) + list(range(n, n + k - 2))
        for v in present:
            if v != w:
                extend(prefix + [v], k + 1, n + k - 2 if v == 0 else w)

    extend([], 3, n)
    return out
