"""The log-likelihood of an alignment on a tree under a model."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._alignment import Alignment
from .._errors import InputError, ModelError
from .._schedule import Schedule, build_schedule
from .._tree import Tree
from ..models import Model
from . import _peeling

PRECISIONS = {"float64": jnp.float64, "float32": jnp.float32}


class PatternData(eqx.Module):
    """Tip data in the tree's tip order, plus one all-missing row, and pattern weights."""

    tip_codes: Int[Array, "tips_plus_one patterns"]
    tip_table: Float[Array, "codes states"]
    weights: Float[Array, " patterns"]


def pattern_data(alignment: Alignment, tree: Tree) -> PatternData:
    """Match the alignment's taxa to the tree's tips and lay out the site patterns."""
    _check_taxa(alignment, tree)
    patterns = alignment.site_patterns()
    row = {t: i for i, t in enumerate(patterns.taxa)}
    order = np.array([row[t] for t in tree.taxa])
    missing_code = patterns.tip_table.shape[0]
    codes = np.vstack([patterns.codes[order], np.full((1, patterns.num_patterns), missing_code)])
    table = np.vstack([patterns.tip_table, np.ones((1, patterns.tip_table.shape[1]))])
    return PatternData(codes.astype(np.int32), table, patterns.weights)


def _check_taxa(alignment: Alignment, tree: Tree) -> None:
    in_tree, in_alignment = set(tree.taxa), set(alignment.taxa)
    if only := sorted(in_tree - in_alignment):
        raise InputError(f"{alignment.source}: taxon {only[0]!r} is in the tree but not in the alignment")
    if only := sorted(in_alignment - in_tree):
        raise InputError(f"{alignment.source}: taxon {only[0]!r} is in the alignment but not in the tree")


def _check_inputs(alignment: Alignment, tree: Tree, model: Model) -> None:
    if model.alphabet != alignment.alphabet:
        raise ModelError(
            f"{alignment.source}: the model is for {model.alphabet.name} data "
            f"but the alignment is {alignment.alphabet.name}"
        )
    lengths = tree.branch_lengths
    if not isinstance(lengths, jax.core.Tracer):
        bad = ~np.isfinite(np.asarray(lengths)) | (np.asarray(lengths) < 0)
        if bad.any():
            node = int(np.argmax(bad))
            where = f"taxon {tree.taxa[node]!r}" if node < tree.num_tips else f"internal node {node}"
            raise InputError(f"branch length {float(lengths[node])} above {where} is negative or not finite")


def kernel_branch_lengths(branch_lengths: Float[Array, " nodes"], schedule: Schedule) -> Float[Array, " kernel"]:
    """Branch length of every kernel node (zero for resolved polytomies, root, sentinel)."""
    padded = jnp.concatenate([branch_lengths, jnp.zeros(1, branch_lengths.dtype)])
    return padded[schedule.branch_index]


@eqx.filter_jit
def _pattern_log_likelihoods(model: Model, branch_lengths, data: PatternData, schedule: Schedule, dtype,
                             static_steps=None):
    transition = model.transition_matrices(kernel_branch_lengths(branch_lengths, schedule))
    _, weights = model.rate_categories()
    return _peeling.pattern_log_likelihoods(
        transition.astype(dtype),
        model.frequencies.astype(dtype),
        weights.astype(dtype),
        data.tip_codes,
        data.tip_table.astype(dtype),
        schedule,
        static_steps,
    )


def pattern_log_likelihoods(
    alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64"
) -> Float[Array, " patterns"]:
    """`log L_c` for each site pattern of `alignment.site_patterns()`, in that order."""
    _check_inputs(alignment, tree, model)
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be 'float64' or 'float32', not {precision!r}")
    data = pattern_data(alignment, tree)
    return _pattern_log_likelihoods(
        model, tree.branch_lengths, data, build_schedule(tree.topology), PRECISIONS[precision]
    )


def log_likelihood(alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64") -> Float[Array, ""]:
    """`log L = sum_c weight_c log L_c`: the log-likelihood of the alignment."""
    per_pattern = pattern_log_likelihoods(alignment, tree, model, precision=precision)
    return jnp.sum(alignment.site_patterns().weights * per_pattern)
