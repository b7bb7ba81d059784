"""A batch of kernel trees with the data and model it is evaluated with: what searches and samplers carry.

A partitioned model's parts lie side by side in the data (`partitioned_data`); with unlinked (`-Q`) branch
lengths every part's lengths travel beside the trees as `[B, M, K]`, not in the model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..data import Alignment
from ..models import PartitionedModel
from ..tree import Tree, TreeBatch, kernel_batch
from ._arrays import pattern_data
from ._partitioned import partitioned_data


def search_data(alignment: Alignment, trees: TreeBatch, model, bucket: bool = False):
    """Pattern data laid out for the batch's tips; a partitioned model's parts side by side. `bucket` pads one
    model's patterns to their size class (`bucket_patterns`: zero-weight columns after the alignment's)."""
    if not isinstance(model, PartitionedModel):
        return pattern_data(alignment, trees, bucket=bucket)
    return partitioned_data(alignment, trees, model)


def _unlinked(model) -> bool:
    return isinstance(model, PartitionedModel) and model.link == "unlinked"


def search_template(model):
    """The model a search carries: unlinked lengths travel beside the trees (`[B, M, K]`), not in the model."""
    return model.without_branch_lengths() if _unlinked(model) else model


def search_lengths(lengths: jax.Array, model) -> jax.Array:
    """Kernel-tree lengths `[B, M]` as a search climbs them: for unlinked lengths every part starts from them."""
    return jnp.repeat(lengths[..., None], model.num_parts, -1) if _unlinked(model) else lengths


def kernel_tree_lengths(tree: Tree, model) -> tuple[TreeBatch, jax.Array]:
    """A fitted tree as a search batch of one, and its lengths as a search holds them: with a model that
    carries unlinked lengths (`[K, nodes]`, as `ml.fit` and `ml.search` return it) every part's, `[1, M, K]`."""
    batch = kernel_batch([tree])
    if not _unlinked(model) or model.branch_lengths is None:
        return batch, search_lengths(batch.branch_lengths, model)
    own = [kernel_batch([tree.with_branch_lengths(x)]).branch_lengths for x in model.branch_lengths]
    return batch, jnp.stack(own, -1)
