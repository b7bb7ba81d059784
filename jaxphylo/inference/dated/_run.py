"""`dated_mcmc`: a time-tree analysis with the topology free, from an alignment and tip dates to BEAST's outputs.

Blocks of `DatedSettings.block` samples run on the device
(`_kernel.run_block`); between blocks the host appends every run's cold chain's
samples (every chain's when unheated) to `chain{c}.log` (Tracer) and `chain{c}.trees` (NEXUS with
`[&height=..., rate=...]` on every node), reports progress, writes the
checkpoint and reads stop requests. A resumed run truncates the files to the
checkpoint and ends with the bytes of a run that never stopped. At the end,
`mcc.tree` is the maximum-clade-credibility tree of the chains' samples
after burn-in (`_time_tree_summary`), and `summary.json` holds every column's
median, 95% HPD and ESS.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ...data import Alignment
from ...io import TipDates, nexus_trees_header
from ...runtime import NEVER, BlockRun, alignment_digest, block_size, from_numpy, to_host, to_numpy
from ..._errors import InputError, ModelError
from ...tree import Tree, phase_widths, random_topology_tree, start_heights, time_tree
from ...likelihood import PRECISIONS, max_step_width, pattern_data
from ...models import Model, ModelCoordinates, describe_priors, model_record, parameter_names, resolve_model
from ..nuts import rate_guess
from ._kernel import (
    DATED_MOVES, DatedPosterior, DatedSettings, SPECIATION_PRIORS, init, run_block, with_partials, without_partials,
)
from ._start import start_time_tree
from ._summary import TimeTreeSamples, mcc_tree, summary_rows, time_tree_newick

TREE_PRIORS = ("coalescent", "exponential", "skygrid") + SPECIATION_PRIORS
CLOCKS = ("strict", "relaxed")


@dataclass
class DatedResult:
    """What a run found: every run's cold chain's samples on the host, column names, acceptance and heat swaps,
    the MCC tree."""

    taxa: tuple
    samples: TimeTreeSamples
    settings: DatedSettings
    reference: float | None  # the year at height 0 (None: undated)
    acceptance: dict  # move -> acceptance rate over all chains, heated ones included
    swap_rates: np.ndarray  # [runs, heats, heats]: accepted / tried heat swaps, by heat index pair
    generations: int
    seconds: float
    burnin: float  # the fraction of every chain's samples that summaries leave out

    def mcc_tree(self) -> str:
        return mcc_tree(self.samples, self.taxa, self.burnin, self.reference)

    def summary(self) -> list[dict]:
        return summary_rows(self.samples, self.burnin)


def dated_mcmc(
    alignment: Alignment,
    model="HKY+G4",
    tip_dates=None,
    *,
    clock: str = "strict",
    tree_prior: str = "coalescent",
    tree: Tree | None = None,
    settings: DatedSettings | None = None,
    skygrid_intervals: int = 10,
    skygrid_cutoff: float | None = None,
    skygrid_precision: float | None = None,
    growth_rate_scale: float = 1.0,
    seed: int = 0,
    priors: dict | None = None,
    precision: str = "float64",
    out=None,
    resume: bool = False,
    progress=None,
    stop=NEVER,
    prior_only: bool = False,
    burnin: float = 0.1,
) -> DatedResult:
    """Bayesian time-tree inference with the topology free (see `_dated_mcmc` for the sampler and priors).

    `tip_dates`: a `jaxphylo.io.TipDates` (exact dates; intervals are refused:
    sample them on a fixed topology with `jaxphylo sample`), or tip heights
    (`[N]`, in the alignment's taxon order), or None for contemporaneous tips
    (the clock rate is then 1 and heights are in substitutions; the only
    case `tree_prior="yule"` or `"birth-death"` takes). `tree`: a
    rooted start tree (default: `start_time_tree`'s least-squares time tree).
    `out` receives `chain{c}.log`, `chain{c}.trees`, `mcc.tree`, `summary.json`
    and, after every block, `checkpoint.pkl` (`resume=True` continues it).
    `progress(generation, log posterior per chain)` is called after every block.
    `burnin`: the fraction of each chain's samples the MCC tree and summary leave out.
    `skygrid_precision`: the skygrid's smoothing precision, fixed (default: sampled, Gamma(0.001, 0.001)).
    `growth_rate_scale`: the scale of `tree_prior="exponential"`'s Laplace(0, scale) prior on the growth rate.
    """
    settings = settings or DatedSettings()
    _check_choices(clock, tree_prior)
    if skygrid_precision is not None and (tree_prior != "skygrid" or not skygrid_precision > 0):
        raise ModelError(f"a fixed skygrid precision needs tree_prior='skygrid' and a positive value; got "
                         f"{tree_prior!r}, {skygrid_precision}")
    if not growth_rate_scale > 0:
        raise ModelError(f"the growth rate's Laplace scale must be positive, got {growth_rate_scale}")
    tips, bounds, reference = _tip_heights(alignment, tip_dates)
    _check_speciation_tips(tree_prior, bounds)
    clock_kind = clock if reference is not None else "none"  # contemporaneous tips: heights in substitutions
    posterior, state, names = _starting_state(alignment, model, tips, bounds, reference, clock_kind, tree_prior, tree,
                                              settings, skygrid_intervals, skygrid_cutoff, seed, priors, precision,
                                              prior_only, skygrid_precision, growth_rate_scale)
    record = {"alignment": alignment_digest(alignment), "model": model_record(model), "seed": seed,
              "precision": precision, "priors": describe_priors(priors), "prior_only": prior_only, "clock": clock,
              "tree_prior": tree_prior, "skygrid_precision": skygrid_precision,
              "growth_rate_scale": growth_rate_scale, "tips": np.asarray(tips).tolist(),
              "settings": {k: str(v) for k, v in asdict(settings).items()}}
    taxa = tuple(alignment.taxa)
    files = _OutputFiles(out, settings.chains, taxa, names)
    samples = TimeTreeSamples.empty(settings.chains, names)
    run = BlockRun(None if out is None else Path(out) / "checkpoint.pkl", record, files.paths(), stop)
    key = jax.random.PRNGKey(seed)
    if (saved := run.open(resume)) is not None:
        state = with_partials(from_numpy(saved["state"], without_partials(state)), posterior)
        samples = TimeTreeSamples.from_plain(saved["samples"])
        key = jnp.asarray(saved["key"])
    else:
        files.start()

    def payload():
        return {"state": to_numpy(without_partials(state)), "key": np.asarray(key), "samples": samples.to_plain()}

    total = settings.generations // settings.sample_every
    program, tune = settings.program(), np.int32(settings.tune_generations)
    began = time.perf_counter()
    while samples.count < total:
        run.stop_point(payload, f"after {int(state.chains.generation)} generations")
        count = block_size(samples.count, total, settings.block)
        state, key, block = run_block(state, key, posterior, program, np.int32(count), tune)
        block = to_host(block)
        rows = _rows(block, count, int(state.chains.generation), settings, posterior, reference)
        for generation, chain_rows in rows:
            samples.add(generation, chain_rows)
            files.write(generation, chain_rows)
        run.save(payload)
        if progress is not None:
            progress(int(state.chains.generation), np.asarray(block.log_likelihood[count - 1] +
                                                              block.log_prior[count - 1]))
    state = to_host(without_partials(state))  # the kept partials are not part of the result
    proposed, accepted = state.chains.proposed.sum(0), state.chains.accepted.sum(0)
    acceptance = {m: float(a / p) for m, p, a in zip(DATED_MOVES, proposed, accepted) if p > 0}
    swap_rates = np.asarray(state.swaps_accepted) / np.maximum(np.asarray(state.swaps_tried), 1)
    result = DatedResult(taxa, samples, settings, reference, acceptance, swap_rates, int(state.chains.generation),
                         time.perf_counter() - began, burnin)
    files.finish(result)
    return result


def dated_start(alignment: Alignment, model="HKY+G4", tip_dates=None, *, clock: str = "strict",
                tree_prior: str = "coalescent", settings: DatedSettings | None = None, seed: int = 0,
                precision: str = "float64"):
    """`(posterior, state, reference)`: the posterior `dated_mcmc` samples with these arguments (its defaults for
    the rest), every chain's first state there and the year at height 0 (None: undated), for a caller that runs
    `build_kernel` with a driver of its own (`validation/dated/moves.py` watches what every generation's move
    did). With `dated_mcmc`'s seed and key, such a driver follows `dated_mcmc`'s chains."""
    _check_choices(clock, tree_prior)
    tips, bounds, reference = _tip_heights(alignment, tip_dates)
    _check_speciation_tips(tree_prior, bounds)
    clock_kind = clock if reference is not None else "none"
    posterior, state, _ = _starting_state(alignment, model, tips, bounds, reference, clock_kind, tree_prior, None,
                                          settings or DatedSettings(), 10, None, seed, None, precision, False)
    return posterior, state, reference


def _check_choices(clock: str, tree_prior: str) -> None:
    if clock not in CLOCKS or tree_prior not in TREE_PRIORS:
        raise ModelError(f"clock must be one of {CLOCKS} and the tree prior one of {TREE_PRIORS}; "
                         f"got {clock!r}, {tree_prior!r}")


def _tip_heights(alignment: Alignment, tip_dates):
    """`(tip heights, [2, tips] bounds, year at height 0)` in taxon order: intervals (a bare year, a month,
    an undated tip) are sampled within their bounds, starting at the middle; contemporaneous tips have
    reference `None`, given heights `0.0`."""
    if tip_dates is None:
        zeros = np.zeros(len(alignment.taxa))
        return zeros, np.stack([zeros, zeros]), None
    if isinstance(tip_dates, TipDates):
        b = tip_dates.heights(alignment.taxa)
        return (b.lower + b.upper) / 2, np.stack([b.lower, b.upper]), b.reference
    heights = np.asarray(tip_dates, float)
    if heights.shape != (len(alignment.taxa),) or np.any(heights < 0):
        raise InputError(f"tip heights must be {len(alignment.taxa)} non-negative numbers in taxon order")
    return heights, np.stack([heights, heights]), 0.0


def check_dated_inputs(alignment: Alignment, tip_dates, tree_prior: str) -> None:
    """The checks a dated run makes of its tip dates before anything is compiled (a dry run makes them too)."""
    _check_speciation_tips(tree_prior, _tip_heights(alignment, tip_dates)[1])


def _check_speciation_tips(tree_prior: str, bounds) -> None:
    """Yule and birth–death here are Gernhard's, for tips sampled together; serially sampled birth–death
    (Stadler 2010) needs a sampling rate and an origin this sampler does not have."""
    if tree_prior in SPECIATION_PRIORS and np.ptp(bounds) > 0:
        raise ModelError(f"the {tree_prior} tree prior needs contemporaneous tips (no serial sampling); the tip "
                         f"heights span {np.ptp(bounds):.6g}: use --tree-prior coalescent, exponential or skygrid "
                         f"for dated tips")


def _starting_state(alignment, model, tips, bounds, reference, clock, tree_prior, tree, settings, intervals, cutoff,
                    seed, priors, precision, prior_only, skygrid_precision=None, growth_rate_scale=1.0):
    template, free = resolve_model(model, alignment)
    if isinstance(template, Model):  # what stays fixed is computed once, not every generation
        template = template.with_fixed_parts(free)
    coordinates = ModelCoordinates(template, free)
    if tree is None:  # without temporal signal, the rate that puts the root one sampling span before the tips
        fallback = rate_guess(alignment, tips, np.array([2 * np.max(tips) + 1.0]))
        parents, heights, rate = start_time_tree(alignment, tips, fallback)
    else:
        parents, heights = given_start(alignment, tree, tips)
        rate = rate_guess(alignment, tips, np.array([heights.max()]))
    rate = rate if clock != "none" else 1.0
    root = float(heights.max() - tips.max())
    grid = tuple(float(x) for x in np.arange(1, intervals) * (cutoff or 1.2 * float(heights.max()))
                 / max(intervals - 1, 1)) if tree_prior == "skygrid" else ()  # static: Python floats
    b = settings.batch
    dtype = PRECISIONS[precision]
    data = pattern_data(alignment, random_topology_tree(alignment.taxa, seed=0))  # tips in the alignment's order
    widths = phase_widths(len(alignment.taxa), max_step_width(template, data, dtype, b))
    free = np.flatnonzero(bounds[1] > bounds[0])
    fixed = (("log_skygrid_precision", float(np.log(skygrid_precision))),) if skygrid_precision else ()
    posterior = DatedPosterior(data, coordinates, jnp.asarray(tips, dtype), jnp.asarray(free, jnp.int32),
                               jnp.asarray(bounds[:, free], dtype), widths, dtype, len(tips), clock,
                               tree_prior, grid, None, priors, prior_only, fixed, growth_rate_scale,
                               settings.incremental)
    hyper = _hyper_start(clock, tree_prior, rate, root, intervals, len(parents))
    hyper = {k: v for k, v in hyper.items() if k not in dict(fixed)}
    state = init(np.tile(parents, (b, 1)), np.tile(heights, (b, 1)), _start_params(coordinates, hyper, b, dtype),
                 posterior, settings.heats)
    return posterior, state, column_names(clock, tree_prior, intervals, coordinates, reference is not None, bool(fixed))


@eqx.filter_jit
def _start_params(coordinates, hyper: dict, b: int, dtype):
    """Every chain's unconstrained starting parameters `[b, ...]`: the model's and the clock's and tree prior's
    (one program, not one per operation)."""
    params = {"model": coordinates.start(), **hyper}
    return jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x, dtype), (b,) + jnp.shape(x)), params)


def given_start(alignment, tree: Tree, tips) -> tuple[np.ndarray, np.ndarray]:
    """`(parents, heights)` of a rooted binary start tree, tips renumbered to the alignment's order and put at
    `tips` (the tree's own tip depths must agree with them, as `jaxphylo sample` checks)."""
    if set(tree.taxa) != set(alignment.taxa):
        extra = sorted(set(tree.taxa) ^ set(alignment.taxa))[0]
        raise InputError(f"the start tree and the alignment differ in taxon {extra!r}")
    position = np.array([alignment.taxa.index(name) for name in tree.taxa])  # tree tip k -> alignment tip
    time = time_tree(tree.topology, np.asarray(tips)[position])
    if np.any(np.bincount(tree.topology.parent_array[:-1])[len(position):] != 2):
        raise InputError("the start tree must be binary (it has a polytomy)")
    tip_heights, internal = start_heights(tree, time)
    relabel = np.concatenate([position, np.arange(len(position), tree.topology.num_nodes)])  # old id -> new id
    old_parent = tree.topology.parent_array
    parents = np.full(len(old_parent), -1)
    parents[relabel] = np.where(old_parent >= 0, relabel[np.maximum(old_parent, 0)], -1)
    heights = np.empty(len(old_parent))
    heights[relabel] = np.concatenate([tip_heights, internal])
    return parents, heights


def _hyper_start(clock, tree_prior, rate, root, intervals, m) -> dict:
    start = {}
    if clock != "none":
        start["log_clock_rate"] = np.log(rate)
    if clock == "relaxed":
        start.update(log_rate_spread=np.log(0.1), rate_z=np.zeros(m))
    if tree_prior in ("coalescent", "exponential"):
        start["log_population_size"] = np.log(root / 2)
        if tree_prior == "exponential":
            start["growth_rate"] = 0.0  # BEAUti's start
    elif tree_prior == "yule":  # `sample`'s starts: log(n) / root, the rate whose expected root is near it
        start["log_birth_rate"] = np.log(np.log((m + 1) / 2) / root)
    elif tree_prior == "birth-death":
        start.update(log_net_diversification=np.log(np.log((m + 1) / 2) / root), logit_turnover=0.0)
    else:
        start.update(skygrid_first=np.log(root / 2), log_skygrid_precision=0.0, skygrid_steps=np.zeros(intervals - 1))
    return start


def column_names(clock, tree_prior, intervals, coordinates, dated: bool, precision_fixed: bool = False) -> list[str]:
    names = ["posterior", "likelihood", "prior", "rootHeight"] + (["age(root)"] if dated else []) + ["treeLength"]
    names += {"strict": ["clock.rate"], "relaxed": ["ucld.mean", "ucld.stdev"], "none": []}[clock]
    if tree_prior == "coalescent":
        names.append("popSize")
    elif tree_prior == "exponential":
        names += ["exponential.popSize", "exponential.growthRate"]
    elif tree_prior == "yule":
        names.append("yule.birthRate")
    elif tree_prior == "birth-death":
        names += ["birthDeath.BminusDRate", "birthDeath.DoverB"]
    else:
        names += [f"skygrid.logPopSize{k + 1}" for k in range(intervals)]
        names += [] if precision_fixed else ["skygrid.precision"]  # a fixed one is no column
    return names + parameter_names(coordinates)


def _rows(block, count, generation, settings, posterior: DatedPosterior, reference):
    """`[(generation, [per chain: (parents, heights, rates, values)])]` for the block's first `count` samples."""
    params = block.params
    named = jax.vmap(jax.vmap(posterior.coordinates.named_values))(params["model"]) if \
        jax.tree.leaves(params["model"]) else {}
    named = {k: np.asarray(v).reshape(v.shape[:2] + (-1,)) for k, v in named.items()}
    first = generation - (count - 1) * settings.sample_every
    out = []
    for i in range(count):
        chains = []
        for c in range(settings.chains):
            parents, heights, rates = block.parents[i, c], block.heights[i, c], block.rates[i, c]
            log_l, log_p = float(block.log_likelihood[i, c]), float(block.log_prior[i, c])
            durations = np.where(parents >= 0, heights[np.maximum(parents, 0)] - heights, 0.0)
            values = [log_l + log_p, log_l, log_p, heights.max()] + ([] if reference is None else
                                                                    [reference - heights.max()])
            values += [float(durations.sum())]
            values += _hyper_values(params, i, c, posterior)
            values += [x for _, v in sorted(named.items()) for x in v[i, c]]
            chains.append((parents, heights, rates, values))
        out.append((first + i * settings.sample_every, chains))
    return out


def _hyper_values(params, i, c, posterior: DatedPosterior) -> list[float]:
    pick = lambda name: np.asarray(params[name])[i, c]  # noqa: E731
    values = []
    if posterior.clock != "none":
        values.append(float(np.exp(pick("log_clock_rate"))))
    if posterior.clock == "relaxed":
        values.append(float(np.exp(pick("log_rate_spread"))))
    if posterior.tree_prior == "coalescent":
        values.append(float(np.exp(pick("log_population_size"))))
    elif posterior.tree_prior == "exponential":
        values += [float(np.exp(pick("log_population_size"))), float(pick("growth_rate"))]
    elif posterior.tree_prior == "yule":
        values.append(float(np.exp(pick("log_birth_rate"))))
    elif posterior.tree_prior == "birth-death":
        values += [float(np.exp(pick("log_net_diversification"))), float(1 / (1 + np.exp(-pick("logit_turnover"))))]
    else:
        fixed = dict(posterior.fixed)
        log_precision = fixed["log_skygrid_precision"] if fixed else pick("log_skygrid_precision")
        precision = np.exp(log_precision)
        steps = pick("skygrid_steps")
        sizes = pick("skygrid_first") + np.concatenate([[0.0], np.cumsum(steps)]) / np.sqrt(precision)
        values += [float(x) for x in sizes] + ([] if fixed else [float(precision)])
    return values


class _OutputFiles:
    """`chain{c}.log` (Tracer) and `chain{c}.trees` (NEXUS time trees), appended sample by sample."""

    def __init__(self, out, chains: int, taxa, names):
        self.out, self.runs, self.taxa, self.names = None if out is None else Path(out), chains, taxa, names

    def paths(self) -> list[Path]:
        if self.out is None:
            return []
        return [self.out / f"chain{c + 1}.{kind}" for c in range(self.runs) for kind in ("trees", "log")]

    def start(self) -> None:
        for path in self.paths():
            path.write_text(nexus_trees_header(self.taxa) if path.suffix == ".trees" else
                            "state\t" + "\t".join(self.names) + "\n")

    def write(self, generation, chains) -> None:
        if self.out is None:
            return
        for c, (parents, heights, rates, values) in enumerate(chains):
            with open(self.out / f"chain{c + 1}.trees", "a") as handle:
                handle.write(f"tree STATE_{generation} = [&R] {time_tree_newick(parents, heights, rates)};\n")
            with open(self.out / f"chain{c + 1}.log", "a") as handle:
                handle.write(f"{generation}\t" + "\t".join(f"{v:.10g}" for v in values) + "\n")

    def finish(self, result: DatedResult) -> None:
        if self.out is None:
            return
        for c in range(self.runs):
            with open(self.out / f"chain{c + 1}.trees", "a") as handle:
                handle.write("End;\n")
        (self.out / "mcc.tree").write_text(nexus_trees_header(self.taxa) +
                                           f"tree TREE1 = [&R] {result.mcc_tree()};\nEnd;\n")
        summary = {"generations": result.generations, "seconds": result.seconds, "acceptance": result.acceptance,
                   "swap_rates": result.swap_rates.tolist(),
                   "reference_year": result.reference, "burnin": result.burnin, "columns": result.summary()}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
