"""Discrete-Gamma rates on device: against SciPy in float64 and float32, exact derivative, jit/vmap, no host work;
the same for the median rates (`+G4m`).

Each distinct (k, dtype, batch shape, transformation) compiles once (~1 s on a CPU), so the tests share
their batches: the float64 rates and their derivatives come from one JVP per k.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import scipy.stats

import jaxphylo as jp
from jaxphylo.models import discrete_gamma_rates, median_gamma_rates

SHAPES = np.geomspace(0.02, 200.0, 25)


def scipy_rates(shape: float, k: int) -> np.ndarray:
    """Yang (1994) as the former host code computed it: k [P(a+1, x_i) - P(a+1, x_(i-1))], x_i = ppf(i/k)."""
    bounds = scipy.stats.gamma.ppf(np.arange(1, k) / k, shape)
    cdf = np.concatenate([[0.0], scipy.special.gammainc(shape + 1.0, bounds), [1.0]])
    return k * np.diff(cdf)


@functools.cache
def rates_and_slopes(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rates [25, k] for the batch SHAPES and d rates / d shape: the shapes of a batch are independent,
    so one JVP with unit tangents gives every derivative."""
    shapes = jnp.asarray(SHAPES)
    rates, slopes = jax.jvp(lambda a: discrete_gamma_rates(a, k), (shapes,), (jnp.ones_like(shapes),))
    return np.asarray(rates), np.asarray(slopes)


@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_rates_match_scipy_in_float64(k):
    got, _ = rates_and_slopes(k)
    assert_rates_match(got, np.array([scipy_rates(a, k) for a in SHAPES]))


def assert_rates_match(got, want):
    """float64 rates equal to SciPy's to 1e-10, averaging one, increasing across the categories."""
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=0)
    np.testing.assert_allclose(got.mean(axis=1), 1.0, rtol=0, atol=1e-14)
    assert np.all(np.diff(got, axis=1) > 0)


@pytest.mark.parametrize("k", [4, 16])
def test_float32_in_float32_out(k):
    batch = (5, 5) if k == 4 else (25,)  # batches of any number of dimensions: [..., k] out
    got = np.asarray(discrete_gamma_rates(jnp.asarray(SHAPES, jnp.float32).reshape(batch), k)).reshape(25, k)
    want = np.array([scipy_rates(a, k) for a in SHAPES])
    assert got.dtype == np.float32
    # k [C_i - C_(i-1)] magnifies float32 round-off in C by k: up to ~3e-5 relative at k = 16. Rates
    # below float32's range (the first categories for shapes < ~0.03) come out as zero or a denormal.
    np.testing.assert_allclose(got, want, rtol=5e-5, atol=1e-30)
    np.testing.assert_allclose(got.mean(axis=1), 1.0, rtol=0, atol=1e-6)


@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_derivative_matches_finite_differences_of_scipy(k):
    _, slopes = rates_and_slopes(k)
    assert_slopes_match_stencil(scipy_rates, SHAPES, slopes, k)


def assert_slopes_match_stencil(reference, shapes, slopes, k):
    """`slopes[i] = d reference(a, k) / da` at every shape, by a five-point central stencil.

    The stencil uses h = 1e-3 a min(a, 1). Its truncation error is ~(h d log r/da)^4 / 30; for small a the
    lowest categories go like exp(-c/a) (c < 3 for k <= 16; the lowest medians like (2k)^(-1/a)), so
    d log r/da ~ c/a^2 and h must shrink like a^2 to keep h d log r/da ~ 3e-3, i.e. truncation ~1e-12.
    Round-off is ~eps |r| / h: negligible against 1e-7 |dr/da| except for the top category at small a,
    where dr/da = -(sum of the tiny ones) sits far below |r| / h; hence the absolute allowance.
    """
    for a, slope in zip(shapes, slopes):
        h = 1e-3 * a * min(a, 1.0)
        stencil = (reference(a - 2 * h, k) - 8 * reference(a - h, k)
                   + 8 * reference(a + h, k) - reference(a + 2 * h, k)) / (12 * h)
        allowance = 1e-7 * np.abs(stencil) + 1e-12 * np.abs(reference(a, k)) / h
        assert np.all(np.abs(slope - stencil) <= allowance), (a, slope, stencil)


def test_jit_vmap_batches_and_no_host_callback():
    shapes = jnp.asarray(SHAPES)
    weights = jnp.arange(1.0, 5)
    loss = lambda a: jnp.sum(weights * discrete_gamma_rates(a, 4))  # noqa: E731
    values, grads = jax.jit(jax.vmap(jax.value_and_grad(loss)))(shapes)  # reverse mode, by the custom JVP
    rates, slopes = rates_and_slopes(4)
    np.testing.assert_allclose(values, rates @ weights, rtol=1e-14)
    np.testing.assert_allclose(grads, slopes @ weights, rtol=1e-12)
    np.testing.assert_array_equal(discrete_gamma_rates(0.7, 1), [1.0])

    jaxpr = str(jax.make_jaxpr(jax.vmap(jax.value_and_grad(loss)))(shapes))
    assert "callback" not in jaxpr
    assert "while" not in jaxpr  # on a GPU every trip of a while loop waits on the host

    rates, weights = jp.models.DiscreteGamma(jnp.asarray(0.5), 4).categories()  # the plain (primal) path
    np.testing.assert_allclose(rates, scipy_rates(0.5, 4), rtol=1e-12)
    np.testing.assert_allclose(weights, 0.25)


# --- median rates (+G4m) ---------------------------------------------------------------------------

MEDIAN_SHAPES = np.geomspace(0.05, 50.0, 19)


def scipy_median_rates(shape: float, k: int) -> np.ndarray:
    """Yang (1994)'s median method: b_i = ppf((2i + 1) / (2k)) of Gamma(a, rate a), rescaled to mean one."""
    medians = scipy.stats.gamma.ppf((2 * np.arange(k) + 1) / (2 * k), shape, scale=1 / shape)
    return k * medians / medians.sum()


@functools.cache
def median_rates_and_slopes(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Median rates [19, k] for MEDIAN_SHAPES and their derivatives in the shape, by one JVP (as above)."""
    shapes = jnp.asarray(MEDIAN_SHAPES)
    rates, slopes = jax.jvp(lambda a: median_gamma_rates(a, k), (shapes,), (jnp.ones_like(shapes),))
    return np.asarray(rates), np.asarray(slopes)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_median_rates_match_scipy_in_float64(k):
    got, _ = median_rates_and_slopes(k)
    assert_rates_match(got, np.array([scipy_median_rates(a, k) for a in MEDIAN_SHAPES]))
    np.testing.assert_array_equal(median_gamma_rates(0.7, 1), [1.0])


@pytest.mark.parametrize("k", [2, 4, 8])
def test_median_derivative_matches_finite_differences_of_scipy(k):
    _, slopes = median_rates_and_slopes(k)
    np.testing.assert_allclose(slopes.sum(axis=1), 0.0, rtol=0, atol=1e-12)  # the mean stays one
    assert_slopes_match_stencil(scipy_median_rates, MEDIAN_SHAPES, slopes, k)


def test_median_rates_in_float32_under_grad_and_in_the_model():
    got = np.asarray(median_gamma_rates(jnp.asarray(MEDIAN_SHAPES, jnp.float32), 4))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [scipy_median_rates(a, 4) for a in MEDIAN_SHAPES], rtol=2e-5)

    weights = jnp.arange(1.0, 5)
    grads = jax.jit(jax.vmap(jax.grad(lambda a: jnp.sum(weights * median_gamma_rates(a, 4)))))(
        jnp.asarray(MEDIAN_SHAPES))  # reverse mode, through the custom JVP of the log quantiles
    np.testing.assert_allclose(grads, median_rates_and_slopes(4)[1] @ weights, rtol=1e-12)

    rates, weights = jp.models.DiscreteGamma(jnp.asarray(0.5), 4, median=True).categories()
    np.testing.assert_allclose(rates, scipy_median_rates(0.5, 4), rtol=1e-12)
    np.testing.assert_allclose(weights, 0.25)
    assert not np.allclose(rates, jp.models.DiscreteGamma(jnp.asarray(0.5), 4).categories()[0], rtol=1e-2)
