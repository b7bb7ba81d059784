"""Branch lengths (and model parameters) fitted on a batch of fixed kernel trees: the search's `Problem`
(model, data, per-tree pattern weights, schedule widths) and its optimisers, L-BFGS or Newton per branch."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from ..runtime import place_batch
from ..tree import (
    mask_like,
    phase_widths,
)
from ..likelihood import (
    batch_pattern_log_likelihoods, kernel_tree_lengths, max_step_width, node_bytes, search_data, search_template,
)
from ..models import (
    Model, ModelCoordinates, PartitionedModel, lengths_from_unconstrained, lengths_to_unconstrained,
)
from ._newton import newton_lengths
from ._optimise import minimise


SEARCH_TOLERANCE = 0.01  # log-likelihood units over five L-BFGS iterations while searching; 1e-3 for model fits


LENGTHS_BYTES = 16 << 30  # partials that one call of a length optimiser may hold (trees beyond it: more calls)


LENGTHS_BUFFERS = 24  # partials buffers per tree in a length optimiser (Newton: 4 step fractions, derivative passes)


def _strongly_typed(tree):
    """Floating leaves without JAX's weak type: a parsed model's weak `kappa` and a fitted model's strong one
    would otherwise trace every jitted step of a search twice (one L-BFGS program: ~10 s to compile)."""
    return jax.tree.map(lambda x: jnp.asarray(x, x.dtype) if eqx.is_inexact_array(x) else x, tree)


class Problem(eqx.Module):
    """What every step of a search needs: model, pattern data, per-tree pattern weights, fixed-branch mask.

    A `PartitionedModel` comes with `PartitionedData`: its parts' patterns side by side, the weights too.
    """

    model: Model | PartitionedModel = eqx.field(converter=_strongly_typed)
    data: object  # PatternData, or PartitionedData
    weights: jax.Array  # [B or 1, patterns]
    widths: tuple[int, ...] = eqx.field(static=True)
    dtype: object = eqx.field(static=True)
    lengths_method: str = eqx.field(static=True, default="auto")
    mesh: object = eqx.field(static=True, default=None)  # trees over its `batch` axis (`place_batch`), or None


def fitted_tree_problem(alignment, tree, model, dtype):
    """A fitted tree as a search batch of one, its lengths as a search holds them (`kernel_tree_lengths`), and
    the `Problem` that scores it with its alignment's own pattern weights."""
    batch, lengths = kernel_tree_lengths(tree, model)
    template = search_template(model)
    data = search_data(alignment, batch, template)
    widths = phase_widths(batch.num_tips, max_step_width(template, data, dtype))
    return batch, lengths, Problem(template, data, jnp.asarray(data.weights)[None], widths, dtype)


def _lengths_objective(u, parents, fixed, problem: Problem):
    lengths = jnp.where(mask_like(fixed, u), 0.0, lengths_from_unconstrained(u))
    per = batch_pattern_log_likelihoods(problem.model, parents, lengths, problem.data, problem.widths, problem.dtype)
    return -jnp.sum(problem.weights * per)


def _joint_objective(params, parents, fixed, coordinates: ModelCoordinates, problem: Problem):
    problem = eqx.tree_at(lambda p: p.model, problem, coordinates.model(params["model"]))
    return _lengths_objective(params["lengths"], parents, fixed, problem)


def optimise_model_and_lengths(parents, lengths, fixed, coordinates: ModelCoordinates, problem: Problem,
                               tolerance: float):
    """Re-fit the free model parameters (shared by the batch) and every tree's branch lengths together.

    The joint fit is L-BFGS in unconstrained coordinates, where a short branch
    moves slowly (`d/du = t d/dt` for `t ~ e^u`): it stops with short branches
    short of their optimum (a 10-taxon fit ended 0.19 log L low, one branch at
    2e-4 where its optimum is 3.3e-3). So the lengths are then polished by
    Newton sweeps in the lengths themselves (`_newton`; IQ-TREE fits every
    branch so), and if that gained more than `tolerance`, the model is fitted
    once more from there, and the lengths polished again.
    """
    estimated, iterations = coordinates.estimated, 0
    for starts in (coordinates.starts(), None):
        if starts is None:  # the second round: from the fitted model only
            coordinates = ModelCoordinates(model, estimated)
            starts = [coordinates.start()]
        fits = [minimise(_joint_objective, {"model": start, "lengths": lengths_to_unconstrained(lengths)},
                         (parents, fixed, coordinates, problem), "lbfgs", tolerance, 2000) for start in starts]
        params, fitted, taken = min(fits, key=lambda result: float(result[1]))
        iterations += int(taken)
        model = coordinates.built(params["model"])
        values = coordinates.named_values(params["model"])
        problem = eqx.tree_at(lambda p: p.model, problem, model)
        lengths = jnp.where(mask_like(fixed, lengths), 0.0, lengths_from_unconstrained(params["lengths"]))
        lengths, log_l, _ = newton_lengths(parents, lengths, fixed, problem, jnp.asarray(tolerance, lengths.dtype))
        if float(jnp.sum(log_l)) + float(fitted) < tolerance:
            break
    return model, lengths, log_l, values, iterations


LENGTHS_METHODS = ("auto", "lbfgs", "newton")


def optimise_lengths(parents, lengths, fixed, problem: Problem, tolerance: float = SEARCH_TOLERANCE):
    """Re-fit every free branch length of every tree: `(lengths, log L)`.

    "newton" (`_newton`: per-branch Newton sweeps) or "lbfgs" (an L-BFGS per
    tree); "auto" takes L-BFGS on the CPU, where the C++ kernel makes each of
    its many cheap evaluations fast, and Newton elsewhere, where every pass
    costs a launch latency and Newton needs far fewer passes (see
    benchmarks/results/ml_search-*.json).
    """
    tolerance = jnp.asarray(tolerance, lengths.dtype)  # traced: the start's 1e-3 and the search's 0.01 share a program
    method = problem.lengths_method
    if method == "auto":
        method = "lbfgs" if jax.default_backend() == "cpu" else "newton"
    if method == "newton":
        optimise = lambda *a: newton_lengths(*a, tolerance)[:2]  # noqa: E731
    else:
        optimise = lambda *a: lbfgs_lengths(*a, tolerance)  # noqa: E731
    # Large alignments: trees in groups whose partials fit in LENGTHS_BYTES on each device (the group size
    # depends on the problem and the mesh's batch axis, never on the device model). A group's trees are
    # split over the mesh's `batch` axis: sliced or concatenated on the host they would be copied to every
    # device, and every device would fit every tree (bootstrap time grew with the number of GPUs, issue #41).
    batch, mesh = parents.shape[0], problem.mesh
    shards = 1 if mesh is None else mesh.shape["batch"]
    tree_bytes = LENGTHS_BUFFERS * (parents.shape[1] + 1) * node_bytes(problem.model, problem.data, problem.dtype)
    size = max(1, min(batch, shards * (LENGTHS_BYTES // tree_bytes)))

    def run(parents, lengths, fixed, weights):
        group = eqx.tree_at(lambda p: p.weights, problem, place_batch(weights, mesh))
        return optimise(*place_batch((parents, lengths, fixed), mesh), group)

    if size == batch:
        return run(parents, lengths, fixed, problem.weights)
    results = []
    for start in range(0, batch, size):
        rows = np.minimum(np.arange(start, start + size), batch - 1)  # the last group padded with its last tree
        weights = problem.weights[rows] if problem.weights.shape[0] == batch else problem.weights
        results.append(run(parents[rows], lengths[rows], fixed[rows], weights))
    return tuple(jnp.concatenate(x)[:batch] for x in zip(*results))


@eqx.filter_jit
def lbfgs_lengths(parents, lengths, fixed, problem: Problem, tolerance: float, max_iterations: int = 200):
    """Each tree by its own L-BFGS (vmapped: one program, every tree at once).

    Separate optimisers, not one on the summed log L: a shared line search would
    let the worst-conditioned tree set every tree's step.
    """
    def one_tree(parent, length, fixed, weights):
        alone = eqx.tree_at(lambda p: p.weights, problem, weights[None])
        u, value, _ = minimise(_lengths_objective, lengths_to_unconstrained(length[None]),
                               (parent[None], fixed[None], alone), "lbfgs", tolerance, max_iterations)
        return jnp.where(mask_like(fixed, length), 0.0, lengths_from_unconstrained(u[0])), -value

    return jax.vmap(one_tree)(parents, lengths, fixed, problem.weights)


@eqx.filter_jit
def tree_log_likelihoods(parents, lengths, problem: Problem):
    per = batch_pattern_log_likelihoods(problem.model, parents, lengths, problem.data, problem.widths, problem.dtype)
    return jnp.sum(problem.weights * per, axis=-1)
