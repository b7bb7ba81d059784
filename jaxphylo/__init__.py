"""jaxphylo: differentiable statistical phylogenetics in JAX.

Importing jaxphylo switches JAX to 64-bit floats (`jax_enable_x64`): phylogenetic
likelihoods need them by default. float32 stays available per call.
"""

import jax

jax.config.update("jax_enable_x64", True)

from .data import Alignment, Alphabet, DNA, PROTEIN, SitePatterns, codon_alphabet, distances  # noqa: E402
from ._examples import example_paths  # noqa: E402
from ._errors import InputError, JaxphyloError, ModelError  # noqa: E402
from .tree import (  # noqa: E402
    Schedule, Topology, Tree, TreeBatch, bionj, build_schedule, neighbor_joining, random_topology_tree,
)
from .io import PartitionScheme, parse_newick, read_alignment, read_partitions, read_tree, write_tree  # noqa: E402
from .likelihood import (  # noqa: E402
    ancestral_marginals,
    branch_length_derivatives,
    log_likelihood,
    partitioned_log_likelihoods,
    pattern_log_likelihoods,
    shard_pattern_data,
    sharded_batch_log_likelihoods,
    sharded_log_likelihood,
)
from .models import (  # noqa: E402
    Model, ModelCoordinates, PartitionedModel, parse_model, partitioned_model, simulate, unconstrain,
)
from . import coevolution, inference, ml  # noqa: E402
from .runtime import device_mesh, replicate  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Alignment", "SitePatterns", "Alphabet", "DNA", "PROTEIN", "codon_alphabet",
    "JaxphyloError", "InputError", "ModelError", "Schedule", "build_schedule",
    "Topology", "Tree", "TreeBatch", "read_alignment", "read_tree", "parse_newick", "write_tree",
    "read_partitions", "PartitionScheme", "PartitionedModel", "partitioned_model", "partitioned_log_likelihoods",
    "log_likelihood", "pattern_log_likelihoods", "ancestral_marginals",
    "branch_length_derivatives", "Model", "parse_model", "unconstrain", "ModelCoordinates",
    "simulate", "random_topology_tree", "distances", "neighbor_joining", "bionj", "coevolution", "inference", "example_paths",
    "device_mesh", "shard_pattern_data", "sharded_log_likelihood", "sharded_batch_log_likelihoods", "replicate",
]
