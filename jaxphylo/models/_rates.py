"""Rate variation across sites: categories of relative rates with weights.

Every variant returns `(rates [C], weights [C])` with `sum(weights) = 1` and
`sum(weights * rates) = 1`, so branch lengths keep their meaning of expected
substitutions per site.
"""

from __future__ import annotations

import abc
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
import scipy.stats
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


def _mean_gamma_rates(shape: float, k: int) -> np.ndarray:
    """Yang (1994): category i's mean rate is k [I(a+1, a b_i) - I(a+1, a b_(i-1))], b_i the i/k quantiles."""
    bounds = scipy.stats.gamma.ppf(np.arange(1, k) / k, shape)
    cdf = np.concatenate([[0.0], scipy.special.gammainc(shape + 1.0, bounds), [1.0]])
    return k * np.diff(cdf)


def _host_rates(shape, k):
    return np.array([_mean_gamma_rates(float(a), k) for a in np.ravel(shape)]).reshape(np.shape(shape) + (k,))


def _host_slopes(shape, k):
    """d rates / d shape by a five-point stencil: truncation ~ h^4 = 1e-12, round-off ~ 1e-13."""
    a = np.asarray(shape, float)
    h = 1e-3 * a
    f = lambda x: _host_rates(x, k)
    return (f(a - 2 * h) - 8 * f(a - h) + 8 * f(a + h) - f(a + 2 * h)) / (12 * h)[..., None]


def _rates_struct(shape, k):
    return jax.ShapeDtypeStruct(jnp.shape(shape) + (k,), jnp.result_type(shape, float))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def discrete_gamma_rates(shape: Float[Array, ""], k: int) -> Float[Array, " k"]:
    """Mean rates of the k equal-weight categories of a Gamma(shape, shape) distribution.

    Computed on the host with SciPy: XLA's incomplete gamma is itself a device
    loop, and inverting it cost 20 ms of host round trips per call on an H100
    (benchmarks/breakdown.py); four numbers belong on the CPU.
    """
    out = _rates_struct(shape, k)
    return jax.pure_callback(lambda a: _host_rates(a, k).astype(out.dtype), out, shape, vmap_method="expand_dims")


@discrete_gamma_rates.defjvp
def _discrete_gamma_rates_jvp(k, primals, tangents):
    (shape,), (tangent,) = primals, tangents
    out = _rates_struct(shape, k)
    slopes = jax.pure_callback(lambda a: _host_slopes(a, k).astype(out.dtype), out, shape, vmap_method="expand_dims")
    return discrete_gamma_rates(shape, k), slopes * jnp.asarray(tangent)[..., None]


class DiscreteGamma(RateVariation):
    """Yang (1994) discrete Gamma with `num_categories` equal-weight categories, mean rates."""

    shape: Float[Array, ""]
    num_categories: int = eqx.field(static=True, default=4)

    def categories(self):
        rates = discrete_gamma_rates(self.shape, self.num_categories)
        return rates, jnp.full(self.num_categories, 1.0 / self.num_categories, rates.dtype)


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
