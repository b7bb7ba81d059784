"""Rate variation across sites: categories of relative rates with weights.

Every variant returns `(rates [C], weights [C])` with `sum(weights) = 1` and
`sum(weights * rates) = 1`, so branch lengths keep their meaning of expected
substitutions per site.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.special import gammainc, gammaln, ndtri
from jaxtyping import Array, Float


class RateVariation(eqx.Module):
    """Discrete rate categories."""

    @abc.abstractmethod
    def categories(self) -> tuple[Float[Array, " C"], Float[Array, " C"]]:
        """(rates, weights)."""


class UniformRates(RateVariation):
    """Every site evolves at rate one."""

    def categories(self):
        return jnp.ones(1), jnp.ones(1)


def gamma_quantile(shape: Float[Array, ""], p: Float[Array, " k"]) -> Float[Array, " k"]:
    """Quantiles of Gamma(shape, 1) by Newton's method on log x.

    The iterations carry no gradient; one final Newton step does, which by the
    implicit function theorem gives the exact derivative `-F_shape / F_x`.
    """
    a = jax.lax.stop_gradient(shape)
    wilson_hilferty = a * (1.0 - 1.0 / (9.0 * a) + ndtri(p) / (3.0 * jnp.sqrt(a))) ** 3
    small = jnp.exp((jnp.log(p) + gammaln(a + 1.0)) / a)  # P(a, x) ~ x^a / Gamma(a+1)
    y = jnp.log(jnp.where((a < 1.0) | (wilson_hilferty <= 0.0), small, wilson_hilferty))

    def newton(y, a):
        x = jnp.exp(y)
        log_density_dy = a * y - x - gammaln(a)  # log(pdf(x) * x)
        step = (gammainc(a, x) - p) * jnp.exp(-log_density_dy)
        return y - jnp.clip(step, -2.0, 2.0)

    y = jax.lax.fori_loop(0, 60, lambda _, y: newton(y, a), y)
    return jnp.exp(newton(jax.lax.stop_gradient(y), shape))


class DiscreteGamma(RateVariation):
    """Yang (1994) discrete Gamma with `num_categories` equal-weight categories, mean rates."""

    shape: Float[Array, ""]
    num_categories: int = eqx.field(static=True, default=4)

    def categories(self):
        k = self.num_categories
        a = self.shape
        bounds = gamma_quantile(a, jnp.arange(1, k, dtype=jnp.result_type(a, float)) / k)
        cdf = jnp.concatenate([jnp.zeros(1, bounds.dtype), gammainc(a + 1.0, bounds), jnp.ones(1, bounds.dtype)])
        rates = k * jnp.diff(cdf)
        return rates, jnp.full(k, 1.0 / k, rates.dtype)


class FreeRates(RateVariation):
    """Free-rate model (+R k): free weights and rates, rescaled to mean one."""

    weights: Float[Array, " k"]
    rates: Float[Array, " k"]

    def categories(self):
        w = self.weights / jnp.sum(self.weights)
        return self.rates / jnp.sum(w * self.rates), w


class InvariantSites(RateVariation):
    """A proportion `proportion_invariant` of sites at rate zero, the rest following `base`."""

    proportion_invariant: Float[Array, ""]
    base: RateVariation

    def categories(self):
        rates, weights = self.base.categories()
        p = self.proportion_invariant
        return (
            jnp.concatenate([jnp.zeros(1, rates.dtype), rates / (1.0 - p)]),
            jnp.concatenate([jnp.reshape(p, (1,)), (1.0 - p) * weights]),
        )
