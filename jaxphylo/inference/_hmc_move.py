"""An HMC move for MC³: every edge length and model parameter of a chain moved together along the gradient.

The coordinates are `theta = (log edge lengths of the 2N - 3 edges,
unconstrained model parameters u)`. A chain at inverse temperature `beta` has
target `exp(beta (log L + log prior))` in `(edge, u)` (the prior in `u`
includes its Jacobian, see `_parameter_moves`); in `theta` that gains the
edges' Jacobian `prod edge`, untempered:

    log pi(theta) = beta (log L + log prior) + sum(log edge).

One proposal: momentum `rho ~ N(0, I)`, `steps` leapfrog steps of size `eps`
(the chain's tuning, jittered by a uniform factor in [0.8, 1.2] so that no
trajectory length resonates), giving `(theta', rho')`. Leapfrog is
volume-preserving and reversible (negate `rho'`), so the Metropolis-Hastings
ratio is `pi(theta') N(rho') / (pi(theta) N(rho))`. In the acceptance rule
all moves share, `beta (dlog L + dlog prior) + log q`, that is

    log q = sum(log edge' - log edge) + |rho|^2 / 2 - |rho'|^2 / 2.

Gradients come from the likelihood's custom VJP (the pre-order pass): one
value-and-gradient of the whole batch per leapfrog step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

HMC_STEPS = 10
HMC_START_STEP = 0.05
HMC_TARGET_ACCEPTANCE = 0.65


def hmc_proposal(key, posterior, up: Int[Array, "B M"], edge: Float[Array, "B M *K"], root: Int[Array, " B"],
                 params: dict, beta: Float[Array, " B"], step_size: Float[Array, " B"], steps: int = HMC_STEPS):
    """Every chain's leapfrog trajectory: `(edge', params', log q)` (`[B, ...]`)."""
    valid = (up >= 0).reshape(up.shape + (1,) * (edge.ndim - 2))  # unlinked lengths [B, M, K]: every part's
    per_chain_sum = lambda x: x.reshape(x.shape[0], -1).sum(-1)  # noqa: E731

    def log_target(theta):
        log_edge, u = theta
        lengths = jnp.where(valid, jnp.exp(log_edge), 0.0)
        value = beta * (posterior.log_likelihoods(up, lengths, root, u) + posterior.log_priors(up, lengths, u))
        per_chain = value + per_chain_sum(jnp.where(valid, log_edge, 0.0))
        return jnp.sum(per_chain), per_chain

    gradient = jax.grad(lambda theta: log_target(theta)[0])
    k_momentum, k_jitter = jax.random.split(key)
    theta = (jnp.log(jnp.where(valid, edge, 1.0)), params)
    leaves, tree = jax.tree.flatten(theta)
    noise = [jax.random.normal(k, x.shape, x.dtype) for k, x in zip(jax.random.split(k_momentum, len(leaves)), leaves)]
    momentum = jax.tree.unflatten(tree, noise)
    momentum = (jnp.where(valid, momentum[0], 0.0), momentum[1])  # nothing moves the unused entries
    eps = step_size * jax.random.uniform(k_jitter, step_size.shape, minval=0.8, maxval=1.2)

    def scaled(x):  # eps per chain, broadcast over the rest of a leaf
        return eps.reshape((-1,) + (1,) * (x.ndim - 1))

    def kick(momentum, grad, half):
        return jax.tree.map(lambda r, g: jnp.where(jnp.isfinite(g), r + half * scaled(g) * g, jnp.nan),
                            momentum, grad)

    def leapfrog(_, carry):
        theta, momentum, grad = carry
        momentum = kick(momentum, grad, 0.5)
        theta = jax.tree.map(lambda x, r: x + scaled(x) * r, theta, momentum)
        grad = gradient(theta)
        return theta, kick(momentum, grad, 0.5), grad

    start_kinetic = _kinetic(momentum)
    new_theta, new_momentum, _ = jax.lax.fori_loop(0, steps, leapfrog, (theta, momentum, gradient(theta)))
    log_edge, new_params = new_theta
    new_edge = jnp.where(valid, jnp.exp(log_edge), 0.0)
    log_q = per_chain_sum(jnp.where(valid, log_edge - theta[0], 0.0)) + start_kinetic - _kinetic(new_momentum)
    return new_edge, new_params, jnp.where(jnp.isfinite(log_q), log_q, -jnp.inf)


def _kinetic(momentum) -> Float[Array, " B"]:
    return sum(0.5 * jnp.sum(r.reshape(r.shape[0], -1) ** 2, axis=-1) for r in jax.tree.leaves(momentum))
