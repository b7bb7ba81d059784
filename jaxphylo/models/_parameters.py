"""Unconstrained coordinates of a model: what an optimiser moves, for `ml.fit` and for users (`jp.unconstrain`).

The free model parameters are the NumPyro sample sites of
`inference.sample_model` (the same sites the samplers use), mapped to the real
line by the bijection of each site's support (`biject_to`): `x = exp(u)` for
positive values (kappa, omega, Gamma shape), `p = sigmoid(u)` for a proportion
(+I), stick-breaking for a simplex of `K` entries from `K - 1` reals
(frequencies; GTR, class and free rates; free-rate weights):
`z_i = sigmoid(u_i - log(K - 1 - i))`, `x_i = z_i (1 - sum_{j<i} x_j)`,
`x_K = 1 - sum_{j<K} x_j`. No prior or Jacobian enters the objective: only the
mapping. Exchangeabilities and free rates are scale-free (the rate matrix and
the rate categories are normalised), so a simplex site carries their ratios and
the rebuilt vector keeps the template's sum: `r = (sum r_template) x`.

Branch lengths live in `[MIN_LENGTH, MAX_LENGTH]` (IQ-TREE's bounds) through
`b = lo + (hi - lo) sigmoid(u)`, which is `log`-like for short branches.
"""

from __future__ import annotations

from collections.abc import Iterable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float
from numpyro import handlers
from numpyro.distributions import biject_to, constraints

from ..data import Alignment
from .._errors import ModelError
from ._parse import estimated_parameters, parse_model
from ._priors import initial_values, sample_model
from ._model import RATE_PARAMETERS, SUBSTITUTION_PARAMETERS, Model
from ._nucleotide import ConstrainedGTR, GTR, JC69, K80, NAMED_DNA_MODELS
from ._partitioned import PartitionedModel, PartsEstimated
from ._rates import FreeRates, InvariantSites

MIN_LENGTH, MAX_LENGTH = 1e-6, 10.0
SECOND_SHAPE_START = 0.5
PARAMETER_GROUPS = SUBSTITUTION_PARAMETERS | RATE_PARAMETERS


# Jitted: host code calls them between fits, where each operation would be a program of its own to trace and load.
@jax.jit
def lengths_from_unconstrained(u: Float[Array, "*B M"]) -> Float[Array, "*B M"]:
    return MIN_LENGTH + (MAX_LENGTH - MIN_LENGTH) * jax.nn.sigmoid(u)


@jax.jit
def lengths_to_unconstrained(lengths: Float[Array, "*B M"]) -> Float[Array, "*B M"]:
    x = (jnp.clip(lengths, 2 * MIN_LENGTH, 0.999 * MAX_LENGTH) - MIN_LENGTH) / (MAX_LENGTH - MIN_LENGTH)
    return jnp.log(x) - jnp.log1p(-x)


class ModelCoordinates(eqx.Module):
    """The free parameters of `template` (those named in `estimated`): a dict of unconstrained arrays, and back.

    A pytree (the template's values are data, so one compiled fit serves every
    start and data set of the same shapes). Calling it is `model`. A
    `PartitionedModel` template takes one set of names per part (`estimate_sets`).
    """

    template: Model | PartitionedModel
    estimated: frozenset[str] | PartsEstimated = eqx.field(static=True)

    # `start`, `named_values` and `built` are jitted: host code calls them between fits, where each operation
    # would be a program of its own. `model` is not: `named_values` traces it under a handler.
    @eqx.filter_jit
    def start(self) -> dict:
        """The template's own values of the free parameters, unconstrained.

        Frequencies and omega below 1e-3 start at 1e-3 (`initial_values`): the
        boundary itself has no finite coordinate.
        """
        values = initial_values(self.template, self.estimated)
        trace = handlers.trace(handlers.substitute(sample_model, data=values)).get_trace(self.template, self.estimated)
        return {name: biject_to(site["fn"].support).inv(values[name])
                for name, site in trace.items() if site["type"] == "sample"}

    def supports(self, priors: dict | None = None) -> dict:
        """The support of every free parameter's site (under `priors`), by site name."""
        trace = handlers.trace(handlers.seed(sample_model, 0)).get_trace(self.template, self.estimated, priors)
        return {name: site["fn"].support for name, site in trace.items() if site["type"] == "sample"}

    def starts(self) -> list[dict]:
        """Where joint fits begin: the template's values and, with a free Gamma shape, the same with shape 0.5.

        The likelihood in the shape can have a second optimum near zero (many
        invariable-looking sites; DS1 has one at 0.015, 10 log units below the
        one at 0.145) that L-BFGS may jump into from 1.0; fits keep the best.
        """
        own = self.start()
        shapes = [name for name in own if name.rsplit(".", 1)[-1] == "gamma_shape"]  # a partitioned model's too
        if not shapes:
            return [own]
        # Typed like the first start's (not weakly typed, as a Python float would make it): the fits from both
        # starts then run one compiled program instead of two.
        second = {name: biject_to(constraints.positive).inv(jnp.asarray(SECOND_SHAPE_START, own[name].dtype))
                  for name in shapes}
        return [own, dict(own, **second)]

    def model(self, unconstrained: dict) -> Model:
        """The template with every free parameter replaced by the image of its coordinates (scale kept, see module)."""
        def value(site):
            return biject_to(site["fn"].support)(unconstrained[site["name"]]) if site["type"] == "sample" else None
        rebuilt = handlers.substitute(sample_model, substitute_fn=value)(self.template, self.estimated)
        return _template_scale(rebuilt, self.template, self.estimated)

    def __call__(self, unconstrained: dict) -> Model:
        return self.model(unconstrained)

    @eqx.filter_jit
    def built(self, unconstrained: dict) -> Model:
        """`model(unconstrained)` as one program."""
        return self.model(unconstrained)

    @eqx.filter_jit
    def named_values(self, unconstrained: dict) -> dict:
        """The constrained value of every free parameter, by site name."""
        trace = handlers.trace(self.model).get_trace(unconstrained)
        return {name: site["value"] for name, site in trace.items() if site["type"] == "sample"}


def _template_scale(model, template, estimated):
    """`model` with its scale-free vectors multiplied back to the template's sums.

    `sample_model` writes GTR rates as `6 x`, class rates as `k x` and free-rate
    weights and rates as `x` (simplexes `x`); `r = (sum r_template / sum r) r`
    changes no likelihood (the rate matrix and the categories are normalised)
    and makes the round trip `model(start())` return the template itself.
    A partitioned model's parts are scaled each.
    """
    if isinstance(model, PartitionedModel):
        return model.with_parts(tuple(_template_scale(m, t, free) for m, t, free in
                                      zip(model.models, template.models, estimated.parts)), model.rates)
    sub, rates = model.substitution, model.rate_variation
    if "exchangeabilities" in estimated and isinstance(sub, GTR):
        own, given = sub.rates, template.substitution.rates
        sub = eqx.tree_at(lambda s: s.rates, sub, own * (jnp.sum(given) / jnp.sum(own)))
    elif "exchangeabilities" in estimated and isinstance(sub, ConstrainedGTR):
        own, given = sub.class_rates, template.substitution.class_rates
        sub = eqx.tree_at(lambda s: s.class_rates, sub, own * (jnp.sum(given) / jnp.sum(own)))
    base, old = (rates.base, template.rate_variation.base) if isinstance(rates, InvariantSites) else (
        rates, template.rate_variation)
    if "free_rates" in estimated and isinstance(base, FreeRates):
        scaled = FreeRates(base.weights * (jnp.sum(old.weights) / jnp.sum(base.weights)),
                           base.rates * (jnp.sum(old.rates) / jnp.sum(base.rates)))
        rates = eqx.tree_at(lambda r: r.base, rates, scaled) if isinstance(rates, InvariantSites) else scaled
    return Model(sub, rates)


def _default_estimate(model):
    """Every parameter group, less the frequencies of a model whose frequencies are equal by definition
    (a partitioned model: one such set per part)."""
    if isinstance(model, PartitionedModel):
        return PartsEstimated(tuple(_default_estimate(m) for m in model.models), True)
    sub = model.substitution
    equal = isinstance(sub, (JC69, K80)) or (isinstance(sub, ConstrainedGTR) and sub.name in NAMED_DNA_MODELS
                                              and NAMED_DNA_MODELS[sub.name][1])
    return PARAMETER_GROUPS - {"frequencies"} if equal else PARAMETER_GROUPS


def estimate_sets(model, estimate):
    """`estimate` as `ModelCoordinates` keeps it: a frozenset, or for a partitioned model a `PartsEstimated`.

    For a partitioned model, one set (for every part) or one set per part;
    the rate multipliers are free unless nothing is (`()`), or pass a
    `PartsEstimated` to say so.
    """
    if not isinstance(model, PartitionedModel):
        return frozenset(estimate)
    if isinstance(estimate, PartsEstimated):
        return estimate
    if isinstance(estimate, (set, frozenset)) or all(isinstance(x, str) for x in estimate):
        sets = (frozenset(estimate),) * model.num_parts
    else:
        sets = tuple(frozenset(x) for x in estimate)
    if len(sets) != model.num_parts:
        raise ModelError(f"{len(sets)} parameter sets for a model of {model.num_parts} parts")
    return PartsEstimated(sets, bool(list(estimate)))


def unconstrain(
    model: Model | PartitionedModel, estimate: Iterable[str] | None = None
) -> tuple[dict[str, Float[Array, "..."]], ModelCoordinates]:
    """An unconstrained view of `model`: `(params, rebuild)` with `rebuild(params)` equal to `model`.

    `params` maps each free parameter's NumPyro site name (`frequencies`,
    `gtr_rates`, `class_rates`, `kappa`, `kappa_purine`, `kappa_pyrimidine`,
    `omega`, `gamma_shape`, `proportion_invariant`, `free_rate_weights`,
    `free_rates`) to real arrays: `log` of a positive value, `logit` of a
    proportion, the stick-breaking coordinates of a simplex (`K - 1` reals
    for `K` entries; see the module docstring). `rebuild(u)` maps any real
    `u` back to a valid model, so an optimiser on `params` (optax, for one)
    never leaves the domain. `rebuild` is `ModelCoordinates`, an equinox
    Module: pass it through `jax.jit` as an argument.

    `estimate` names the parameter groups to free, among `frequencies`,
    `exchangeabilities`, `proportion_invariant`, `gamma_shape`, `free_rates`
    (`jp.models.estimated_parameters(string)` gives IQ-TREE's choice for a
    model string); the rest stay as in `model`. Left out: all of them, except
    the frequencies of models with equal frequencies by definition (JC69,
    K80, K3P, TNe, SYM, ...). Frequencies and omega below 1e-3 are raised to
    1e-3 first (the boundary has no finite coordinate); otherwise the round
    trip is exact to rounding. This is the mapping `jaxphylo.ml.fit` uses.

    A `PartitionedModel`'s sites are named `part.site` (`gene1.kappa`), plus
    `part_rates` (a simplex) when its lengths are linked proportionally;
    `estimate` is then one set for every part, or a set per part.
    """
    names = _default_estimate(model) if estimate is None else estimate_sets(model, estimate)
    for free in names.parts if isinstance(model, PartitionedModel) else [names]:
        if unknown := sorted(free - PARAMETER_GROUPS):
            raise ModelError(f"unknown parameter group {unknown[0]!r}; known: {', '.join(sorted(PARAMETER_GROUPS))}")
    coordinates = ModelCoordinates(model, names)
    return coordinates.start(), coordinates


def ml_estimated(string: str) -> frozenset[str]:
    """What ML estimates of a model string (IQ-TREE's convention: no frequency term means `+F`, fixed)."""
    free = estimated_parameters(string)
    if not any(t.strip().upper().startswith("FO") for t in string.split("+")[1:]):
        free = free - {"frequencies"}
    return free


def resolve_model(model: str | Model | PartitionedModel, alignment: Alignment, estimate=None):
    """`(model, estimated parameter names)` under ML conventions (`ml_estimated`).

    A `Model` has only `estimate` free; a `PartitionedModel` built from model
    strings (`jp.partitioned_model`) has each part's `ml_estimated` free, and
    one set per part (`estimate_sets`).
    """
    if isinstance(model, PartitionedModel):
        if estimate is not None:
            return model, estimate_sets(model, estimate)
        if model.model_strings:
            return model, PartsEstimated(tuple(ml_estimated(string) for string in model.model_strings), True)
        return model, PartsEstimated((frozenset(),) * model.num_parts, True)
    if isinstance(model, Model):
        return model, frozenset(estimate or ())
    if not isinstance(model, str):
        raise ModelError(f"model must be a model string or a Model, not {type(model).__name__}")
    parsed = parse_model(model, alignment=alignment)
    return parsed, ml_estimated(model) if estimate is None else frozenset(estimate)


def parameter_names(coordinates: ModelCoordinates) -> list[str]:
    """Log column names of the free parameters: a vector's entries as `name.1`, `name.2`, ..., sorted by name."""
    values = jax.eval_shape(lambda: coordinates.named_values(coordinates.start()))  # shapes only: nothing compiled
    names = []
    for name, value in sorted(values.items()):  # sorted, as the vmapped values come back in `_collect`
        size = int(np.size(value))
        names += [name] if size == 1 else [f"{name}.{i + 1}" for i in range(size)]
    return names
