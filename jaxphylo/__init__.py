"""jaxphylo: differentiable statistical phylogenetics in JAX.

Importing jaxphylo switches JAX to 64-bit floats (`jax_enable_x64`): phylogenetic
likelihoods need them by default. float32 stays available per call.

It also turns on JAX's persistent compilation cache in the user's cache folder
(`jaxphylo.runtime.enable_compilation_cache`), so that a program compiled once on
this machine is loaded by every later run, script, notebook or command alike:
`JAXPHYLO_CACHE_DIR=PATH` moves it, `JAXPHYLO_CACHE_DIR=off` turns it off, and a
cache configured in JAX itself is left as it is.
"""

import jax

jax.config.update("jax_enable_x64", True)

from .runtime import enable_compilation_cache  # noqa: E402

enable_compilation_cache()

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
