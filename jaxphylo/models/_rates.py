"""Rate variation across sites: categories of relative rates with weights.

Every variant returns `(rates [C], weights [C])` with `sum(weights) = 1` and
`sum(weights * rates) = 1`, so branch lengths keep their meaning of expected
substitutions per site.
"""

from __future__ import annotations

import abc
import functools
import math
from fractions import Fraction
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
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


# --- The regularised incomplete gamma function, without loops ----------------------------------
#
# XLA's igamma is a while loop (series or continued fraction, up to 2000 terms), and on a GPU each
# trip of a while loop copies its predicate to the host: Halley steps on it cost ~2.8 ms a call on
# an H100, more than the SciPy callback this replaces. Here P(a, x) is straight-line array code.
# With x = a e^u, eta^2 / 2 = h = e^u - 1 - u (sign of u), and
# T_0 = x^a e^-x / Gamma(a + 1) = e^(-a h) / (sqrt(2 pi a) Gamma*(a)) (Gamma* the scaled gamma
# function, DLMF 5.11.3), which stays accurate where a log x, x and lgamma(a) are all large:
#
# * a < _TEMME_FROM: P(a, x) = sum_n T_n, T_n = e^-x x^(a+n) / Gamma(a+n+1), summed over a fixed
#   n < _SERIES_TERMS (within 1e-14 out to x ~ 50, the 1 - 1e-6 quantile of these shapes),
#   and P(a + 1, x) = sum_(n>=1) T_n, without cancellation.
# * a >= _TEMME_FROM: Temme's uniform expansion (DLMF 8.12.3-8.12.7),
#   Q(a, x) = erfc(eta sqrt(a/2)) / 2 + S,  P(a, x) = erfc(-eta sqrt(a/2)) / 2 - S,
#   S = e^(-a h) / sqrt(2 pi a) sum_(k < _TEMME_ORDER) c_k(eta) a^-k, with each c_k a Maclaurin
#   polynomial in eta (`_temme_coefficients`); error ~1e-14 from a = 20 on. P(a + 1, x) = P - T_0.

_SERIES_TERMS = 96
_TEMME_FROM = 20.0
_TEMME_ORDER, _TEMME_DEGREE = 10, 30
_STIRLING_FROM, _STIRLING_TERMS = 7.0, 8


def _bernoulli(count: int) -> list[Fraction]:
    b = [Fraction(1)]
    for m in range(1, count + 1):
        b.append(-sum(math.comb(m + 1, j) * b[j] for j in range(m)) / (m + 1))
    return b


@functools.cache
def _temme_coefficients() -> np.ndarray:
    """d[k, n] with c_k(eta) = sum_n d[k, n] eta^n (DLMF 8.12.9-8.12.12), exact rationals rounded once.

    mu = lambda - 1 = sum alpha_n eta^n follows from mu mu' = eta (1 + mu), the derivative of
    mu - log(1 + mu) = eta^2 / 2; then c_0 = 1/mu - 1/eta and c_k = c_(k-1)' / eta + (-1)^k g_k / mu,
    with g_k the Stirling coefficients of Gamma (DLMF 5.11.3); each c_k is regular at eta = 0.
    """
    order, degree = _TEMME_ORDER, _TEMME_DEGREE
    size = degree + 2 * order + 3
    alpha = [Fraction(0), Fraction(1)]
    for m in range(2, size + 1):
        alpha.append((alpha[m - 1] - sum(n * alpha[n] * alpha[m + 1 - n] for n in range(2, m))) / (m + 1))
    inverse = [Fraction(1)]  # 1/mu = sum_i inverse[i] eta^(i - 1): the reciprocal of mu / eta
    for m in range(1, size):
        inverse.append(-sum(alpha[j + 1] * inverse[m - j] for j in range(1, m + 1)))
    bernoulli = _bernoulli(order + 1)
    log_g = [Fraction(0)] * order  # log sum_k g_k z^-k = sum_j B_2j / (2j (2j - 1)) z^(1 - 2j)
    for j in range(1, order // 2 + 1):
        log_g[2 * j - 1] = bernoulli[2 * j] / (2 * j * (2 * j - 1))
    g, power = [Fraction(1)] + [Fraction(0)] * (order - 1), [Fraction(1)] + [Fraction(0)] * (order - 1)
    for m in range(1, order):  # g = exp(log_g), term by term
        power = [sum(power[i] * log_g[n - i] for i in range(n + 1)) / m for n in range(order)]
        g = [x + y for x, y in zip(g, power)]
    c = inverse[1:]  # c_0: 1/mu less its pole 1/eta
    rows = [c]
    for k in range(1, order):
        laurent = [n * c[n] + (-1) ** k * g[k] * inverse[n - 1] for n in range(1, len(c))]
        assert laurent[0] == 0  # the poles cancel: c_k is regular at eta = 0
        c = laurent[1:]
        rows.append(c)
    return np.array([[float(v) for v in row[: degree + 1]] for row in rows])


@functools.cache
def _stirling_coefficients() -> tuple[float, ...]:
    """B_2j / (2j (2j - 1)): log Gamma*(a) ~ sum_j these a^(1 - 2j) (DLMF 5.11.1)."""
    b = _bernoulli(2 * _STIRLING_TERMS)
    return tuple(float(b[2 * j] / (2 * j * (2 * j - 1))) for j in range(1, _STIRLING_TERMS + 1))


class _Shape(NamedTuple):
    """What P(a, .) needs of a alone, worked out once for all of Halley's steps."""

    a: Array
    log_a: Array
    log_scale: Array  # log(sqrt(2 pi a) Gamma*(a)), so log T_0 = -a h - log_scale
    temme: Array  # a >= _TEMME_FROM
    big_a: Array  # a where temme, else _TEMME_FROM: keeps the branch not taken finite
    big_powers: Array  # [..., _TEMME_ORDER] big_a^-k
    log_rising: Array  # [..., _SERIES_TERMS] sum_(j=1..n) log(1 + j/a) = log((a+1)...(a+n) / a^n)
    # for d/da at fixed u, which `_incomplete_gamma_slopes` writes out (faster to compile than autodiff):
    log_scale_slope: Array  # d log_scale / da = digamma(a + 1) - log a
    rising_slope: Array  # [..., _SERIES_TERMS] -d log_rising / da = sum_(j=1..n) j / (a (a + j))


def _shape(a: Array) -> _Shape:
    """The a-only parts of `_incomplete_gamma`, each finite whichever branch a takes."""
    log_a = jnp.log(a)
    large = a >= _STIRLING_FROM  # log Gamma*(a) = lgamma(a + 1) - a log a + a - log(2 pi a) / 2
    a_large = jnp.where(large, a, _STIRLING_FROM)
    coefficients = _stirling_coefficients()
    stirling = functools.reduce(lambda acc, c: acc / a_large**2 + c, reversed(coefficients), 0.0) / a_large
    stirling_slope = functools.reduce(  # d/da sum_j c_j a^(1 - 2j) = sum_j (1 - 2j) c_j a^-2j
        lambda acc, jc: acc / a_large**2 + (1 - 2 * jc[0]) * jc[1], reversed(list(enumerate(coefficients, 1))), 0.0
    ) / a_large**2
    a_small = jnp.where(large, 1.0, a)
    direct = (jax.scipy.special.gammaln(a_small + 1) - a_small * jnp.log(a_small) + a_small
              - 0.5 * jnp.log(2 * jnp.pi * a_small))
    log_gamma_star = jnp.where(large, stirling, direct)
    log_gamma_star_slope = jnp.where(  # digamma(a + 1) - log a - 1 / (2a)
        large, stirling_slope, jax.scipy.special.digamma(a_small + 1) - jnp.log(a_small) - 0.5 / a_small)
    temme = a >= _TEMME_FROM
    big_a = jnp.where(temme, a, _TEMME_FROM)
    small_a = jnp.where(temme, 1.0, a)[..., None]
    j = jnp.arange(_SERIES_TERMS, dtype=a.dtype)
    upper = jnp.triu(jnp.ones((_SERIES_TERMS, _SERIES_TERMS), a.dtype))  # a cumulative sum; XLA compiles a dot fastest
    return _Shape(
        a=a,
        log_a=log_a,
        log_scale=0.5 * jnp.log(2 * jnp.pi) + 0.5 * log_a + log_gamma_star,
        temme=temme,
        big_a=big_a,
        big_powers=big_a[..., None] ** -jnp.arange(_TEMME_ORDER, dtype=a.dtype),
        log_rising=jnp.matmul(jnp.log1p(j / small_a), upper, precision=jax.lax.Precision.HIGHEST),
        log_scale_slope=0.5 / a + log_gamma_star_slope,
        rising_slope=jnp.matmul(j / (small_a * (small_a + j)), upper, precision=jax.lax.Precision.HIGHEST),
    )


def _half_eta_squared(u: Array) -> tuple[Array, Array]:
    """(h, eta): h = eta^2 / 2 = e^u - 1 - u, eta = sign(u) sqrt(2 h); by series near u = 0, where both are smooth."""
    near = jnp.abs(u) < 0.1  # beyond, expm1(u) - u loses at most 2 eps / |u| = 5e-15 relative
    v = jnp.where(near, u, 0.0)
    ratio = functools.reduce(lambda acc, n: 1 + acc * v / n, range(13, 2, -1), 1.0)  # 2h/u^2 = 1 + u/3 (1 + u/4 (...))
    far = jnp.where(near, 1.0, u)
    h_far = jnp.expm1(far) - far
    h = jnp.where(near, v * v * ratio / 2, h_far)
    eta = jnp.where(near, v * jnp.sqrt(ratio), jnp.sign(far) * jnp.sqrt(2 * h_far))
    return h, eta


def _incomplete_gamma(s: _Shape, u: Array, slopes: bool = False) -> tuple[Array, ...]:
    """(P(a, x), Q(a, x), P(a + 1, x), log T_0) at x = a e^u; with `slopes`, also d/da at fixed u of
    P(a, x) and P(a + 1, x) (x = a e^u moving with a)."""
    h, eta = _half_eta_squared(u)
    log_t0 = -s.a * h - s.log_scale
    t0 = jnp.exp(log_t0)

    # the series: log(T_n / T_0) = n u - log_rising[n], a difference of moderate numbers where
    # n log x - lgamma(a+n+1) + lgamma(a+1) would be one of large ones (float32 would lose 1e-5)
    n = jnp.arange(_SERIES_TERMS, dtype=u.dtype)
    terms = jnp.exp(log_t0[..., None] + n * u[..., None] - s.log_rising)
    p_series = jnp.sum(terms, axis=-1)
    p1_series = jnp.sum(terms[..., 1:], axis=-1)

    # Temme's expansion
    eta = jnp.where(s.temme, eta, 0.0)
    eta_powers = eta[..., None] ** jnp.arange(_TEMME_DEGREE + 1, dtype=u.dtype)
    c = jnp.sum(jnp.asarray(_temme_coefficients(), u.dtype) * eta_powers[..., None, :], axis=-1)  # [..., k] c_k(eta)
    scale = jnp.exp(-s.big_a * jnp.where(s.temme, h, 0.0)) / jnp.sqrt(2 * jnp.pi * s.big_a)
    tail = scale * jnp.sum(c * s.big_powers, axis=-1)
    root = eta * jnp.sqrt(s.big_a / 2)
    normal = 0.5 * jax.scipy.special.erfc(jnp.abs(root))  # normal tail beyond |root|: one erfc serves P and Q
    q_temme = jnp.where(root > 0, normal, 1 - normal) + tail
    p_temme = jnp.where(root > 0, 1 - normal, normal) - tail

    p = jnp.where(s.temme, p_temme, p_series)
    q = jnp.where(s.temme, q_temme, 1 - p_series)  # P >= 1/k at the quantiles: 1 - P loses a factor k at most
    p1 = jnp.where(s.temme, p_temme - t0, p1_series)
    if not slopes:
        return p, q, p1, log_t0

    # d log T_0 / da = -h - log_scale_slope and d log(T_n / T_0) / da = rising_slope[n]
    t0_slope = -h - s.log_scale_slope
    weighted = terms * (t0_slope[..., None] + s.rising_slope)
    # d/da erfc(-eta sqrt(a/2)) / 2 = e^(-a h) eta / (2 sqrt(2 pi a)); S = scale sum_k c_k a^-k
    k = jnp.arange(_TEMME_ORDER, dtype=u.dtype)
    tail_slope = (tail * (-jnp.where(s.temme, h, 0.0) - 0.5 / s.big_a)
                  - scale * jnp.sum(k * c * s.big_powers, axis=-1) / s.big_a)
    p_temme_slope = scale * eta / 2 - tail_slope
    dp = jnp.where(s.temme, p_temme_slope, jnp.sum(weighted, axis=-1))
    dp1 = jnp.where(s.temme, p_temme_slope - t0 * t0_slope, jnp.sum(weighted[..., 1:], axis=-1))
    return p, q, p1, log_t0, dp, dp1


# --- Quantiles and rates ----------------------------------------------------------------------

_HALLEY_STEPS = 3  # 2 reach 1e-13 from the start below for shapes 0.01 .. 1000 and k <= 16, 3 round-off for k <= 64


def _gamma_quantiles(s: _Shape, p: Array) -> Array:
    """u = log(x / a) with P(a, x) = p, for probabilities `p` [k-1] and shapes `s.a` [..., k-1].

    x is the p-quantile of Gamma(a, 1) and e^u = x / a that of Gamma(a, rate a). u carries the
    iteration, not x or log x: for large a it is small, which keeps float32's precision. Halley's
    method on g(u) = log P(a, a e^u) - log p where p <= 1/2, on g(u) = log Q(a, a e^u) - log(1 - p)
    above. Both are concave (the log-Gamma density is log-concave, hence so are its distribution
    and survival functions) and nearly linear in the tail they describe; with w = x f(a, x) = a T_0
    (f the Gamma density) and T the tail in use (P or Q), g' = +-w / T and g'' = g' (a - x) - g'^2.
    For a concave monotone g every Newton iterate after the first lies on one side of the root
    (below it for P, above it for Q) and converges monotonically; Halley's step, capped at twice
    Newton's, gets there in ~3 steps rather than ~5. The start is the larger of a lower bound,
    from P(a, x) <= x^a / Gamma(a + 1): log x = (log p + lgamma(a + 1)) / a (tight as a -> 0), and
    Wilson-Hilferty, x = a (1 - 1/(9a) + z_p / (3 sqrt a))^3, z_p the normal quantile (tight for
    a >~ 1). x stays inside [e^2 tiny, sqrt(max)]: a float32 quantile below ~1e-37 (shape < ~0.03,
    first of 16 categories) stops at that floor, where its category's rate rounds to zero anyway.
    The steps are unrolled: a loop would cost a host round trip per trip on a GPU.
    """
    a = s.a
    finfo = jnp.finfo(a.dtype)
    u_min, u_max = jnp.log(finfo.tiny) + 2 - s.log_a, jnp.log(finfo.max) / 2 - s.log_a
    lower = p <= 0.5
    log_tail = jnp.where(lower, jnp.log(p), jnp.log1p(-p))
    sign = jnp.where(lower, 1.0, -1.0).astype(a.dtype)

    u_small = (jnp.log(p) + jax.scipy.special.gammaln(a + 1)) / a - s.log_a
    cube_root = 1 - 1 / (9 * a) + jax.scipy.special.ndtri(p) / (3 * jnp.sqrt(a))
    positive = cube_root > 0
    u_wilson = jnp.where(positive, 3 * jnp.log(jnp.where(positive, cube_root, 1.0)), -jnp.inf)
    u = jnp.clip(jnp.maximum(u_small, u_wilson), u_min, u_max)

    for _ in range(_HALLEY_STEPS):
        p_lower, q_upper, _, log_t0 = _incomplete_gamma(s, u)
        tail = jnp.where(lower, p_lower, q_upper)
        slope = sign * jnp.exp(s.log_a + log_t0) / tail
        newton = (jnp.log(tail) - log_tail) / slope
        curvature = slope * (a - a * jnp.exp(u)) - slope**2
        step = newton / jnp.maximum(1 - newton * curvature / (2 * slope), 0.5)
        u = jnp.clip(u - jnp.where(jnp.isfinite(step), step, 0.0), u_min, u_max)
    return u


def _probabilities(k: int, median: bool) -> np.ndarray:
    """Where the quantiles are taken: the k-1 inner category bounds i/k (i = 1..k-1), or with `median`
    the k category medians (2i + 1) / (2k) (i = 0..k-1)."""
    return (2 * np.arange(k) + 1) / (2 * k) if median else np.arange(1, k) / k


def _shape_and_quantiles(shape, k: int, median: bool = False) -> tuple[_Shape, Array]:
    """(`_shape` of a [..., n], u_j = log(x_j / a), x_j the p_j quantile of Gamma(a, 1)), p = `_probabilities`.

    a is broadcast to [..., n] behind an optimisation barrier: left a broadcast, XLA splits each
    expression into its a-only and its per-quantile parts and compiles for 2.5 times as long.
    """
    p = _probabilities(k, median)
    a = jnp.asarray(shape, jnp.result_type(shape, float))
    a = jax.lax.optimization_barrier(jnp.broadcast_to(a[..., None], a.shape + p.shape))
    s = _shape(a)
    return s, _gamma_quantiles(s, jnp.asarray(p, a.dtype))


def _rates_from_cdf(cdf: Array, ends: float, k: int) -> Array:
    """k [C_i - C_(i-1)], with C_0 = 0 and C_k = `ends` (1 for the rates, 0 for their derivatives)."""
    zero = jnp.zeros(cdf.shape[:-1] + (1,), cdf.dtype)
    return k * jnp.diff(jnp.concatenate([zero, cdf, zero + ends], axis=-1), axis=-1)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def discrete_gamma_rates(shape: Float[Array, ""], k: int) -> Float[Array, " k"]:
    r"""Mean rates of the k equal-weight categories of a Gamma(shape, shape) distribution (Yang 1994).

    With a = shape, P(a, x) the regularised lower incomplete gamma function and x_i the i/k
    quantile of Gamma(a, 1) (so b_i = x_i / a is that of Gamma(a, rate a)):

        P(a, x_i) = i / k,   i = 1 .. k-1,   x_0 = 0,   x_k = inf,
        rate_i = k [P(a + 1, x_i) - P(a + 1, x_(i-1))],

    since x times the Gamma(a, 1) density is a times the Gamma(a + 1, 1) density. The quantiles
    come from a fixed number of Halley steps (`_gamma_quantiles`) on a loop-free incomplete gamma
    function (`_incomplete_gamma`): all on device, with no callback and no while loop, so nothing
    waits on the host. It works under jit, vmap and grad, in the dtype of `shape` (float64: ~1e-13
    relative; float32: a few 1e-5 at k = 16), for any batch shape of `shape` (output
    `shape.shape + (k,)`).

    The derivative in a is exact, by a custom JVP, not by differentiating the iterations: the
    implicit function theorem on P(a, x_i) = i/k gives dx_i/da = -dP/da(a, x_i) / f(a, x_i), with
    f(a, x) = x^(a-1) e^-x / Gamma(a) the density, and since f(a + 1, x) = f(a, x) x / a,

        d/da P(a + 1, x_i(a)) = dP/da(a + 1, x_i) - (x_i / a) dP/da(a, x_i),

    dP/da being at fixed x (what `jax.lax.igamma_grad_a` gives, but that is a loop too). The code
    differentiates P in a at fixed u = log(x / a) instead (`_incomplete_gamma(..., slopes=True)`,
    by hand: the series term by term, Temme's expansion through erfc, e^(-a h) and a^-k): that adds
    f(a, x) x/a to dP/da(a, x) and f(a + 1, x) x/a = f(a, x) (x/a)^2 to dP/da(a + 1, x), which cancel
    in the combination above. Second derivatives go through the Halley steps: close (~1e-8), not exact.
    """
    return _rates(shape, k)


@discrete_gamma_rates.defjvp
def _discrete_gamma_rates_jvp(k, primals, tangents):
    (shape,), (tangent,) = primals, tangents
    rates, slopes = _rates_and_slopes(shape, k)
    return rates, slopes * jnp.asarray(tangent, rates.dtype)[..., None]


# jitted, so that a call outside jit compiles once rather than dispatching some 300 operations
@functools.partial(jax.jit, static_argnums=1)
def _rates(shape, k: int) -> Array:
    s, u = _shape_and_quantiles(shape, k)
    return _rates_from_cdf(_incomplete_gamma(s, u)[2], 1.0, k)


@functools.partial(jax.jit, static_argnums=1)
def _rates_and_slopes(shape, k: int) -> tuple[Array, Array]:
    s, u = _shape_and_quantiles(shape, k)
    _, _, cdf, _, dp_da, dcdf_da = _incomplete_gamma(s, u, slopes=True)
    return _rates_from_cdf(cdf, 1.0, k), _rates_from_cdf(dcdf_da - jnp.exp(u) * dp_da, 0.0, k)


def median_gamma_rates(shape: Float[Array, ""], k: int) -> Float[Array, " k"]:
    r"""Median rates of the k equal-weight categories of a Gamma(shape, shape) distribution (Yang 1994).

    Yang's "median" method, which BEAST 1.10's GammaSiteRateModel uses (IQ-TREE 2: `--gamma-median`):
    with b_i the (2i + 1) / (2k) quantile of Gamma(a, rate a), i = 0..k-1 (the median of category i),

        rate_i = k b_i / sum_j b_j,

    rescaled so that the rates average one. With u_i = log b_i that is k softmax(u)_i, which stays
    finite where the lowest b_i underflows (small shapes). The u_i come from the quantile code that
    `discrete_gamma_rates` uses (on device, no loop, dtype of `shape`, any batch shape); their
    derivative in a is implicit (`_median_log_quantiles`), the softmax is differentiated as it stands.
    """
    return k * jax.nn.softmax(_median_log_quantiles(shape, k), axis=-1)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _median_log_quantiles(shape, k: int) -> Array:
    r"""u_i = log b_i, b_i the (2i + 1) / (2k) quantile of Gamma(a, rate a), i = 0..k-1 ([..., k]).

    Derivative by the implicit function theorem on P(a, a e^(u_i)) = p_i, not through the Halley
    steps: with dP/da taken at fixed u (`_incomplete_gamma(..., slopes=True)`) and
    dP/du = x f(a, x) = a T_0 (x = a e^u, f the Gamma(a, 1) density),

        du_i/da = -(dP/da)(a, u_i) / (a T_0(a, u_i)).
    """
    return _log_medians(shape, k)


@_median_log_quantiles.defjvp
def _median_log_quantiles_jvp(k, primals, tangents):
    (shape,), (tangent,) = primals, tangents
    u, slopes = _log_medians_and_slopes(shape, k)
    return u, slopes * jnp.asarray(tangent, u.dtype)[..., None]


@functools.partial(jax.jit, static_argnums=1)
def _log_medians(shape, k: int) -> Array:
    return _shape_and_quantiles(shape, k, median=True)[1]


@functools.partial(jax.jit, static_argnums=1)
def _log_medians_and_slopes(shape, k: int) -> tuple[Array, Array]:
    s, u = _shape_and_quantiles(shape, k, median=True)
    _, _, _, log_t0, dp_da, _ = _incomplete_gamma(s, u, slopes=True)
    return u, -dp_da * jnp.exp(-s.log_a - log_t0)


class DiscreteGamma(RateVariation):
    """Yang (1994) discrete Gamma with `num_categories` equal-weight categories: each category's
    mean rate (`discrete_gamma_rates`; IQ-TREE, MrBayes), or with `median` its median rate
    rescaled to mean one (`median_gamma_rates`; BEAST 1.10, IQ-TREE's `--gamma-median`)."""

    shape: Float[Array, ""]
    num_categories: int = eqx.field(static=True, default=4)
    median: bool = eqx.field(static=True, default=False)

    def categories(self):
        rates = (median_gamma_rates if self.median else discrete_gamma_rates)(self.shape, self.num_categories)
        return rates, jnp.full(self.num_categories, 1.0 / self.num_categories, rates.dtype)


class FreeRates(RateVariation):
    """Free-rate model (+R k): free weights and rates, rescaled to mean one."""

    weights: Float[Array, " k"]
    rates: Float[Array, " k"]

    def categories(self):
        w = self.weights / jnp.sum(self.weights)
        return self.rates / jnp.sum(w * self.rates), w


class FixedCategories(RateVariation):
    """Rate categories computed once: a rate variation whose parameters do not move (`Model.with_fixed_parts`)."""

    rates: Float[Array, " C"]
    weights: Float[Array, " C"]

    def categories(self):
        return self.rates, self.weights


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
