"""Candidates fitted in batches: every candidate with the same state count and rate type is one compiled
program, the model being data (an exchangeability basis, a mask of free classes, the frequencies), fitted by
`vmap` of the L-BFGS loop."""

from __future__ import annotations

import math
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
from ...data import DNA, PROTEIN
from ...tree import Tree
from ...likelihood import data_log_likelihood
from ...models import (
    DiscreteGamma,
    FreeRates,
    InvariantSites,
    Model,
    NAMED_DNA_MODELS,
    RateVariation,
    SubstitutionModel,
    UniformRates,
    discrete_gamma_rates,
    empirical_matrix,
    rate_classes,
)
from .._fit import _tree_lengths
from .._optimise import minimise
from ._candidates import Candidate, MAX_INVARIANT, _DNA_NAMES


MIN_SHAPE, MAX_SHAPE = 0.02, 1000.0  # IQ-TREE's bounds on the Gamma shape
_PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))


class _Exchangeable(SubstitutionModel):
    """A reversible model given by its exchangeability matrix (data, so every matrix shares one program)."""

    matrix: jax.Array
    frequencies: jax.Array
    alphabet: object = eqx.field(static=True)

    def exchangeabilities(self):
        return self.matrix


class _Categories(RateVariation):
    """Rate categories given as arrays (zero weights allowed: padding)."""

    rates: jax.Array
    weights: jax.Array

    def categories(self):
        return self.rates, self.weights


class _Spec(eqx.Module):
    """A candidate as arrays, so that every candidate of one state count shares one compiled fit.

    Exchangeabilities `R = sum_c exp(theta_c free_c) basis_c` (DNA: one basis
    matrix per rate class, GT's class the reference; protein: the matrix, fixed);
    frequencies fixed. Rate variation in a padded layout of `1 + K` categories
    (K = 4, or 10 past +R4): category 0 the invariable sites (weight
    `invariant * p`), then the Gamma's four (`gamma`), the `free_mask`ed +R
    categories, or one category of rate 1; unused categories have weight 0.
    """

    basis: jax.Array  # [classes, S, S]
    free: jax.Array  # [classes] 1.0 where theta_c is estimated
    frequencies: jax.Array  # [S]
    invariant: jax.Array  # 1.0 with +I
    gamma: jax.Array  # 1.0 with +G4
    free_mask: jax.Array  # [K] 1.0 for the categories of +R k
    alphabet: object = eqx.field(static=True)


def _padding(candidates) -> int:
    """K of the padded layout: 4 unless some candidate has +R5 or more, then 10."""
    return 4 if max(c.categories for c in candidates) <= 4 else max(10, max(c.categories for c in candidates))


def _spec(candidate: Candidate, empirical: np.ndarray, padding: int) -> _Spec:
    k = candidate.categories
    rates = dict(invariant=jnp.asarray(float("+I" in candidate.rate)), gamma=jnp.asarray(float("G" in candidate.rate)),
                 free_mask=jnp.asarray((np.arange(padding) < k).astype(float)))
    if candidate.protein:
        matrix, own = empirical_matrix(candidate.base)
        pi = empirical if candidate.frequency else own
        return _Spec(jnp.asarray(matrix[None]), jnp.zeros(1), jnp.asarray(pi), alphabet=PROTEIN, **rates)
    classes = rate_classes(NAMED_DNA_MODELS[_DNA_NAMES[candidate.base]][0])
    k = max(classes) + 1
    basis = np.zeros((6, 4, 4))
    for (i, j), c in zip(_PAIRS, classes):
        basis[c, i, j] = basis[c, j, i] = 1.0
    free = np.zeros(6)
    free[: k - 1] = 1.0  # GT's class (k - 1) is the reference, rate 1
    pi = empirical if candidate.frequency else np.full(4, 0.25)
    return _Spec(jnp.asarray(basis), jnp.asarray(free), jnp.asarray(pi), alphabet=DNA, **rates)


def _shape(u):
    """Gamma shape in IQ-TREE's bounds [0.02, 1000], log-sigmoid in `u`."""
    return jnp.exp(math.log(MIN_SHAPE) + (math.log(MAX_SHAPE) - math.log(MIN_SHAPE)) * jax.nn.sigmoid(u))


def _shape_inverse(shape: float) -> float:
    x = (math.log(min(max(shape, 1.01 * MIN_SHAPE), 0.99 * MAX_SHAPE)) - math.log(MIN_SHAPE)) / (
        math.log(MAX_SHAPE) - math.log(MIN_SHAPE))
    return math.log(x / (1 - x))


def _proportion_invariant(u):
    return MAX_INVARIANT * jax.nn.sigmoid(u)


def _free_rates(params, mask):
    """+R k weights (softmax over the active categories) and rates (exp), rescaled to mean rate one.

    With no active category (not a +R candidate) both are zero, and finite, gradients included.
    """
    logits = jnp.where(mask > 0, params["free_weights"], 0.0)
    weights = jnp.exp(logits - jnp.max(logits)) * mask
    weights = weights / jnp.maximum(jnp.sum(weights), 1e-300)
    rates = jnp.exp(jnp.where(mask > 0, params["free_rates"], 0.0)) * mask
    mean = jnp.sum(weights * rates)
    return rates / jnp.where(mean > 0, mean, 1.0), weights


def _categories(params: dict, spec: _Spec) -> _Categories:
    """The padded `1 + K` categories of the candidate that `spec` describes (see `_Spec`)."""
    padding = spec.free_mask.shape[-1]
    one_hot = (jnp.arange(padding) == 0).astype(float)
    gamma = jnp.concatenate([discrete_gamma_rates(_shape(params["gamma"]), 4), jnp.zeros(padding - 4)])
    gamma_weights = jnp.concatenate([jnp.full(4, 0.25), jnp.zeros(padding - 4)])
    free, free_weights = _free_rates(params, spec.free_mask)
    uses_free = jnp.sum(spec.free_mask) > 0
    rates = jnp.where(spec.gamma > 0, gamma, jnp.where(uses_free, free, one_hot))
    weights = jnp.where(spec.gamma > 0, gamma_weights, jnp.where(uses_free, free_weights, one_hot))
    p = spec.invariant * _proportion_invariant(params["invariant"])
    return _Categories(jnp.concatenate([jnp.zeros(1), rates / (1.0 - p)]),
                       jnp.concatenate([jnp.reshape(p, (1,)), (1.0 - p) * weights]))


def _site_model(params: dict, spec: _Spec) -> Model:
    scale = jnp.exp(jnp.where(spec.free > 0, params["exchangeabilities"], 0.0))
    matrix = jnp.einsum("c,cij->ij", scale, spec.basis)
    return Model(_Exchangeable(matrix, spec.frequencies, spec.alphabet), _categories(params, spec))


def _objective(params, spec: _Spec, tree: Tree, data, precision):
    tree = tree.with_branch_lengths(_tree_lengths(params["lengths"], tree))
    return -data_log_likelihood(data, tree, _site_model(params, spec), precision=precision)


@eqx.filter_jit
def _fit_batch(params, specs, tree, data, precision, tolerance, max_iterations):
    """`minimise` vmapped over candidates: `(params, -log L, iterations)`, each with a leading axis."""
    def one(p, s):
        return minimise(_objective, p, (s, tree, data, precision), "lbfgs", tolerance, max_iterations)
    return jax.vmap(one)(params, specs)


def gamma_category_means(shape: float, k: int) -> np.ndarray:
    """`discrete_gamma_rates(shape, k)` on the host (scipy): a +R k start with no program compiled per k.

    Yang's mean rates: x_i the i/k quantile of Gamma(a, 1), rate_i = k [P(a + 1, x_i) - P(a + 1, x_(i-1))].
    """
    x = scipy.special.gammaincinv(shape, np.arange(1, k) / k)
    cdf = np.concatenate([[0.0], scipy.special.gammainc(shape + 1.0, x), [1.0]])
    return k * np.diff(cdf)


def _pad(values, padding):
    return np.concatenate([values, np.zeros(padding - len(values))])


def _rate_variation(candidate: Candidate, params: dict, spec: _Spec) -> RateVariation:
    """The fitted rate variation as jaxphylo's own classes (DiscreteGamma, FreeRates, InvariantSites)."""
    rates = UniformRates()
    if "G" in candidate.rate:
        rates = DiscreteGamma(_shape(params["gamma"]), 4)
    elif candidate.categories:
        free, weights = _free_rates(params, spec.free_mask)
        rates = FreeRates(weights[: candidate.categories], free[: candidate.categories])
    if "+I" in candidate.rate:
        rates = InvariantSites(_proportion_invariant(params["invariant"]), rates)
    return rates
