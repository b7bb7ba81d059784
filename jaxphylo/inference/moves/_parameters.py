"""Metropolis-Hastings proposals on substitution-model parameters, as MrBayes makes them.

The chains keep every free parameter in the unconstrained coordinates `u` of
its NumPyro site (`x = f(u)`, `f = biject_to(support)`), and their target is
`pi_u(u) = pi_x(f(u)) |f'(u)|` (the prior in `u` carries the Jacobian). A move
proposes in the parameter's own space with density `q(x' | x)`; in `u` that is
`q(x' | x) |f'(u')|`, so the log Hastings ratio of the chain is

    log q(x | x') - log q(x' | x) + log |f'(u)| - log |f'(u')|.

The moves, one site at a time, chosen by the support:

* simplex (frequencies, exchangeabilities, free rates): Dirichlet,
  `x' ~ Dirichlet(alpha x)` (MrBayes's Dirichlet(Pi), Dirichlet(Revmat));
  `log q(x | x') - log q(x' | x) = log Dir(x; alpha x') - log Dir(x'; alpha x)`.
  The tuning is `1 / alpha` (larger: bolder, as for the other moves).
* positive (kappa, omega, Gamma shape): multiplier `x' = m x`,
  `m = exp(lambda (U - 1/2))`: `log q(x | x') - log q(x' | x) = log m`, and with
  `f = exp` the Jacobian terms are `-log m`: in `u` it is the symmetric walk
  `u' = u + lambda (U - 1/2)`, which is how it is computed.
* interval `(a, b)` (+I): sliding window `x' = x + w (U - 1/2)` reflected back
  into `(a, b)`: symmetric, `log q = 0` (MrBayes's Slider(Pinvar)).
* anything else: `u' = u + w N(0, 1)`, symmetric in `u`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jaxtyping import Array, Float
from numpyro.distributions import biject_to, constraints

START_TUNING = {"simplex": 0.01, "positive": 2.0 * 0.6931471805599453, "interval": 0.1, "real": 0.2}
TINY = 1e-300  # a Dirichlet draw below it has no finite coordinate: clipped (the move is then rejected or rare)


def support_kind(support) -> str:
    if isinstance(support, constraints._Simplex):
        return "simplex"
    if isinstance(support, constraints._GreaterThan) and isinstance(support.lower_bound, (int, float)) \
            and support.lower_bound == 0:
        return "positive"
    if isinstance(support, constraints._Interval):
        return "interval"
    return "real"


def propose_site(key, u: Float[Array, "..."], support, tuning: Float[Array, ""]):
    """One site's proposal `(u', log Hastings ratio in u)` for the move its support calls for."""
    kind, f = support_kind(support), biject_to(support)
    if kind == "positive":
        return u + tuning * (jax.random.uniform(key, u.shape, u.dtype) - 0.5), jnp.zeros((), u.dtype)
    if kind == "real":
        return u + tuning * jax.random.normal(key, u.shape, u.dtype), jnp.zeros((), u.dtype)
    x = f(u)
    if kind == "interval":
        lo, hi = support.lower_bound, support.upper_bound
        moved = x + tuning * (jax.random.uniform(key, u.shape, u.dtype) - 0.5)
        x_new = _reflect(moved, lo, hi)
        log_q = jnp.zeros((), u.dtype)
    else:
        alpha = 1.0 / tuning
        x_new = jnp.maximum(jax.random.dirichlet(key, alpha * x, dtype=u.dtype), TINY)
        x_new = x_new / x_new.sum()
        log_q = dist.Dirichlet(alpha * x_new).log_prob(x) - dist.Dirichlet(alpha * x).log_prob(x_new)
    u_new = f.inv(x_new)
    jacobian = jnp.sum(f.log_abs_det_jacobian(u, x)) - jnp.sum(f.log_abs_det_jacobian(u_new, x_new))
    return u_new, log_q + jacobian


def _reflect(x, lo, hi):
    """`x` folded back into `[lo, hi]` by reflections at the ends (any number of them: the fold is symmetric)."""
    width = hi - lo
    y = jnp.mod(x - lo, 2 * width)
    return lo + jnp.where(y > width, 2 * width - y, y)


def propose_parameters(key, params: dict, supports: dict, tunings: Float[Array, " S"]):
    """One site chosen uniformly (sorted by name) and moved: `(params', log q, the site's index)`."""
    names = sorted(params)
    k_site, k_move = jax.random.split(key)
    chosen = jax.random.randint(k_site, (), 0, len(names))
    moved, log_q = dict(params), jnp.zeros(())
    for i, name in enumerate(names):
        u_new, log_q_i = propose_site(jax.random.fold_in(k_move, i), params[name], supports[name], tunings[i])
        here = chosen == i
        moved[name] = jnp.where(here, u_new, params[name])
        log_q = log_q + jnp.where(here, log_q_i, 0.0)
    return moved, log_q, chosen
