"""Reading and writing alignments and trees."""

from ._alignment_files import read_alignment
from ._dates import (
    TipDates, TipHeights, dates_from_names, parse_date, read_dates, read_tip_dates, tip_dates_from_names, tip_heights,
)
from ._distance_files import read_distance_matrix, write_distance_matrix
from ._newick import newick_string, nexus_trees_header, quoted
from ._partitions import PartitionScheme, SiteRange, read_partitions
from ._tree_files import from_dendropy, parse_newick, read_tree, to_dendropy, write_tree

__all__ = ["read_alignment", "read_tree", "parse_newick", "write_tree", "to_dendropy", "from_dendropy", "newick_string", "nexus_trees_header", "quoted",
           "read_distance_matrix", "write_distance_matrix",
           "read_tip_dates", "tip_dates_from_names", "parse_date", "TipDates", "TipHeights",
           "read_dates", "dates_from_names", "tip_heights", "read_partitions", "PartitionScheme", "SiteRange"]
