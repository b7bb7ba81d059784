"""The phylogenetic CTMC as a NumPyro distribution: an alignment given a tree and a model."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray
from numpyro.distributions import Distribution, constraints

from ...data import Alignment
from ..._errors import InputError, ModelError
from ...tree import Tree
from ...likelihood import (
    PartitionedData,
    PatternData,
    data_log_likelihood,
    grouped_data,
    partitioned_data,
    partitioned_data_log_likelihoods,
    pattern_data,
)
from ...models import Model, PartitionedModel


class PhyloCTMC(Distribution):
    """`p(alignment | tree, model)`: sequences evolving down `tree` under `model`, sites independent.

    Use it as the observation of any NumPyro model:

        numpyro.sample("alignment", PhyloCTMC(tree, model), obs=alignment)

    `obs` is an `Alignment` (closed over by the model) or the `PatternData` of
    `jp.inference.pattern_data(alignment, tree)`, which can be passed to the
    model as an argument so that new data of the same shape reuses the
    compiled sampler. `log_prob` is `sum_c weight_c log L_c`; its gradient
    comes from the pre-order pass in time linear in the tree.

    With `num_sites` given, the distribution also draws alignments (`sample`,
    so `numpyro.infer.Predictive` simulates prior and posterior predictive
    data when the model is called with `obs=None`): `num_sites` independent
    columns as uncompressed `PatternData` (one pattern per site, weight 1),
    which `log_prob` accepts back. See `simulate_pattern_data`.

    `model` may be a `PartitionedModel` (`jp.partitioned_model`: a model per
    part, branch lengths linked, proportional or unlinked): `log_prob` is then
    `sum_k log L(A_k | tree, t_k, M_k)` over the parts, and `obs` an
    `Alignment` or the `PartitionedData` of `jp.likelihood.partitioned_data`.
    Drawn from a partitioned model, an alignment is every part's sites
    (the model's `site_counts`; `num_sites` is not needed) evolved under its
    own model and lengths, as uncompressed `PartitionedData`.
    """

    support = constraints.real  # an alignment is not an array; NumPyro only needs log_prob

    def __init__(self, tree: Tree, model: Model, *, num_sites: int | None = None, precision: str = "float64",
                 validate_args=None):
        self.tree, self.model, self.precision, self.num_sites = tree, model, precision, num_sites
        super().__init__(batch_shape=(), event_shape=(), validate_args=validate_args)

    def log_prob(self, value):
        if isinstance(self.model, PartitionedModel):
            return self._partitioned_log_prob(value)
        if isinstance(value, Alignment):
            value = pattern_data(value, self.tree)
        if not isinstance(value, PatternData):
            raise InputError(f"PhyloCTMC observes an Alignment or PatternData, not {type(value).__name__}")
        return data_log_likelihood(value, self.tree, self.model, precision=self.precision)

    def _partitioned_log_prob(self, value):
        if isinstance(value, Alignment):
            value = partitioned_data(value, self.tree, self.model)
        if not isinstance(value, PartitionedData):
            raise InputError("PhyloCTMC with a partitioned model observes an Alignment or PartitionedData, "
                             f"not {type(value).__name__}")
        return jnp.sum(partitioned_data_log_likelihoods(value, self.tree, self.model, precision=self.precision))

    def sample(self, key: PRNGKeyArray, sample_shape: tuple[int, ...] = ()) -> PatternData:
        """Alignments drawn with `key`: `PatternData` of `num_sites` sites (a partitioned model's
        `PartitionedData`), leaves led by `sample_shape`."""
        if isinstance(self.model, PartitionedModel):
            draw = lambda k: simulate_partitioned_data(k, self.tree, self.model)  # noqa: E731
        elif self.num_sites is None:
            raise ModelError("PhyloCTMC draws alignments only with num_sites: PhyloCTMC(tree, model, num_sites=N)")
        else:
            draw = lambda k: simulate_pattern_data(k, self.tree, self.model, self.num_sites)  # noqa: E731
        if not sample_shape:
            return draw(key)
        draws = jax.vmap(draw)(jax.random.split(key, math.prod(sample_shape)))
        return jax.tree.map(lambda leaf: leaf.reshape(tuple(sample_shape) + leaf.shape[1:]), draws)


def simulate_partitioned_data(key: PRNGKeyArray, tree: Tree, model: PartitionedModel) -> PartitionedData:
    """Every part's `site_counts[k]` columns evolved down `tree` with its lengths `t_k` under its model
    (`simulate_pattern_data`), grouped as `partitioned_data` groups them (uncompressed)."""
    lengths = model.part_branch_lengths(tree.branch_lengths)
    keys = jax.random.split(key, model.num_parts)
    layouts = [simulate_pattern_data(keys[k], tree.with_branch_lengths(lengths[k]), m, n)
               for k, (m, n) in enumerate(zip(model.models, model.site_counts))]
    return grouped_data(layouts, model)


@functools.partial(jax.jit, static_argnames="num_sites")
def simulate_pattern_data(key: PRNGKeyArray, tree: Tree, model: Model, num_sites: int) -> PatternData:
    """`num_sites` columns evolved down `tree` under `model`, as uncompressed `PatternData`; jit- and vmap-safe.

    The algorithm of `jp.simulate` in JAX, drawn from `key`: per site, a rate
    category `c ~ Categorical(w)` and a root state `x_root ~ Categorical(pi)`;
    then, parents before children (one vectorised draw per depth level),
    `x_k ~ Categorical(P_k,c[x_parent(k), :])` with
    `P_k,c = expm(r_c b_k Q)`. The layout is `pattern_data(..., compress=False)`'s:
    `tip_codes[t, j] = x_t` for tips in the tree's order plus a last all-missing
    row, `tip_table` the identity with an all-ones row, weights 1.
    """
    parent = np.asarray(tree.topology.parent)
    num_tips, num_nodes = tree.topology.num_tips, len(parent)
    transition = model.transition_matrices(tree.branch_lengths)  # [nodes, categories, S, S]
    _, weights = model.rate_categories()
    num_states = transition.shape[-1]
    key_category, key_root, key_nodes = jax.random.split(key, 3)
    category = jax.random.categorical(key_category, _log_probabilities(weights), shape=(num_sites,))
    root = jax.random.categorical(key_root, _log_probabilities(model.frequencies), shape=(num_sites,))
    states = jnp.zeros((num_nodes, num_sites), jnp.int32).at[num_nodes - 1].set(root.astype(jnp.int32))
    for depth, nodes in enumerate(_depth_levels(parent)):
        rows = transition[nodes[:, None], category[None, :], states[parent[nodes]]]  # [nodes of level, sites, S]
        drawn = jax.random.categorical(jax.random.fold_in(key_nodes, depth), _log_probabilities(rows))
        states = states.at[nodes].set(drawn.astype(jnp.int32))
    codes = jnp.concatenate([states[:num_tips], jnp.full((1, num_sites), num_states, jnp.int32)])
    table = jnp.concatenate([jnp.eye(num_states, dtype=transition.dtype), jnp.ones((1, num_states), transition.dtype)])
    return PatternData(codes, table, jnp.ones(num_sites, transition.dtype))


def _log_probabilities(p: Float[Array, "*batch states"]) -> Float[Array, "*batch states"]:
    """`log p`, rounding negatives (a few ulp, from the eigendecomposition) to probability zero."""
    return jnp.log(jnp.maximum(p, 0.0))


def _depth_levels(parent: Int[np.ndarray, " nodes"]) -> list[Int[np.ndarray, " level"]]:
    """The non-root nodes by depth below the root (children numbered before parents, root last)."""
    depth = np.zeros(len(parent), np.int64)
    for node in range(len(parent) - 2, -1, -1):
        depth[node] = depth[parent[node]] + 1
    return [np.flatnonzero(depth == d) for d in range(1, int(depth.max()) + 1)]
