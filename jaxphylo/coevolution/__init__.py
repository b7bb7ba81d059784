"""Mutual information between alignment columns, against a shuffling null model."""

from ._mutual_information import MutualInformation, column_symbols, mutual_information

__all__ = ["mutual_information", "MutualInformation", "column_symbols"]
