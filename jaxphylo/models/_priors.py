"""Priors on substitution-model parameters, chosen by what the model string leaves free.

Defaults (override any by name with `priors={"kappa": dist.LogNormal(0, 1)}`):

| site | prior |
|---|---|
| `frequencies` | Dirichlet(1, ..., 1) |
| `gtr_rates` | Dirichlet(1, ..., 1) on the six exchangeabilities (scaled to mean 1) |
| `class_rates` | Dirichlet(1, ..., 1) on the k class rates of a `ConstrainedGTR` (K3P, TIM2, ...; scaled to mean 1) |
| `kappa`, `kappa_purine`, `kappa_pyrimidine` | LogNormal(1, 1.25) (BEAST's default) |
| `omega` | LogNormal(0, 1) |
| `gamma_shape` | Exponential(1) (MrBayes's default) |
| `proportion_invariant` | Uniform(0, 1) |
| `free_rate_weights`, `free_rates` | Dirichlet(1, ..., 1) each |
| `part_rates` | Dirichlet(1, ..., 1) on a partitioned model's rate multipliers (`-p` linking) |

A `PartitionedModel`'s parts take these sites each, named `part.site`
(`gene1.kappa`), with the same priors; `estimated` is then a `PartsEstimated`.

`MRBAYES_PRIORS` replaces kappa's prior with MrBayes's `tratiopr=beta(1,1)`
(a Beta(1,1) on kappa / (1 + kappa)).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions.transforms import ExpTransform, SigmoidTransform

from ._codon import GY94
from ._model import Model
from ._nucleotide import GTR, HKY85, TN93, ConstrainedGTR
from ._partitioned import PartitionedModel
from ._rates import DiscreteGamma, FreeRates, InvariantSites


def default_priors() -> dict:
    """Site name -> prior (or, for vectors, a function of their length giving it)."""
    return {
        "frequencies": lambda n: dist.Dirichlet(jnp.ones(n)),
        "gtr_rates": dist.Dirichlet(jnp.ones(6)),
        "class_rates": lambda n: dist.Dirichlet(jnp.ones(n)),
        "kappa": dist.LogNormal(1.0, 1.25),
        "kappa_purine": dist.LogNormal(1.0, 1.25),
        "kappa_pyrimidine": dist.LogNormal(1.0, 1.25),
        "omega": dist.LogNormal(0.0, 1.0),
        "gamma_shape": dist.Exponential(1.0),
        "proportion_invariant": dist.Uniform(0.0, 1.0),
        "free_rate_weights": lambda n: dist.Dirichlet(jnp.ones(n)),
        "free_rates": lambda n: dist.Dirichlet(jnp.ones(n)),
        "part_rates": lambda n: dist.Dirichlet(jnp.ones(n)),
    }


# Built when used: a distribution made at import would start JAX's backend before the command line
# could ask for one CPU device per chain.
MRBAYES_PRIORS = {
    "kappa": lambda _=None: dist.TransformedDistribution(dist.Beta(1.0, 1.0), [SigmoidTransform().inv,
                                                                               ExpTransform()]),
}


def _prior(priors, name, size=None):
    chosen = priors[name] if name in priors else default_priors()[name]
    return chosen(size) if callable(chosen) and not isinstance(chosen, dist.Distribution) else chosen


def sample_model(model: Model | PartitionedModel, estimated, priors: dict | None = None) -> Model | PartitionedModel:
    """`model` with every estimated parameter replaced by a NumPyro sample site.

    `estimated` comes from `jp.models.estimated_parameters(model_string)`;
    for a `PartitionedModel`, a `PartsEstimated`: one such set per part, and
    whether the rate multipliers are free (module docstring).
    """
    priors = priors or {}
    if isinstance(model, PartitionedModel):
        models = tuple(handlers.scope(sample_model, prefix=name, divider=".")(m, free, priors)
                       for name, m, free in zip(model.names, model.models, estimated.parts))
        if not (estimated.rates and model.rates_free):
            return model.with_parts(models, model.rates)
        fitted = model.with_parts(models, numpyro.sample("part_rates", _prior(priors, "part_rates", model.num_parts)))
        numpyro.deterministic("part_rate_multipliers", fitted.normalised_rates())  # site-weighted mean 1
        return fitted
    sub, rates = model.substitution, model.rate_variation
    if "frequencies" in estimated:
        n = sub.frequencies.shape[-1]
        sub = eqx.tree_at(lambda s: s.frequencies, sub, numpyro.sample("frequencies", _prior(priors, "frequencies", n)))
    if "exchangeabilities" in estimated:
        sub = _sample_exchangeabilities(sub, priors)
    if "proportion_invariant" in estimated and isinstance(rates, InvariantSites):
        p = numpyro.sample("proportion_invariant", _prior(priors, "proportion_invariant"))
        rates = eqx.tree_at(lambda r: r.proportion_invariant, rates, p)
    base_path = (lambda r: r.base) if isinstance(rates, InvariantSites) else (lambda r: r)
    base = base_path(rates)
    if "gamma_shape" in estimated and isinstance(base, DiscreteGamma):
        base = eqx.tree_at(lambda g: g.shape, base, numpyro.sample("gamma_shape", _prior(priors, "gamma_shape")))
    if "free_rates" in estimated and isinstance(base, FreeRates):
        k = base.weights.shape[-1]
        weights = numpyro.sample("free_rate_weights", _prior(priors, "free_rate_weights", k))
        base = FreeRates(weights, numpyro.sample("free_rates", _prior(priors, "free_rates", k)))
    rates = base if base_path(rates) is rates else eqx.tree_at(base_path, rates, base)
    return Model(sub, rates)


def _sample_exchangeabilities(sub, priors):
    if isinstance(sub, GTR):
        return eqx.tree_at(lambda s: s.rates, sub, 6.0 * numpyro.sample("gtr_rates", _prior(priors, "gtr_rates")))
    if isinstance(sub, ConstrainedGTR):
        k = sub.class_rates.shape[-1]
        rates = k * numpyro.sample("class_rates", _prior(priors, "class_rates", k))
        return eqx.tree_at(lambda s: s.class_rates, sub, rates)
    if isinstance(sub, HKY85):
        return eqx.tree_at(lambda s: s.kappa, sub, numpyro.sample("kappa", _prior(priors, "kappa")))
    if isinstance(sub, TN93):
        purine = numpyro.sample("kappa_purine", _prior(priors, "kappa_purine"))
        pyrimidine = numpyro.sample("kappa_pyrimidine", _prior(priors, "kappa_pyrimidine"))
        return eqx.tree_at(lambda s: (s.kappa_purine, s.kappa_pyrimidine), sub, (purine, pyrimidine))
    if isinstance(sub, GY94):
        kappa = numpyro.sample("kappa", _prior(priors, "kappa"))
        omega = numpyro.sample("omega", _prior(priors, "omega"))
        return eqx.tree_at(lambda s: (s.kappa, s.omega), sub, (kappa, omega))
    return sub


def initial_values(model: Model | PartitionedModel, estimated) -> dict:
    """The parsed model's values of the estimated sites: a start for the sampler and for every fit.

    Values on a boundary start just inside it: simplex entries (frequencies,
    GTR and class rates, free-rate weights and rates) at no less than
    `BOUNDARY_FLOOR`, omega at no less than it, the invariant proportion
    within it of 0 and 1. A boundary has no finite coordinate, and near one
    the gradient in the coordinate vanishes (`d/dx = r d/dr` for `r = e^x`):
    a fit that starts from a model whose C<->G rate an earlier fit drove to
    1e-15 cannot leave it (rsv2's search ended 1.7 log L low that way, the
    rate at 1e-15 where a fresh fit on the same tree finds 0.078). A rate
    whose optimum is zero goes back there."""
    values = {}
    if isinstance(model, PartitionedModel):
        for name, m, free in zip(model.names, model.models, estimated.parts):
            values.update({f"{name}.{site}": value for site, value in initial_values(m, free).items()})
        if estimated.rates and model.rates_free:
            values["part_rates"] = model.rates / jnp.sum(model.rates)
        return values
    sub, rates = model.substitution, model.rate_variation
    base = rates.base if isinstance(rates, InvariantSites) else rates
    if "frequencies" in estimated:
        values["frequencies"] = _inside(sub.frequencies)
    if "exchangeabilities" in estimated:
        if isinstance(sub, GTR):
            values["gtr_rates"] = _inside(sub.rates)
        elif isinstance(sub, ConstrainedGTR):
            values["class_rates"] = _inside(sub.class_rates)
        elif isinstance(sub, TN93):
            values.update(kappa_purine=sub.kappa_purine, kappa_pyrimidine=sub.kappa_pyrimidine)
        elif isinstance(sub, (HKY85, GY94)):
            values["kappa"] = sub.kappa
        if isinstance(sub, GY94):
            values["omega"] = jnp.maximum(sub.omega, BOUNDARY_FLOOR)
    if "proportion_invariant" in estimated and isinstance(rates, InvariantSites):
        values["proportion_invariant"] = jnp.clip(rates.proportion_invariant, BOUNDARY_FLOOR, 1 - BOUNDARY_FLOOR)
    if "gamma_shape" in estimated and isinstance(base, DiscreteGamma):
        values["gamma_shape"] = base.shape
    if "free_rates" in estimated and isinstance(base, FreeRates):
        values["free_rate_weights"] = _inside(base.weights)
        values["free_rates"] = _inside(base.rates)
    return values


BOUNDARY_FLOOR = 1e-3


def _inside(x):
    """`x` normalised to a simplex, every entry at least `BOUNDARY_FLOOR` of the total before normalising."""
    x = x / jnp.sum(x)
    x = jnp.maximum(x, BOUNDARY_FLOOR)
    return x / jnp.sum(x)


def describe_priors(priors: dict | None) -> dict:
    """A description of the prior replacements that is the same in every process (for the checkpoint's
    settings): each distribution's class, parameters and transforms, not its address."""
    def describe(d):
        if callable(d) and not isinstance(d, dist.Distribution):
            d = d(None)
        if isinstance(d, dist.TransformedDistribution):
            return {"base": describe(d.base_dist), "transforms": [type(t).__name__ for t in d.transforms]}
        return {"type": type(d).__name__, **{k: np.asarray(getattr(d, k)).tolist() for k in sorted(d.arg_constraints)
                                             if hasattr(d, k)}}
    return {name: describe(d) for name, d in sorted((priors or {}).items())}
