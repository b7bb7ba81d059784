"""The target, the particles and the multi-sample objective with its VIMCO gradient estimator.

Target (the benchmark's protocol): `p(y, tree, t) = L(y | tree, t) p(t) p(tree)`,
the likelihood under the fixed model, `t_e ~ Exponential(branch_rate)` i.i.d.
over the `2N - 3` edges, uniform topologies `p(tree) = 1 / (2N - 5)!!`.

With `K` particles `(tree_i, t_i) ~ q` and `log w_i = log p(y, tree_i, t_i) -
log q(tree_i) - log q(t_i | tree_i)`, the objective is the multi-sample bound
(Burda et al. 2016; Mnih & Rezende 2016)

    L_K = E[ log (1/K) sum_i w_i ] <= log p(y)      (L_1 is the ELBO).

Its gradient has a score part (the trees are discrete) and a reparameterised
part (the lengths). VIMCO (Mnih & Rezende 2016) controls the score part with
leave-one-out baselines: with `L^ = log mean_i w_i` and `L^_{-i}` the same with
`log w_i` replaced by the mean of the other `log w_j`,

    grad L_K ~= sum_i (L^ - L^_{-i}) grad log q(tree_i) + grad L^ (trees held fixed, lengths reparameterised),

unbiased because each baseline `L^_{-i}` does not depend on `tree_i`. The
surrogate below has exactly this gradient. During annealing the likelihood
enters as `L^beta` (ARTree's schedule: `beta` rises linearly to 1).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ...likelihood import batch_pattern_log_likelihoods
from ._graph import edge_nodes
from ._lengths import LengthModel
from ._topology import TopologyModel, double_factorial_log


class Variational(eqx.Module):
    """q(tree, lengths) = q(tree) q(lengths | tree)."""

    topology: TopologyModel
    lengths: LengthModel


class Target(eqx.Module):
    """The unnormalised posterior: data laid out for the kernels, the fixed model, the priors."""

    data: object
    model: object
    widths: tuple = eqx.field(static=True)
    dtype: object = eqx.field(static=True)
    num_tips: int = eqx.field(static=True)
    branch_rate: float = eqx.field(static=True, default=10.0)

    def log_likelihoods(self, parents, lengths) -> Float[Array, " K"]:
        """`log L` of `K` kernel trees in one batched call (pre-order gradient)."""
        per = batch_pattern_log_likelihoods(self.model, parents, lengths, self.data, self.widths, self.dtype)
        return jnp.sum(self.data.weights * per, axis=-1)

    def log_priors(self, lengths, edges) -> Float[Array, " K"]:
        rate = self.branch_rate
        log_edges = jnp.where(edges, jnp.log(rate) - rate * lengths, 0.0).sum(-1)
        return log_edges - double_factorial_log(self.num_tips)


class Particles(eqx.Module):
    parents: Array  # [K, M]
    lengths: Array  # [K, M]
    log_likelihood: Array  # [K]
    log_prior: Array  # [K]
    log_q_tree: Array  # [K]
    log_q_lengths: Array  # [K]
    log_r_tree: Array  # [K] the trees' proposal (q itself unless `draw` explored)

    def log_weights(self, beta=1.0):
        """`log p(y^beta, tree, t) - log r(tree) - log q(t | tree)`: importance weights for the proposal that drew
        the particles."""
        return beta * self.log_likelihood + self.log_prior - self.log_r_tree - self.log_q_lengths


def draw(q: Variational, target: Target, key, count: int, explore=None) -> Particles:
    """`count` particles, their trees scored together by one batched likelihood call: trees from q, or with
    `explore` a share of uniform insertion at each step (`TopologyModel.explore`), lengths from q."""
    k_tree, k_len = jax.random.split(key)
    parents, _, log_q_tree, log_r_tree = jax.vmap(lambda k: q.topology.explore(target.num_tips, explore, key=k))(
        jax.random.split(k_tree, count))
    ws = jax.vmap(root_child)(parents)
    lengths, log_q_lengths = jax.vmap(q.lengths.sample)(jax.random.split(k_len, count), parents, ws)
    edges = jax.vmap(edge_nodes)(parents, ws)
    return Particles(parents, lengths, target.log_likelihoods(parents, lengths), target.log_priors(lengths, edges),
                     log_q_tree, log_q_lengths, log_r_tree)


def root_child(parent):
    """`w`, the root's internal child (the kernel tree is rooted on tip 0's edge)."""
    root = parent.shape[0] - 1
    return jnp.argmax((parent == root) & (jnp.arange(parent.shape[0]) != 0)).astype(jnp.int32)


def multi_sample_bound(log_w: Float[Array, " K"]) -> Float[Array, ""]:
    """`log (1/K) sum_i w_i`."""
    return jax.nn.logsumexp(log_w) - jnp.log(log_w.shape[0])


def vimco_surrogate(log_w: Float[Array, " K"], log_q_tree: Float[Array, " K"]) -> Float[Array, ""]:
    """A scalar whose gradient is VIMCO's estimate of `grad L_K` (its value is `L^`)."""
    k = log_w.shape[0]
    bound = multi_sample_bound(log_w)
    others = (jnp.sum(log_w) - log_w) / (k - 1)  # geometric mean of the other weights, in logs
    swapped = jnp.where(jnp.eye(k, dtype=bool), others[:, None], log_w[None, :])  # row i: log w_i replaced
    baseline = jax.vmap(multi_sample_bound)(swapped)
    signal = jax.lax.stop_gradient(bound - baseline)
    return bound + jnp.sum(signal * (log_q_tree - jax.lax.stop_gradient(log_q_tree)))


def rws_surrogate(log_w: Float[Array, " K"], log_q_tree: Float[Array, " K"]) -> Float[Array, ""]:
    """A scalar whose gradient is the multi-sample bound's for the lengths (reparameterised, trees held fixed) plus
    reweighted wake-sleep's for q(tree) (Bornschein & Bengio 2015; VBPI used it): `sum_i w~_i grad log q(tree_i)`,
    `w~` the self-normalised weights, a consistent estimate of `E_posterior[grad log q(tree)]`, the gradient of the
    inclusive `KL(p || q)`. It holds for any proposal of the trees, so the particles may come from an exploring
    one; and the inclusive divergence punishes a q that misses posterior mass (VIMCO's exclusive one does not)."""
    normalised = jax.lax.stop_gradient(jax.nn.softmax(log_w))
    return multi_sample_bound(log_w) + jnp.sum(normalised * log_q_tree)
