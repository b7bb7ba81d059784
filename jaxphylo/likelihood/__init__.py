"""The likelihood: public functions of alignments, trees and models, and the array level they are built on.

Public: `log_likelihood`, `pattern_log_likelihoods` (a `Tree` or `TreeBatch`, a `Model` or
`PartitionedModel`), `data_log_likelihood` and `batch_data_log_likelihoods` on pattern data laid out
once, `ancestral_marginals`, `branch_length_derivatives`, `plan` (what a run will cost).

Array level (for searches and samplers that manage their own trees and models): `pattern_data`,
`model_arrays`/`kernel_arrays` and the layout of branch lengths, `batch_pattern_log_likelihoods` (topologies
as data, a model per tree), the partitioned data and kernels' arrays, and `kernels` (the passes).

Incremental (for samplers that keep each chain's partials between generations): `full_partials`,
`proposed_partials` (only the nodes a move touched, found by diffing parent and length arrays:
`dirty_nodes`, `operation_lists`) and `accept_partials` (a per-node buffer flip), on `NodePartials`.
"""

from . import kernels as kernels
from ._ancestral import ancestral_marginals as ancestral_marginals
from ._api import (
    batch_data_log_likelihoods as batch_data_log_likelihoods,
    batch_pattern_log_likelihoods as batch_pattern_log_likelihoods,
    data_log_likelihood as data_log_likelihood,
    log_likelihood as log_likelihood,
    max_step_width as max_step_width,
    node_bytes as node_bytes,
    pattern_log_likelihoods as pattern_log_likelihoods,
    prepare as prepare,
)
from ._arrays import (
    PRECISIONS as PRECISIONS,
    STEP_BYTES as STEP_BYTES,
    PatternData as PatternData,
    batch_layout_lengths as batch_layout_lengths,
    bucket_patterns as bucket_patterns,
    check_inputs as check_inputs,
    check_options as check_options,
    kernel_arrays as kernel_arrays,
    layout_lengths as layout_lengths,
    model_arrays as model_arrays,
    spectral_arrays as spectral_arrays,
    pattern_bucket as pattern_bucket,
    pattern_data as pattern_data,
)
from ._batch import (
    kernel_tree_lengths as kernel_tree_lengths,
    search_data as search_data,
    search_lengths as search_lengths,
    search_template as search_template,
)
from ._cost import Cost as Cost, partials_cells as partials_cells, plan as plan
from ._derivatives import (
    branch_length_derivatives as branch_length_derivatives,
    derivatives_from_arrays as derivatives_from_arrays,
    layout_branch_derivatives as layout_branch_derivatives,
)
from ._incremental import (
    NodePartials as NodePartials,
    accept_partials as accept_partials,
    dirty_nodes as dirty_nodes,
    full_partials as full_partials,
    operation_lists as operation_lists,
    proposed_partials as proposed_partials,
)
from ._finite import check_start as check_start, require_finite as require_finite
from ._partitioned import (
    PartitionedData as PartitionedData,
    check_lengths as check_lengths,
    group_kernel_arrays as group_kernel_arrays,
    grouped_data as grouped_data,
    part_layout_lengths as part_layout_lengths,
    partitioned_data as partitioned_data,
    partitioned_data_log_likelihoods as partitioned_data_log_likelihoods,
    partitioned_log_likelihood as partitioned_log_likelihood,
    partitioned_log_likelihoods as partitioned_log_likelihoods,
)
from ._sharded import (
    pad_batch as pad_batch,
    place_data as place_data,
    shard_pattern_data as shard_pattern_data,
    sharded_batch_log_likelihoods as sharded_batch_log_likelihoods,
    sharded_log_likelihood as sharded_log_likelihood,
)
from ._single import schedule_for as schedule_for, schedule_pattern_log_likelihoods as schedule_pattern_log_likelihoods
