"""Marginal ancestral state probabilities from the post- and pre-order partials."""

from __future__ import annotations

import equinox as eqx
import numpy as np
from jaxtyping import Array, Float

from .._alignment import Alignment
from .._errors import InputError
from .._schedule import Schedule
from .._tree import Tree
from ..models import Model
from ._api import PatternData, kernel_arrays, prepare
from ._peeling import post_order_partials
from ._preorder import marginals, pre_order_partials


@eqx.filter_jit
def _kernel_marginals(model: Model, branch_lengths, data: PatternData, schedule: Schedule, dtype):
    transition, pi, weights, codes, table = kernel_arrays(model, branch_lengths, data, schedule, dtype)
    post, _ = post_order_partials(transition, codes, table, schedule)
    pre, _ = pre_order_partials(transition, pi, weights, post, codes, table, schedule)
    return marginals(pre, post)[:-1]


def kernel_nodes_of(tree: Tree, schedule: Schedule) -> np.ndarray:
    """The kernel node of every user node (-1 where a unifurcation was merged away)."""
    index = np.asarray(schedule.branch_index[:-1])
    kernel = np.full(tree.topology.num_nodes + 1, -1)
    kernel[index] = np.arange(len(index))
    return kernel[:-1]


def ancestral_marginals(
    alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64"
) -> Float[Array, "internal_nodes sites states"]:
    """`P(state of node k at site j = x | alignment)` for every internal node of `tree`.

    Row `k - tree.num_tips` is the tree's node `k`; sites are alignment columns
    (codons for codon data); states follow `model.alphabet`. Rate categories are
    summed over: `sum_r q_k,r(x) p_k,r(x) / L_j`, with `q` the pre-order partials.
    """
    data, schedule, dtype = prepare(alignment, tree, model, precision)
    per_pattern = _kernel_marginals(model, tree.branch_lengths, data, schedule, dtype)
    kernel = kernel_nodes_of(tree, schedule)[tree.num_tips:]
    if (kernel < 0).any():
        node = tree.num_tips + int(np.argmax(kernel < 0))
        raise InputError(f"internal node {node} has a single child; remove unifurcations first")
    return per_pattern[kernel - tree.num_tips][:, alignment.site_patterns().site_pattern]
