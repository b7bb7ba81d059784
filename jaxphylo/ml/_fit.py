"""Maximum-likelihood fitting of branch lengths and model parameters on a fixed topology.

Objective: `-log L(b(u), theta(v))` over unconstrained `u` (branch lengths,
`_parameters.lengths_from_unconstrained`) and `v` (free model parameters,
`ModelCoordinates`), minimised by optax's L-BFGS with a zoom line search (or
Adam), gradients by the linear-time pre-order pass. Converged: log L improved
by less than `tolerance` (default 1e-3, IQ-TREE's final criterion) over the
last five iterations.

Model strings follow IQ-TREE here: a nucleotide or codon model with no
frequency term uses the empirical frequencies (`+F`), fixed; `+FO` estimates
them. Values in braces stay fixed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np

from ..data import Alignment
from .._errors import ModelError
from ..tree import Tree, TreeBatch, fixed_branches
from ..likelihood import PRECISIONS, check_inputs, check_lengths, data_log_likelihood, partitioned_data, pattern_data
from ..models import (
    Model,
    ModelCoordinates,
    PartitionedModel,
    estimate_sets,
    lengths_from_unconstrained,
    lengths_to_unconstrained,
    model_string,
    resolve_model,
)
from ._lengths import fitted_tree_problem
from ._newton import newton_lengths
from ._optimise import OPTIMIZERS, minimise


@dataclass
class MLResult:
    """A fitted tree and model. `parameters` holds the free parameters' values by name."""

    tree: Tree
    model: Model
    log_likelihood: float
    iterations: int
    seconds: float
    parameters: dict = field(default_factory=dict)
    search_rounds: int = 0
    trace: list = field(default_factory=list, repr=False)  # (round, best log L) of a search
    ufboot: dict | None = None  # a search's ultrafast bootstrap supports (percent) of the tree's splits
    ufboot_trees: list | None = field(default=None, repr=False)  # and every replicate's tree

    @property
    def model_string(self) -> str:
        """The fitted model's string; a partitioned model's as IQ-TREE's charpartition entries, `model:part, ...`."""
        if isinstance(self.model, PartitionedModel):
            return ", ".join(f"{model_string(m)}:{name}" for name, m in zip(self.model.names, self.model.models))
        return model_string(self.model)


def _objective(params, coordinates: ModelCoordinates, tree: Tree, data, precision):
    model = coordinates.model(params["model"])
    lengths = _tree_lengths(params["lengths"], tree)
    if lengths.ndim == 2:  # a partitioned model's unlinked lengths [K, nodes]
        return -data_log_likelihood(data, tree, model.with_branch_lengths(lengths), precision=precision)
    return -data_log_likelihood(data, tree.with_branch_lengths(lengths), model, precision=precision)


def searched_result(parents, lengths, taxa, model) -> tuple[Tree, object]:
    """A kernel tree back as a `Tree` and its model: unlinked lengths go into the model (`[K, nodes]`, the
    tree's node order) and the tree takes their site-weighted mean, as `ml.fit` reports them."""
    tree_of = lambda x: TreeBatch(parents[None], x[None], taxa).to_trees(rooted=False)[0]  # noqa: E731
    if lengths.ndim == 1:
        return tree_of(lengths), model
    own = jnp.stack([tree_of(lengths[:, k]).branch_lengths for k in range(lengths.shape[1])])
    return tree_of(lengths[:, 0]).with_branch_lengths(np.average(own, axis=0, weights=model.site_counts)), \
        model.with_branch_lengths(own)


def reported_parameters(values: dict, model) -> dict:
    """Fitted values by site name as lists; a partitioned model's rates as IQ-TREE reports them (site-weighted
    mean 1)."""
    parameters = {k: np.asarray(v).tolist() for k, v in values.items()}
    if "part_rates" in parameters:
        parameters["part_rates"] = np.asarray(model.normalised_rates()).tolist()
    return parameters


def _fit_data(alignment: Alignment, tree: Tree, model):
    """`(pattern data, starting branch lengths)`: `[K, nodes]` lengths for a partitioned model's unlinked ones."""
    if not isinstance(model, PartitionedModel):
        check_inputs(alignment, tree, model)
        return pattern_data(alignment, tree), jnp.asarray(tree.branch_lengths, float)
    check_lengths(tree, model)
    data = partitioned_data(alignment, tree, model)
    lengths = jnp.asarray(tree.branch_lengths, float)
    if model.link == "unlinked":
        lengths = model.part_branch_lengths(lengths)
    return data, lengths


def _tree_lengths(u, tree: Tree):
    """Bounded lengths on every branch; the root's unused entry stays zero."""
    root = jnp.arange(tree.topology.num_nodes) == tree.topology.root
    return jnp.where(root, 0.0, lengths_from_unconstrained(u))


def fit(
    alignment: Alignment,
    tree: Tree,
    model: str | Model,
    *,
    optimizer: str = "lbfgs",
    tolerance: float = 1e-3,
    max_iterations: int = 2000,
    estimate: frozenset[str] | None = None,
    precision: str = "float64",
) -> MLResult:
    """Maximise log L over the branch lengths of `tree` and the free parameters of `model`.

    `model` is a model string (its values in braces stay fixed, everything
    else is estimated; see the module docstring for frequencies) or a `Model`
    (then only `estimate`, e.g. `{"gamma_shape"}`, is estimated besides the
    lengths). Lengths stay in [1e-6, 10]. `optimizer` is "lbfgs" or "adam";
    its lengths are then polished by Newton sweeps in the lengths (`_polished`).
    The fitted tree comes back unrooted, rooted on the first taxon.
    """
    if optimizer not in OPTIMIZERS:
        raise ModelError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be 'float64' or 'float32', not {precision!r}")
    start = time.perf_counter()
    template, free = resolve_model(model, alignment, estimate)
    coordinates = ModelCoordinates(template, free)
    data, lengths = _fit_data(alignment, tree, template)
    lengths = lengths_to_unconstrained(lengths)
    # Branch lengths first, under the starting model, then everything: straight from a poor start tree,
    # L-BFGS's first steps on the Gamma shape can overshoot into the alpha -> 0 basin (DS1: 10 log units worse).
    fixed_model = ModelCoordinates(template, estimate_sets(template, ()))
    lengths = minimise(_objective, {"model": {}, "lengths": lengths}, (fixed_model, tree, data, precision), optimizer,
                       tolerance, max_iterations)[0]["lengths"]
    fits = [minimise(_objective, {"model": start, "lengths": lengths}, (coordinates, tree, data, precision), optimizer,
                     tolerance, max_iterations) for start in coordinates.starts()]
    params, _, iterations = min(fits, key=lambda result: float(result[1]))
    fitted = coordinates.built(params["model"])
    lengths = np.asarray(_tree_lengths(params["lengths"], tree))
    parameters = reported_parameters(coordinates.named_values(params["model"]), fitted)
    if lengths.ndim == 2:  # unlinked: every part's lengths in the model, their site-weighted mean on the tree
        fitted = fitted.with_branch_lengths(lengths)
        lengths = np.average(lengths, axis=0, weights=fitted.site_counts)
    polished, fitted, log_l = _polished(alignment, tree.with_branch_lengths(lengths), fitted, PRECISIONS[precision],
                                        tolerance)
    return MLResult(
        tree=polished, model=fitted, log_likelihood=log_l,
        iterations=int(iterations), seconds=time.perf_counter() - start,
        parameters=parameters,
    )


def _polished(alignment: Alignment, tree: Tree, model, dtype, tolerance: float):
    """`(tree, model, log L)` with the lengths polished by Newton sweeps in the lengths themselves, on the tree
    in kernel form (`searched_result`'s: unrooted, rooted on the first taxon). The optimiser works in logit
    coordinates, where a short branch moves slowly and the fit stops short of its optimum (see
    `_lengths.optimise_model_and_lengths`, which does the same for the search's fits)."""
    batch, lengths, problem = fitted_tree_problem(alignment, tree, model, dtype)
    lengths, log_l, _ = newton_lengths(batch.parents, lengths, fixed_branches(batch.parents), problem,
                                       jnp.asarray(tolerance, lengths.dtype))
    tree, model = searched_result(batch.parents[0], lengths[0], batch.taxa, model)
    return tree, model, float(log_l[0])
