"""Reading and writing alignments and trees."""

from ._alignment_files import read_alignment
from ._dates import dates_from_names, read_dates, tip_heights
from ._distance_files import read_distance_matrix, write_distance_matrix
from ._tree_files import parse_newick, read_tree, to_dendropy, write_tree

__all__ = ["read_alignment", "read_tree", "parse_newick", "write_tree", "to_dendropy",
           "read_distance_matrix", "write_distance_matrix",
           "read_dates", "dates_from_names", "tip_heights"]
