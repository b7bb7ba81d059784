"""A complete site model: substitution process plus rate variation."""

from __future__ import annotations

import equinox as eqx
from jaxtyping import Array, Float

from ._base import SubstitutionModel, transition_matrices
from ._rates import RateVariation, UniformRates


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
