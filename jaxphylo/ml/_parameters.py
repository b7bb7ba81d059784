"""Unconstrained coordinates for maximum likelihood: what the optimiser moves.

The free model parameters are the NumPyro sample sites of
`inference.sample_model` (the same sites the samplers use), mapped to the real
line by the bijection of each site's support (`biject_to`): log for positive
values (kappa, omega, Gamma shape), logit for a proportion (+I), stick-breaking
for a simplex (frequencies, GTR rates, free-rate weights and rates). No prior or
Jacobian enters the objective: only the mapping.

Branch lengths live in `[MIN_LENGTH, MAX_LENGTH]` (IQ-TREE's bounds) through
`b = lo + (hi - lo) sigmoid(u)`, which is `log`-like for short branches.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float
from numpyro import handlers
from numpyro.distributions import biject_to, constraints

from ..inference._model_priors import initial_values, sample_model
from ..models import Model

MIN_LENGTH, MAX_LENGTH = 1e-6, 10.0
SECOND_SHAPE_START = 0.5


def lengths_from_unconstrained(u: Float[Array, "*B M"]) -> Float[Array, "*B M"]:
    return MIN_LENGTH + (MAX_LENGTH - MIN_LENGTH) * jax.nn.sigmoid(u)


def lengths_to_unconstrained(lengths: Float[Array, "*B M"]) -> Float[Array, "*B M"]:
    x = (jnp.clip(lengths, 2 * MIN_LENGTH, 0.999 * MAX_LENGTH) - MIN_LENGTH) / (MAX_LENGTH - MIN_LENGTH)
    return jnp.log(x) - jnp.log1p(-x)


class ModelCoordinates(eqx.Module):
    """The free parameters of `template` (those named in `estimated`): a dict of unconstrained arrays, and back.

    A pytree (the template's values are data, so one compiled fit serves every
    start and data set of the same shapes).
    """

    template: Model
    estimated: frozenset[str] = eqx.field(static=True)

    def start(self) -> dict:
        """The template's own values of the free parameters, unconstrained."""
        values = initial_values(self.template, self.estimated)
        trace = handlers.trace(handlers.substitute(sample_model, data=values)).get_trace(self.template, self.estimated)
        return {name: biject_to(site["fn"].support).inv(values[name])
                for name, site in trace.items() if site["type"] == "sample"}

    def starts(self) -> list[dict]:
        """Where joint fits begin: the template's values and, with a free Gamma shape, the same with shape 0.5.

        The likelihood in the shape can have a second optimum near zero (many
        invariable-looking sites; DS1 has one at 0.015, 10 log units below the
        one at 0.145) that L-BFGS may jump into from 1.0; fits keep the best.
        """
        own = self.start()
        if "gamma_shape" not in own:
            return [own]
        other = dict(own, gamma_shape=biject_to(constraints.positive).inv(jnp.asarray(SECOND_SHAPE_START)))
        return [own, other]

    def model(self, unconstrained: dict) -> Model:
        def value(site):
            return biject_to(site["fn"].support)(unconstrained[site["name"]]) if site["type"] == "sample" else None
        return handlers.substitute(sample_model, substitute_fn=value)(self.template, self.estimated)

    def named_values(self, unconstrained: dict) -> dict:
        """The constrained value of every free parameter, by site name."""
        trace = handlers.trace(self.model).get_trace(unconstrained)
        return {name: site["value"] for name, site in trace.items() if site["type"] == "sample"}
