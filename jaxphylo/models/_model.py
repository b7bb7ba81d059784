"""A complete site model: substitution process plus rate variation."""

from __future__ import annotations

import equinox as eqx
import jax
from jaxtyping import Array, Float

from ._base import SubstitutionModel, decomposed, transition_matrices
from ._rates import FixedCategories, RateVariation, UniformRates


SUBSTITUTION_PARAMETERS = frozenset({"frequencies", "exchangeabilities"})  # what a model's eigensystem depends on
RATE_PARAMETERS = frozenset({"gamma_shape", "free_rates", "proportion_invariant"})  # what its rate categories do


class Model(eqx.Module):
    """What the likelihood needs from a model: `P` for every branch and category, `pi`, weights."""

    substitution: SubstitutionModel
    rate_variation: RateVariation = UniformRates()

    @property
    def alphabet(self):
        return self.substitution.alphabet

    @property
    def frequencies(self) -> Float[Array, " states"]:
        return self.substitution.frequencies

    def rate_categories(self):
        return self.rate_variation.categories()

    def transition_matrices(
        self, branch_lengths: Float[Array, " branches"]
    ) -> Float[Array, "branches categories states states"]:
        rates, _ = self.rate_categories()
        return transition_matrices(self.substitution, branch_lengths, rates)

    def with_fixed_parts(self, estimated) -> "Model":
        """The same model with what `estimated` (parameter names, `estimated_parameters`) leaves fixed computed
        once: the eigensystem when neither frequencies nor exchangeabilities are estimated (`Decomposed`), the
        rate categories when no rate parameter is. For a sampler that evaluates it at every step with these
        parameters fixed; the likelihood is the same to rounding."""
        substitution, rate_variation = self.substitution, self.rate_variation
        if not SUBSTITUTION_PARAMETERS & set(estimated):
            substitution = decomposed(substitution)
        if not RATE_PARAMETERS & set(estimated):
            rate_variation = FixedCategories(*self.rate_categories())
        return Model(substitution, rate_variation)


_CATEGORY_COUNTS: dict = {}


def category_count(model: Model) -> int:
    """How many rate categories `model.rate_categories()` gives (a property of the model's structure alone).

    Found once per structure by tracing `rate_categories` abstractly, then looked up: the likelihood asks on
    every call, and a trace per call showed as new tracing in every call after the first."""
    leaves, structure = jax.tree_util.tree_flatten(model)
    key = (structure, tuple((getattr(x, "shape", None), str(getattr(x, "dtype", type(x)))) for x in leaves))
    if key not in _CATEGORY_COUNTS:
        _CATEGORY_COUNTS[key] = jax.eval_shape(model.rate_categories)[1].shape[0]
    return _CATEGORY_COUNTS[key]
