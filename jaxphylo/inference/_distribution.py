"""The phylogenetic CTMC as a NumPyro distribution: an alignment given a tree and a model."""

from __future__ import annotations

from numpyro.distributions import Distribution, constraints

from .._alignment import Alignment
from .._errors import InputError
from .._tree import Tree
from ..likelihood import PatternData, data_log_likelihood, pattern_data
from ..models import Model


class PhyloCTMC(Distribution):
    """`p(alignment | tree, model)`: sequences evolving down `tree` under `model`, sites independent.

    Use it as the observation of any NumPyro model:

        numpyro.sample("alignment", PhyloCTMC(tree, model), obs=alignment)

    `obs` is an `Alignment` (closed over by the model) or the `PatternData` of
    `jp.inference.pattern_data(alignment, tree)`, which can be passed to the
    model as an argument so that new data of the same shape reuses the
    compiled sampler. `log_prob` is `sum_c weight_c log L_c`; its gradient
    comes from the pre-order pass in time linear in the tree.
    """

    support = constraints.real  # an alignment is not an array; NumPyro only needs log_prob

    def __init__(self, tree: Tree, model: Model, *, precision: str = "float64", validate_args=None):
        self.tree, self.model, self.precision = tree, model, precision
        super().__init__(batch_shape=(), event_shape=(), validate_args=validate_args)

    def log_prob(self, value):
        if isinstance(value, Alignment):
            value = pattern_data(value, self.tree)
        if not isinstance(value, PatternData):
            raise InputError(f"PhyloCTMC observes an Alignment or PatternData, not {type(value).__name__}")
        return data_log_likelihood(value, self.tree, self.model, precision=self.precision)

    def sample(self, key, sample_shape=()):
        raise NotImplementedError("PhyloCTMC cannot draw alignments inside a NumPyro model; "
                                  "simulate outside it with jp.simulate(tree, model, num_sites)")
