"""Trees in every form the package uses.

- `Topology` (the shape: parent indices, any number of children) and `Tree` (a topology with
  differentiable branch lengths): what users read, write and pass around.
- Kernel form (`binarize`, `TreeBatch`, rooting on tip 0): binary rooted parent arrays, what the
  likelihood kernels, searches and samplers work on; its tip-0 view (`to_view`, `from_view`), the unrooted
  tree hung from tip 0 that MCMC moves edit.
- `Schedule`: the post-order traversal of kernel trees as index arrays (the BEAGLE/libpll
  operation list, as data).
- `TimeTree`: rooted trees with node heights, and the ratio transform that makes heights unconstrained.
- Splits and Robinson-Foulds distances; starting trees (neighbour joining, BIONJ, parsimony).
"""

from ._kernel_form import (
    TreeBatch as TreeBatch,
    binarize as binarize,
    branch_index as branch_index,
    fixed_branches as fixed_branches,
    kernel_batch as kernel_batch,
    mask_like as mask_like,
    root_on_first_tip as root_on_first_tip,
    rooted_on_first_tip as rooted_on_first_tip,
    unrooted as unrooted,
)
from ._neighbor_joining import bionj as bionj, neighbor_joining as neighbor_joining
from ._parsimony import (
    parsimony_score as parsimony_score,
    parsimony_tree as parsimony_tree,
    parsimony_trees as parsimony_trees,
)
from ._schedule import (
    Schedule as Schedule,
    build_schedule as build_schedule,
    device_schedule as device_schedule,
    host_schedule as host_schedule,
    kernel_children as kernel_children,
    node_levels as node_levels,
    phase_widths as phase_widths,
    trim_slots as trim_slots,
)
from ._splits import (
    combine_labels as combine_labels,
    kernel_splits as kernel_splits,
    robinson_foulds as robinson_foulds,
    splits as splits,
    with_supports as with_supports,
)
from ._tip_view import (
    descendants as descendants,
    from_view as from_view,
    neighbours as neighbours,
    node_children as node_children,
    sibling as sibling,
    to_view as to_view,
)
from ._time_tree import (
    TimeTree as TimeTree,
    all_heights as all_heights,
    ancestors_of as ancestors_of,
    anchors_on as anchors_on,
    branch_durations as branch_durations,
    heights_from_tree as heights_from_tree,
    heights_to_ratios as heights_to_ratios,
    jump_rounds as jump_rounds,
    jumps as jumps,
    node_anchors as node_anchors,
    ratio_coordinates_on as ratio_coordinates_on,
    ratio_heights_on as ratio_heights_on,
    ratio_log_jacobian as ratio_log_jacobian,
    ratio_log_jacobian_on as ratio_log_jacobian_on,
    ratios_to_heights as ratios_to_heights,
    start_heights as start_heights,
    time_tree as time_tree,
    with_sampled_tips as with_sampled_tips,
)
from ._topology import Topology as Topology, Tree as Tree, random_topology_tree as random_topology_tree
