"""Partitioned models: each part of an alignment with its own model, on one tree.

For parts `k = 1..K` with columns `A_k`, models `M_k` (substitution model and
rate variation; DNA, protein and codon parts may mix) and branch lengths
`t_k` (below), the log-likelihood is the sum over parts,

    log L = sum_k log L(A_k | tree, t_k, M_k).

How the parts' branch lengths `t_k` follow from the tree's `t` (IQ-TREE's
options in brackets):

- `"proportional"` (`-p`, the default): `t_k = r~_k t`, with per-part rates
  `r_k > 0` normalised so that their site-weighted mean is one, as IQ-TREE
  fixes it: `r~_k = r_k / (sum_j n_j r_j / sum_j n_j)`, `n_k` the part's
  sites in model units (codons for a codon part). Only the ratios of `rates`
  matter, so `log L` is flat along `rates -> c rates`.
- `"equal"` (`-q`): `t_k = t`; `rates` is unused.
- `"unlinked"` (`-Q`): `t_k = branch_lengths[k]`, each part its own lengths
  on the tree's topology (indexed by the tree's nodes); while
  `branch_lengths` is None every part takes the tree's `t`.

Evaluation (`partitioned_log_likelihoods`): parts with the same state count
and the same number of rate categories form a group, and a group is one
kernel call. Inside a group every part is one element of a `jax.vmap` of the
likelihood kernel (a batch of one tree), with its own transition matrices,
`pi`, category weights and its own compressed site patterns, padded with
weightless all-missing patterns to the group's largest pattern count `P_max`.
The alternative, the union of all parts' patterns with per-part weights (zero
off the part) through the kernel's own tree axis, shares tip data across the
batch but makes every part compute every pattern: `K x |union|` pattern
evaluations against `K x P_max` here (`|union|` is near `sum_k P_k`, so the
union costs about `K` times more for K parts of similar size, and codon
positions 1, 2, 3 of lassa S have 345, 188 and 1,019 patterns: 1,552 in all
against a padded 3 x 1,019 = 3,057, and `3 x 1,552` for the union). The CPU
custom call runs the mapped axis as a loop inside the same compiled program.
The transition matrices are built per part, vmapped over parts whose models
have the same structure (one eigendecomposition each, all in one op).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..data import Alignment, alphabet_for
from .._errors import InputError, ModelError
from ..io import PartitionScheme
from ._amino_acid import EMPIRICAL_MODELS
from ._model import Model
from ._parse import canonical_name, parse_model

LINKS = ("proportional", "equal", "unlinked")


class PartsEstimated(NamedTuple):
    """What inference frees in a partitioned model: parameter groups per part, and whether the rate multipliers."""

    parts: tuple[frozenset[str], ...]
    rates: bool


class PartitionedModel(eqx.Module):
    """A model per part of a `PartitionScheme` and how the parts' branch lengths are linked (module docstring).

    `models[k]` is part `k`'s `Model`; `rates [K]` the per-part rate
    multipliers (`"proportional"`); `branch_lengths [K, nodes]` or None the
    per-part lengths (`"unlinked"`). `site_counts[k]` is `n_k`, the sites of
    part `k` in model units. Every float leaf is differentiable.
    """

    models: tuple[Model, ...]
    rates: Float[Array, " parts"]
    branch_lengths: Float[Array, "parts nodes"] | None
    scheme: PartitionScheme = eqx.field(static=True)
    link: str = eqx.field(static=True)
    site_counts: tuple[int, ...] = eqx.field(static=True)
    model_strings: tuple[str, ...] = eqx.field(static=True, default=())  # each part's, as built from strings

    def __check_init__(self):
        if self.link not in LINKS:
            raise ModelError(f"link must be one of {', '.join(map(repr, LINKS))}, not {self.link!r}")
        if len(self.models) != self.scheme.num_parts or len(self.site_counts) != self.scheme.num_parts:
            raise ModelError(f"{self.scheme.num_parts} parts but {len(self.models)} models")

    @property
    def num_parts(self) -> int:
        return len(self.models)

    @property
    def names(self) -> tuple[str, ...]:
        return self.scheme.names

    def __repr__(self) -> str:
        """A one-line summary, e.g. `PartitionedModel(3 parts, proportional: pos1 dna, pos2 dna, pos3 dna)`."""
        parts = ", ".join(f"{n} {m.alphabet.name}" for n, m in zip(self.names[:6], self.models))
        more = ", ..." if self.num_parts > 6 else ""
        return f"PartitionedModel({self.num_parts} parts, {self.link}: {parts}{more})"

    def normalised_rates(self) -> Float[Array, " parts"]:
        """`r~_k = r_k / (sum_j n_j r_j / sum_j n_j)` for `"proportional"`; ones otherwise (of the rates' shape:
        `[B, K]` in a batch of per-tree models, as MC³'s chains under -q have)."""
        if self.link != "proportional":
            return jnp.ones_like(self.rates)
        counts = jnp.asarray(self.site_counts, dtype=jnp.result_type(self.rates, float))
        return self.rates * (jnp.sum(counts) / jnp.sum(counts * self.rates, axis=-1, keepdims=True))

    def part_branch_lengths(self, branch_lengths: Float[Array, " nodes"]) -> Float[Array, "parts nodes"]:
        """Every part's branch lengths `t_k [K, nodes]` from the tree's `t`."""
        if self.link == "unlinked" and self.branch_lengths is not None:
            if self.branch_lengths.shape != (self.num_parts,) + tuple(jnp.shape(branch_lengths)):
                raise InputError(f"unlinked branch lengths of shape {tuple(self.branch_lengths.shape)} do not fit "
                                 f"{self.num_parts} parts of a tree of {jnp.shape(branch_lengths)[0]} nodes")
            return self.branch_lengths
        return self.normalised_rates()[:, None] * branch_lengths[None, :]

    def with_branch_lengths(self, branch_lengths: Float[Array, "parts nodes"]) -> "PartitionedModel":
        """The same model, `"unlinked"`, with these per-part lengths (indexed by the tree's nodes)."""
        lengths = jnp.asarray(branch_lengths)
        if lengths.ndim != 2 or lengths.shape[0] != self.num_parts:
            raise InputError(f"per-part branch lengths must be [{self.num_parts}, nodes], not {tuple(lengths.shape)}")
        return PartitionedModel(self.models, self.rates, lengths, self.scheme, "unlinked", self.site_counts,
                                self.model_strings)

    def without_branch_lengths(self) -> "PartitionedModel":
        """The same model with no per-part lengths in it (a batch of trees brings its own)."""
        return PartitionedModel(self.models, self.rates, None, self.scheme, self.link, self.site_counts,
                                self.model_strings)

    def with_parts(self, models: tuple[Model, ...], rates) -> "PartitionedModel":
        """The same scheme and link with other part models and rate multipliers."""
        return PartitionedModel(tuple(models), rates, self.branch_lengths, self.scheme, self.link, self.site_counts,
                                self.model_strings)

    @property
    def rates_free(self) -> bool:
        """Whether the rate multipliers are parameters: linked proportional lengths over several parts."""
        return self.link == "proportional" and self.num_parts > 1


# ---------------------------------------------------------------- building


def _base_name(string: str) -> str:
    return string.split("+", 1)[0].split("{", 1)[0].strip().upper()


def _model_data_type(string: str | None) -> str | None:
    """'protein' for an amino-acid matrix, 'codon' for GY, else None (any alignment's)."""
    if string is None:
        return None
    key = canonical_name(_base_name(string))
    if key in EMPIRICAL_MODELS:
        return "protein"
    if key == "GY94":
        return "codon"
    return None


def _columns_as_alignment(alignment: Alignment, columns: np.ndarray, data_type: str, genetic_code: int,
                          name: str) -> Alignment:
    raw = np.frombuffer("".join(alignment.sequences).encode("ascii", "replace"), np.uint8)
    raw = raw.reshape(len(alignment.taxa), -1)[:, columns]
    sequences = tuple(row.tobytes().decode("ascii") for row in raw)
    source = f"{alignment.source} (part {name!r})"
    if data_type == "codon" and len(columns) % 3:
        raise InputError(f"{source}: a codon part needs a multiple of 3 sites, not {len(columns)}")
    return Alignment(alignment.taxa, sequences, alphabet_for(data_type, genetic_code), source)


def _alignment_columns(alignment: Alignment) -> int:
    return len(alignment.sequences[0])


@lru_cache(maxsize=16)
def split_alignment(alignment: Alignment, scheme: PartitionScheme, kinds: tuple[tuple[str, int], ...]) -> tuple[Alignment, ...]:
    """The columns of every part as an alignment of the part's `(data type, genetic code)` in `kinds`."""
    sites = scheme.sites(_alignment_columns(alignment))
    return tuple(_columns_as_alignment(alignment, columns, kind, code, name)
                 for columns, (kind, code), name in zip(sites, kinds, scheme.names))


def part_alignments(alignment: Alignment, model: PartitionedModel) -> tuple[Alignment, ...]:
    """The alignment's columns of every part, each in its model's data type (codon parts re-encoded)."""
    kinds = tuple((m.alphabet.name, m.alphabet.genetic_code or 1) for m in model.models)
    return split_alignment(alignment, model.scheme, kinds)


def partitioned_model(
    scheme: PartitionScheme,
    alignment: Alignment,
    default_model: str | Mapping[str, str] | None = "GTR+G4",
    link: str = "proportional",
    rates=None,
) -> PartitionedModel:
    """One `Model` per part: the scheme's model string, else `default_model` (a string, or one per data type).

    With `default_model` None every part must name its model (an IQ-TREE
    `charpartition` with a model per entry); a part without one is a
    `ModelError` naming the part and the line that defined it.

    A part's data type is the scheme's, else that of its model string (a
    protein matrix: protein; GY: codon), else the alignment's. Codon parts
    are re-encoded as codons with the scheme's genetic code. A model named by
    a RAxML-style file's first word (`DNA` is GTR, `WAG, p2 = ...` WAG) gets
    the terms of `default_model` after its base appended, frequencies and
    rate variation (IQ-TREE 2 does so with `-m`). Empirical
    frequencies (`+F`, and the default without a frequency term) are each
    part's own. `rates` are the starting rate multipliers (ones by default,
    IQ-TREE's start). Sites in no part are left out (see `PartitionScheme`).
    """
    if link not in LINKS:
        raise ModelError(f"link must be one of {', '.join(map(repr, LINKS))}, not {link!r}")
    own = alignment.alphabet
    strings, kinds = [], []
    for k, name in enumerate(scheme.names):
        string, data_type = scheme.models[k], scheme.data_types[k]
        if data_type is None:
            data_type = _model_data_type(string if string is not None else _default_for(default_model, None))
        data_type = data_type or own.name
        code = scheme.genetic_codes[k] if scheme.data_types[k] == "codon" else (own.genetic_code or 1)
        default = _default_for(default_model, data_type)
        if string is None:
            if default_model is None:
                raise ModelError(f"{scheme._where(k)}: part {name!r} names no model, and no default model was given")
            if default is None:
                raise ModelError(f"{scheme.source}: part {name!r} ({data_type}) has no model and no default for it")
            string = default
        elif scheme.format == "raxml" and "+" not in string and default is not None and "+" in default:
            string += "+" + default.split("+", 1)[1]
        strings.append(string)
        kinds.append((data_type, code))
    parts = split_alignment(alignment, scheme, tuple(kinds))
    models = []
    for name, string, part in zip(scheme.names, strings, parts):
        try:
            models.append(parse_model(string, alignment=part))
        except ModelError as error:
            raise ModelError(f"part {name!r}: {error}") from None
    counts = [part.num_sites for part in parts]
    start = jnp.ones(scheme.num_parts) if rates is None else jnp.asarray(rates, float)
    if start.shape != (scheme.num_parts,):
        raise ModelError(f"rates must have one value per part ({scheme.num_parts}), not shape {start.shape}")
    return PartitionedModel(tuple(models), start, None, scheme, link, tuple(counts), tuple(strings))


def _default_for(default_model, data_type: str | None) -> str | None:
    """The default model string for a data type (a mapping's entry; a plain string serves every type; None: none)."""
    if default_model is None or isinstance(default_model, str):
        return default_model
    if data_type is None:
        return None
    return default_model.get(data_type)


def model_record(model) -> str:
    """A model as a run's checkpoint records it: a string or `Model` by its text (which holds its values), a
    partitioned model by what it was built from and its values."""
    if isinstance(model, PartitionedModel):
        model = repr((model.model_strings, model.link, model.scheme.names, model.site_counts,
                      [np.asarray(x).tolist() for x in jax.tree.leaves(model)]))
    return str(model)
