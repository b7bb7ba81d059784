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

from .._alignment import Alignment
from .._errors import ModelError
from .._tree import Tree
from ..likelihood import data_log_likelihood, pattern_data
from ..likelihood._api import PRECISIONS, _check_inputs
from ..models import Model, estimated_parameters, model_string, parse_model
from ._optimise import OPTIMIZERS, minimise
from ._parameters import ModelCoordinates, lengths_from_unconstrained, lengths_to_unconstrained


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

    @property
    def model_string(self) -> str:
        return model_string(self.model)


def resolve_model(model: str | Model, alignment: Alignment, estimate: frozenset[str] | None = None):
    """`(Model, estimated parameter names)` under ML conventions (IQ-TREE's: no frequency term means `+F`)."""
    if isinstance(model, Model):
        return model, frozenset(estimate or ())
    if not isinstance(model, str):
        raise ModelError(f"model must be a model string or a Model, not {type(model).__name__}")
    parsed = parse_model(model, alignment=alignment)
    free = estimated_parameters(model)
    if not any(t.strip().upper().startswith("FO") for t in model.split("+")[1:]):
        free = free - {"frequencies"}
    return parsed, free if estimate is None else frozenset(estimate)


def _objective(params, coordinates: ModelCoordinates, tree: Tree, data, precision):
    model = coordinates.model(params["model"])
    tree = tree.with_branch_lengths(_tree_lengths(params["lengths"], tree))
    return -data_log_likelihood(data, tree, model, precision=precision)


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
    lengths). Lengths stay in [1e-6, 10]. `optimizer` is "lbfgs" or "adam".
    """
    if optimizer not in OPTIMIZERS:
        raise ModelError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be 'float64' or 'float32', not {precision!r}")
    start = time.perf_counter()
    template, free = resolve_model(model, alignment, estimate)
    _check_inputs(alignment, tree, template)
    coordinates = ModelCoordinates(template, frozenset(free))
    data = pattern_data(alignment, tree)
    lengths = lengths_to_unconstrained(jnp.asarray(tree.branch_lengths, float))
    # Branch lengths first, under the starting model, then everything: straight from a poor start tree,
    # L-BFGS's first steps on the Gamma shape can overshoot into the alpha -> 0 basin (DS1: 10 log units worse).
    fixed_model = ModelCoordinates(template, frozenset())
    lengths = minimise(_objective, {"model": {}, "lengths": lengths}, (fixed_model, tree, data, precision), optimizer,
                       tolerance, max_iterations)[0]["lengths"]
    fits = [minimise(_objective, {"model": start, "lengths": lengths}, (coordinates, tree, data, precision), optimizer,
                     tolerance, max_iterations) for start in coordinates.starts()]
    params, value, iterations = min(fits, key=lambda result: float(result[1]))
    fitted = coordinates.model(params["model"])
    lengths = np.asarray(_tree_lengths(params["lengths"], tree))
    return MLResult(
        tree=tree.with_branch_lengths(lengths), model=fitted, log_likelihood=-float(value),
        iterations=int(iterations), seconds=time.perf_counter() - start,
        parameters={k: np.asarray(v).tolist() for k, v in coordinates.named_values(params["model"]).items()},
    )
