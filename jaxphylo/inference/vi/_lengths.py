"""q(lengths | tree): independent log-normal edge lengths whose parameters come from a graph network.

VBPI-GNN's parameterisation (Zhang, ICLR 2023, as ARTree uses it), not VBPI's
split table: the complete tree's edge features (`_graph.TreeEncoder`, a network
of its own) go through an MLP to `(mu_e, log sigma_e)` for every edge `e`, so
the distribution needs no list of candidate splits. Given the topology,

    log t_e = mu_e + sigma_e eps_e,   eps_e ~ N(0, 1) i.i.d.,

a reparameterised draw: gradients reach `mu` and `sigma` through `t`. The
kernel tree's two empty branches (the root's and `w`'s) get length 0 and no
density.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ._graph import TreeEncoder, edge_nodes

START_LOG_LENGTH = math.log(0.1)  # the prior's mean, Exponential(10): where every edge starts
MU_RANGE = (math.log(1e-6), math.log(10.0))
LOG_SIGMA_RANGE = (-10.0, 1.0)


def soft_clip(x, low, high):
    """`x` within `(low, high)`, the identity well inside and smooth at the bounds (softplus on both sides): a hard
    clip's zero gradient outside would hold a parameter at the bound for good."""
    return high - jax.nn.softplus(high - (low + jax.nn.softplus(x - low)))


class LengthModel(eqx.Module):
    encoder: TreeEncoder
    head: eqx.nn.MLP

    def __init__(self, num_tips: int, width: int = 32, depth: int = 2, *, key, tips=None):
        k1, k2 = jax.random.split(key)
        self.encoder = TreeEncoder(num_tips, width, depth, k1, tips)
        head = eqx.nn.MLP(width, 2, width, 1, activation=jax.nn.elu, key=k2)
        # start near log t = log 0.1, sigma = 0.1 whatever the features: a small last layer and offsets
        last = head.layers[-1]
        last = eqx.tree_at(lambda l: (l.weight, l.bias), last,
                           (0.01 * last.weight, jnp.asarray([START_LOG_LENGTH, jnp.log(0.1)])))
        self.head = eqx.tree_at(lambda h: h.layers[-1], head, last)

    def parameters(self, parent: Int[Array, " M"], w) -> tuple[Float[Array, " M"], Float[Array, " M"]]:
        """`(mu, sigma)` of every node's edge (complete tree)."""
        num_tips = (parent.shape[0] + 1) // 2
        out = jax.vmap(self.head)(self.encoder.edges(parent, w, num_tips)[0])
        # Bounded (softly) so that no tree the network has not yet seen draws astronomical lengths: one edge of 1e18
        # gave a log weight of -1e19 and then NaN on DS1 at a learning rate of 1e-2 (no edge of a posterior
        # under an Exponential(10) prior is near 10, and a log-normal sigma of e spans 1e-5..1e5 in 4 sd).
        return soft_clip(out[:, 0], *MU_RANGE), jnp.exp(soft_clip(out[:, 1], *LOG_SIGMA_RANGE))

    def sample(self, key, parent, w) -> tuple[Float[Array, " M"], Float[Array, ""]]:
        """Kernel lengths `[M]` (empty branches 0) and `log q(lengths | tree)`."""
        mu, sigma = self.parameters(parent, w)
        eps = jax.random.normal(key, mu.shape)
        log_t = mu + sigma * eps
        edges = edge_nodes(parent, w)
        # log-normal density: N(log t; mu, sigma) / t
        log_q = -0.5 * eps ** 2 - jnp.log(sigma) - 0.5 * jnp.log(2 * jnp.pi) - log_t
        return jnp.where(edges, jnp.exp(log_t), 0.0), jnp.sum(jnp.where(edges, log_q, 0.0))
