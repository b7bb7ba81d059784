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
from jaxtyping import Array, Float, Int

from ..data import Alignment, alphabet_for
from .._errors import InputError, ModelError
from ..io._partitions import PartitionScheme
from ._amino_acid import EMPIRICAL_MODELS
from ._model import Model
from ._parse import _ALIASES, parse_model

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
    key = _ALIASES.get(_base_name(string))
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


# ---------------------------------------------------------------- data


class GroupData(eqx.Module):
    """Pattern data of the parts of one group, padded to a common pattern count and code table."""

    parts: tuple[int, ...] = eqx.field(static=True)
    tip_codes: Int[Array, "parts tips_plus_one patterns"]
    tip_table: Float[Array, "parts codes states"]
    weights: Float[Array, "parts patterns"]


class PartitionedData(eqx.Module):
    """Every group's pattern data, laid out for one tree's tips (a pytree: a jit argument).

    Side by side, the groups' patterns (part by part inside a group, padding
    included) form one pattern axis: `weights` and `part_of_pattern` follow
    it, and so do the batched log-likelihoods (`batch_part_pattern_log_likelihoods`).
    """

    groups: tuple[GroupData, ...]
    num_parts: int = eqx.field(static=True)

    @property
    def weights(self) -> Float[Array, " patterns"]:
        return jnp.concatenate([g.weights.reshape(-1) for g in self.groups])

    def group_offsets(self) -> list[int]:
        """Where every group's patterns begin on the side-by-side pattern axis."""
        return list(np.cumsum([0] + [g.weights.shape[0] * g.weights.shape[1] for g in self.groups])[:-1])

    def group_weights(self, weights: Float[Array, "B patterns"]) -> list[Float[Array, "parts B group_patterns"]]:
        """Per-tree weights on the side-by-side axis split into every group's `[K_g, B, P_g]`."""
        return [jnp.moveaxis(weights[:, start:start + g.weights.size].reshape((-1,) + g.weights.shape), 1, 0)
                for start, g in zip(self.group_offsets(), self.groups)]

    @property
    def part_of_pattern(self) -> Int[np.ndarray, " patterns"]:
        """The part of every pattern of the side-by-side axis (padding included)."""
        return np.concatenate([np.repeat(np.asarray(g.parts), g.weights.shape[1]) for g in self.groups])

    # One PhyloCTMC observation to NumPyro (see `likelihood.PatternData`).
    shape = property(lambda self: ())
    ndim = property(lambda self: 0)


def partitioned_data(alignment: Alignment, tree, model: PartitionedModel) -> PartitionedData:
    """Split the alignment into parts, compress each part's patterns and lay them out for `tree`.

    Parts are grouped by `(states, rate categories)`; inside a group, each
    part's codes are padded to the group's largest pattern count with the
    all-missing row (weight zero) and its code table with all-one rows.
    """
    from ..likelihood._api import _check_taxa, pattern_data

    _check_taxa(alignment, tree)
    return grouped_data([pattern_data(part, tree) for part in part_alignments(alignment, model)], model)


def grouped_data(layouts: list, model: PartitionedModel) -> PartitionedData:
    """Every part's `PatternData` (NumPy or JAX arrays) in groups of equal `(states, categories)`, padded."""
    xp = np if all(isinstance(x, np.ndarray) for layout in layouts for x in jax.tree.leaves(layout)) else jnp
    keys: dict[tuple[int, int], list[int]] = {}
    for k, (m, layout) in enumerate(zip(model.models, layouts)):
        categories = jax.eval_shape(m.rate_categories)[1].shape[0]
        keys.setdefault((layout.tip_table.shape[1], categories), []).append(k)
    groups = []
    for members in keys.values():
        patterns = max(layouts[k].tip_codes.shape[1] for k in members)
        codes = max(layouts[k].tip_table.shape[0] for k in members)
        tip_codes, tables, weights = [], [], []
        for k in members:
            c, t, w = layouts[k].tip_codes, layouts[k].tip_table, layouts[k].weights
            missing = t.shape[0] - 1  # pattern_data's all-missing row, last
            tip_codes.append(xp.pad(c, ((0, 0), (0, patterns - c.shape[1])), constant_values=missing))
            tables.append(xp.vstack([t, xp.ones((codes - t.shape[0], t.shape[1]), t.dtype)]))
            weights.append(xp.pad(w, (0, patterns - w.shape[0])))
        groups.append(GroupData(tuple(members), xp.stack(tip_codes).astype(np.int32), xp.stack(tables),
                                xp.stack(weights)))
    return PartitionedData(tuple(groups), model.num_parts)


# ---------------------------------------------------------------- likelihood


def group_kernel_arrays(models, group: GroupData, part_lengths, dtype, per_tree_models: bool = False):
    """The kernels' input `(P, pi, w, tip codes, tip table)` of a group's parts, stacked `[K_g, ...]`.

    `part_lengths[k]` are part `k`'s lengths in layout order `[B, ids]`; each
    part's matrices come from its own model (`model_arrays`).
    """
    from ..likelihood._api import model_arrays

    own = [model_arrays(models[k], part_lengths[k], dtype, per_tree_models) for k in group.parts]
    return tuple(jnp.stack(x) for x in zip(*own)) + (jnp.asarray(group.tip_codes),
                                                     jnp.asarray(group.tip_table).astype(dtype))


def _group_pattern_log_likelihoods(models, group: GroupData, part_lengths, schedule, dtype, static_steps,
                                   per_tree_models: bool) -> Float[Array, "parts B patterns"]:
    """`log L_c` of one group's parts, `[K_g, B, P_g]`: ONE kernel call, vmapped over the group's parts."""
    from ..likelihood._api import _kernel

    arrays = group_kernel_arrays(models, group, part_lengths, dtype, per_tree_models)
    return jax.vmap(lambda *arrays: _kernel(arrays, schedule, static_steps))(*arrays)


@eqx.filter_jit
def _part_log_likelihoods(models: tuple[Model, ...], lengths: Float[Array, "parts nodes"], data: PartitionedData,
                          schedule, index, dtype, static_steps):
    """`[K]` log-likelihoods from each part's branch lengths: one program for every link mode."""
    from ..likelihood._api import layout_lengths

    layout = jax.vmap(lambda t: layout_lengths(t, index, schedule))(lengths)  # [K, 1, ids]
    result = [None] * data.num_parts
    for group in data.groups:
        per_pattern = _group_pattern_log_likelihoods(models, group, layout, schedule, dtype, static_steps, False)
        totals = jnp.sum(group.weights.astype(per_pattern.dtype) * per_pattern[:, 0], axis=-1)
        for j, k in enumerate(group.parts):
            result[k] = totals[j]
    return jnp.stack(result)


def part_layout_lengths(model: PartitionedModel, branch_lengths: Float[Array, "B nodes *parts"], schedule,
                        per_tree_models: bool = False) -> list[Float[Array, "B ids"]]:
    """Every part's lengths of a batch of trees, in the schedule's layout order (one `[B, ids]` per part).

    Linked lengths `[B, nodes]` give `t_k = r_k t` (`r_k` the normalised rates, `[B, K]` with
    `per_tree_models`); unlinked ones (`-Q`) are every part's own, `[B, nodes, K]`, parts last so
    that node indexing is the same for both.
    """
    from ..likelihood._api import batch_layout_lengths

    if model.link == "unlinked" and model.branch_lengths is not None:
        raise ModelError("a batch of trees takes its lengths as an argument: unlinked ones as [trees, nodes, parts], "
                         "not in the model")
    if branch_lengths.ndim == 3:
        if model.link != "unlinked" or branch_lengths.shape[-1] != model.num_parts:
            raise ModelError(f"per-part branch lengths of shape {tuple(branch_lengths.shape)} need an unlinked (-Q) "
                             f"model of {branch_lengths.shape[-1]} parts")
        return [batch_layout_lengths(branch_lengths[..., k], schedule) for k in range(model.num_parts)]
    rates = model.normalised_rates()  # [K], or [B, K] with per-tree models
    scaled = rates.T[:, :, None] * branch_lengths[None] if per_tree_models else (
        rates[:, None, None] * branch_lengths[None])
    return [batch_layout_lengths(lengths, schedule) for lengths in scaled]


def batch_part_pattern_log_likelihoods(model: PartitionedModel, schedule, branch_lengths: Float[Array, "B nodes *parts"],
                                       data: PartitionedData, dtype,
                                       per_tree_models: bool = False) -> Float[Array, "B patterns"]:
    """`log L_c` of a batch of trees (a device schedule), every part's patterns side by side in
    `PartitionedData.weights`'s order: `[B, sum_g K_g P_g]`, one kernel call per group. Lengths as
    `part_layout_lengths` takes them: linked `[B, nodes]`, or unlinked `[B, nodes, K]`.

    With `per_tree_models` every leaf of `model` (part models and rates) has a leading `[B]` axis.
    """
    layout = part_layout_lengths(model, branch_lengths, schedule, per_tree_models)
    groups = [_group_pattern_log_likelihoods(model.models, group, layout, schedule, dtype, None, per_tree_models)
              for group in data.groups]
    return jnp.concatenate([jnp.moveaxis(g, 0, 1).reshape(g.shape[1], -1) for g in groups], axis=1)


def partitioned_data_log_likelihoods(data: PartitionedData, tree, model: PartitionedModel, *,
                                     precision: str = "float64") -> Float[Array, " parts"]:
    """`log L(A_k | tree, t_k, M_k)` for every part, from data laid out by `partitioned_data` (see the module).

    The parts' lengths `t_k` are formed first (`part_branch_lengths`), so every
    link mode runs the same compiled program.
    """
    from ..tree import branch_index, build_schedule
    from ..tree import Tree
    from ..likelihood.kernels import cpu_wanted
    from ..likelihood._api import PRECISIONS, STEP_BYTES, _check_options
    from ..likelihood.kernels import exact_steps

    _check_options(precision, "preorder")
    if not isinstance(tree, Tree):
        raise ModelError("a partitioned model takes one Tree (per-part lengths live in the model for -Q)")
    dtype = PRECISIONS[precision]
    widest = max(g.tip_codes.shape[0] * g.tip_codes.shape[2] * g.tip_table.shape[2] *
                 jax.eval_shape(model.models[g.parts[0]].rate_categories)[1].shape[0] for g in data.groups)
    schedule = build_schedule(tree.topology, max(1, STEP_BYTES // (widest * jnp.dtype(dtype).itemsize)))
    # Static step counts give the JAX kernel's level loops trip counts XLA knows; the C++ CPU kernel
    # ignores them, and leaving them out there lets every topology of a size share one program.
    cpu = cpu_wanted()
    return _part_log_likelihoods(model.models, model.part_branch_lengths(tree.branch_lengths), data, schedule,
                                 branch_index(tree.topology), dtype, None if cpu else exact_steps(schedule))


def partitioned_log_likelihoods(alignment: Alignment, tree, model: PartitionedModel, *,
                                precision: str = "float64") -> Float[Array, " parts"]:
    """Every part's log-likelihood `[K]`, in the scheme's order; `jax.grad` runs the pre-order pass per part."""
    _check_lengths(tree, model)
    return partitioned_data_log_likelihoods(partitioned_data(alignment, tree, model), tree, model,
                                            precision=precision)


def _check_lengths(tree, model: PartitionedModel) -> None:
    for what, lengths in (("tree", tree.branch_lengths), ("unlinked", model.branch_lengths)):
        if lengths is None or isinstance(lengths, jax.core.Tracer):
            continue
        values = np.asarray(lengths)
        if (bad := ~np.isfinite(values) | (values < 0)).any():
            raise InputError(f"{what} branch length {float(values[bad][0])} is negative or not finite")


def partitioned_log_likelihood(alignment: Alignment, tree, model: PartitionedModel, *,
                               precision: str = "float64") -> Float[Array, ""]:
    """`log L = sum_k log L(A_k | tree, t_k, M_k)`: the sum of `partitioned_log_likelihoods`."""
    return jnp.sum(partitioned_log_likelihoods(alignment, tree, model, precision=precision))
