"""Substitution models, rate variation and model strings."""

from ._amino_acid import EMPIRICAL_MODELS, EmpiricalAminoAcid, empirical_matrix
from ._base import Decomposed, SubstitutionModel, decomposed, transition_matrices
from ._codon import GY94
from ._frequencies import codon_frequencies, empirical_frequencies
from ._model import Model, category_count
from ._nucleotide import F81, GTR, HKY85, JC69, K80, NAMED_DNA_MODELS, TN93, ConstrainedGTR, rate_classes
from ._parse import canonical_name, estimated_parameters, model_string, parse_model
from ._partitioned import (
    LINKS, PartitionedModel, PartsEstimated, model_record, part_alignments, partitioned_model, split_alignment,
)
from ._parameters import (
    MAX_LENGTH, MIN_LENGTH, ModelCoordinates, estimate_sets, lengths_from_unconstrained, lengths_to_unconstrained,
    ml_estimated, parameter_names, resolve_model, unconstrain,
)
from ._priors import MRBAYES_PRIORS, default_priors, describe_priors, initial_values, sample_model
from ._simulate import simulate
from ._rates import (
    DiscreteGamma, FixedCategories, FreeRates, InvariantSites, RateVariation, UniformRates, discrete_gamma_rates,
    median_gamma_rates,
)

__all__ = [
    "Model", "category_count", "SubstitutionModel", "transition_matrices", "parse_model", "canonical_name", "model_string", "estimated_parameters",
    "JC69", "K80", "F81", "HKY85", "TN93", "GTR", "ConstrainedGTR", "NAMED_DNA_MODELS", "rate_classes",
    "EmpiricalAminoAcid", "EMPIRICAL_MODELS", "GY94",
    "RateVariation", "UniformRates", "DiscreteGamma", "FreeRates", "InvariantSites", "FixedCategories",
    "Decomposed", "decomposed",
    "empirical_frequencies", "codon_frequencies",
    "PartitionedModel", "PartsEstimated", "partitioned_model", "part_alignments", "split_alignment", "LINKS",
    "simulate", "ModelCoordinates", "unconstrain", "estimate_sets", "lengths_from_unconstrained",
    "lengths_to_unconstrained", "MAX_LENGTH", "MIN_LENGTH", "MRBAYES_PRIORS", "default_priors", "initial_values",
    "sample_model", "empirical_matrix", "ml_estimated", "resolve_model", "parameter_names", "describe_priors", "model_record", "discrete_gamma_rates", "median_gamma_rates",
]
