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


def hmc_proposal(keys, posterior, up: Int[Array, "B M"], edge: Float[Array, "B M *K"], root: Int[Array, " B"],
                 params: dict, beta: Float[Array, " B"], step_size: Float[Array, " B"], steps: int = HMC_STEPS):
    """Every chain's leapfrog trajectory (`keys`: one per chain): `(edge', params', log q)` (`[B, ...]`)."""
    valid = (up >= 0).reshape(up.shape + (1,) * (edge.ndim - 2))  # unlinked lengths [B, M, K]: every part's
    per_chain_sum = lambda x: x.reshape(x.shape[0], -1).sum(-1)  # noqa: E731

    def log_target(theta):
        log_edge, u = theta
        lengths = jnp.where(valid, jnp.exp(log_edge), 0.0)
        value = beta * (posterior.log_likelihoods(up, lengths, root, u) + posterior.log_priors(up, lengths, u))
        return value + per_chain_sum(jnp.where(valid, log_edge, 0.0))

    theta = (jnp.log(jnp.where(valid, edge, 1.0)), params)
    (log_edge, new_params), log_q = leapfrog_trajectory(keys, log_target, theta, (valid, None), step_size, steps)
    new_edge = jnp.where(valid, jnp.exp(log_edge), 0.0)
    log_q = log_q + per_chain_sum(jnp.where(valid, log_edge - theta[0], 0.0))  # the edges' Jacobian, untempered
    return new_edge, new_params, jnp.where(jnp.isfinite(log_q), log_q, -jnp.inf)


def leapfrog_trajectory(keys, log_target, theta, movable, step_size: Float[Array, " B"], steps: int,
                        inverse_mass=None):
    """`steps` leapfrog steps of every chain from `theta` (leaves `[B, ...]`) under `log_target(theta) -> [B]`.

    Momenta are `N(0, M)` with the diagonal `M = 1 / inverse_mass` (a pytree
    like `theta`; None: the identity), zero where `movable` (a pytree prefix of
    `theta`: a mask, or None for all) is False. Positions move by
    `eps M^-1 rho`. Returns `(theta', K(rho) - K(rho'))`, `K = rho M^-1 rho / 2`:
    with `log_target`'s own change, the log acceptance ratio. Gradients come
    from one value-and-gradient of the whole batch per step.
    """
    inverse_mass = inverse_mass if inverse_mass is not None else jax.tree.map(jnp.ones_like, theta)
    gradient = jax.grad(lambda t: jnp.sum(log_target(t)))
    k_momentum, k_jitter = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    leaves, tree = jax.tree.flatten(theta)
    noise = [jax.vmap(lambda k, x, i=i: jax.random.normal(jax.random.fold_in(k, i), x.shape, x.dtype))(k_momentum, x)
             for i, x in enumerate(leaves)]
    masks = jax.tree.flatten(jax.tree.map(lambda mask, sub: jax.tree.map(lambda _: mask, sub), movable, theta,
                                          is_leaf=lambda x: x is None), is_leaf=lambda x: x is None)[0]
    scales = jax.tree.leaves(inverse_mass)
    momentum = jax.tree.unflatten(tree, [(r if mask is None else jnp.where(mask, r, 0.0)) / jnp.sqrt(w)
                                         for r, mask, w in zip(noise, masks, scales)])  # masked entries stay
    eps = step_size * jax.vmap(lambda k: jax.random.uniform(k, (), step_size.dtype, 0.8, 1.2))(k_jitter)

    def scaled(x):  # eps per chain, broadcast over the rest of a leaf
        return eps.reshape((-1,) + (1,) * (x.ndim - 1))

    def kick(momentum, grad, half):
        return jax.tree.map(lambda r, g: jnp.where(jnp.isfinite(g), r + half * scaled(g) * g, jnp.nan),
                            momentum, grad)

    def leapfrog(_, carry):
        theta, momentum, grad = carry
        momentum = kick(momentum, grad, 0.5)
        theta = jax.tree.map(lambda x, r, w: x + scaled(x) * w * r, theta, momentum, inverse_mass)
        grad = gradient(theta)
        return theta, kick(momentum, grad, 0.5), grad

    start_kinetic = _kinetic(momentum, inverse_mass)
    new_theta, new_momentum, _ = jax.lax.fori_loop(0, steps, leapfrog, (theta, momentum, gradient(theta)))
    return new_theta, start_kinetic - _kinetic(new_momentum, inverse_mass)


def _kinetic(momentum, inverse_mass) -> Float[Array, " B"]:
    return sum(0.5 * jnp.sum((w * r**2).reshape(r.shape[0], -1), axis=-1)
               for r, w in zip(jax.tree.leaves(momentum), jax.tree.leaves(inverse_mass)))
