"""`mc3`: a Metropolis-coupled MCMC run over trees, from an alignment to MrBayes-style outputs.

Blocks of `MC3Settings.block` samples run on the device (`_kernel.run_block`);
between blocks the host converts the cold chains' samples to splits and
lines of the output files, computes ASDSF, reports progress, writes the
checkpoint, and reads stop requests. The checkpoint holds the whole device
state, the samples so far and the output files' lengths, so a resumed run
truncates the files to where the checkpoint was taken and continues: it ends
with the bytes of a run that never stopped.
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
from ...runtime import (
    NEVER, BlockRun, alignment_digest, block_size, from_numpy, place_batch, replicate, to_host, to_numpy,
)
from ..._errors import InputError
from ...tree import kernel_batch, phase_widths, random_topology_tree
from ...likelihood import PRECISIONS, max_step_width, place_data, search_data, search_lengths, search_template
from ...models import (
    Model, ModelCoordinates, PartitionedModel, describe_priors, model_record, parameter_names, resolve_model,
)
from ...io import nexus_trees_header
from ._kernel import MC3Settings, MOVES, Posterior, init, next_block, with_partials, without_partials
from ._summary import RunSamples, asdsf, consensus_newick, convergence, split_frequencies, tree_newick


@dataclass
class MC3Result:
    """What a run found: per-run samples, split frequencies, ASDSF, acceptance and swap rates."""

    taxa: tuple
    runs: list
    column_names: list
    settings: MC3Settings
    asdsf: float
    asdsf_trace: list  # (generation, ASDSF) after every block
    acceptance: dict  # move -> acceptance rate over all chains
    swap_rates: np.ndarray  # [runs, chains, chains]: accepted / tried, by heat index pair
    generations: int
    seconds: float

    def split_frequencies(self) -> dict:
        return split_frequencies(self.runs, self.settings.burnin)

    def consensus(self) -> str:
        return consensus_newick(self.runs, self.taxa, self.settings.burnin)

    def convergence(self) -> list[dict]:
        return convergence(self.runs, self.column_names, self.settings.burnin)


def mc3(
    alignment: Alignment,
    model,
    runs: int = 2,
    chains: int = 4,
    generations: int = 100_000,
    *,
    sample_every: int = 100,
    temperature: float = 0.1,
    stop_asdsf: float | None = None,
    seed: int = 0,
    priors: dict | None = None,
    precision: str = "float64",
    settings: MC3Settings | None = None,
    out=None,
    resume: bool = False,
    progress=None,
    stop=NEVER,
    prior_only: bool = False,
    mesh=None,
) -> MC3Result:
    """Metropolis-coupled MCMC over unrooted trees, branch lengths and model parameters (see `_mc3`).

    `runs` independent runs of `chains` chains each (one cold, the others
    heated with `beta_i = 1 / (1 + temperature i)`), `generations` per chain,
    the cold chains sampled every `sample_every`. With `stop_asdsf` the run
    ends at the first block where ASDSF (MrBayes's: 25% burn-in, splits of
    frequency >= 0.1) falls below it. `out` (a folder) receives
    `run{r}.trees`, `run{r}.log`, and at the end `splits.tsv`,
    `consensus.tree`, `map.tree` and `summary.json`, and `checkpoint.pkl` after
    every block (`resume=True` continues it). `progress(generation, cold log
    L per run, ASDSF)` is called after every block. `prior_only` drops the
    likelihood (a test of the moves: the samples must follow the prior).
    `mesh` (`jp.device_mesh`) spreads the chains over its `batch` axis and the
    patterns over `patterns`. When `batch` divides `runs` and the patterns are
    not split, each device runs its runs apart (`next_block`: no step waits for
    another device). The chains are the same as on one device, up to the order
    of sums: every draw is a chain's or a run's own.
    """
    settings = settings or MC3Settings(runs=runs, chains=chains, generations=generations, sample_every=sample_every,
                                       temperature=temperature, stop_asdsf=stop_asdsf)
    taxa = tuple(alignment.taxa)
    posterior, state, key = starting_state(alignment, model, settings, seed, priors, precision, prior_only, mesh)
    coordinates = posterior.coordinates
    names = ["LnL", "LnPr", "TL"] + _part_length_names(coordinates.template) + parameter_names(coordinates)
    record = {"alignment": alignment_digest(alignment), "model": model_record(model), "seed": seed, "precision": precision,
              "priors": describe_priors(priors), "prior_only": prior_only,
              "settings": {k: str(v) for k, v in asdict(settings).items()}}
    files = _OutputFiles(out, settings.runs, taxa, names)
    samples = [RunSamples() for _ in range(settings.runs)]
    trace: list = []
    run = BlockRun(None if out is None else Path(out) / "checkpoint.pkl", record, files.paths(), stop)
    if (saved := run.open(resume)) is not None:
        saved_state = place_batch(from_numpy(saved["state"], without_partials(state)), mesh)
        state, key, trace = with_partials(saved_state, posterior), saved["key"], saved["trace"]
        key = _placed_key(jnp.asarray(key), mesh)
        samples = [RunSamples.from_plain(plain) for plain in saved["samples"]]
    else:
        files.start()

    def payload():
        return {"state": to_numpy(without_partials(state)), "key": np.asarray(to_host(key)), "samples": [s.to_plain() for s in samples],
                "trace": trace}

    total = settings.generations // settings.sample_every
    program, tune = settings.program(), np.int32(settings.tune_generations)
    began = time.perf_counter()
    while len(samples[0].generations) < total and not _converged(trace, settings, len(samples[0].generations)):
        run.stop_point(payload, f"after {int(state.chains.generation)} generations")
        count = block_size(len(samples[0].generations), total, settings.block)
        state, key, block = next_block(state, key, posterior, program, np.int32(count), tune, mesh)
        block = to_host(block)  # under jax.distributed: every process reads all of it
        generation = int(state.chains.generation)
        _collect(block, count, generation, settings, coordinates, taxa, samples, files)
        trace.append((generation, asdsf(samples, settings.burnin, settings.min_split_frequency)))
        run.save(payload)
        if progress is not None:
            progress(trace[-1][0], [s.columns[-1][0] for s in samples], trace[-1][1])
    result = _result(state, samples, names, settings, trace, taxa, time.perf_counter() - began)
    if out is not None:
        files.finish(result)
    return result


def starting_state(alignment: Alignment, model, settings: MC3Settings, seed: int = 0, priors=None,
                   precision: str = "float64", prior_only: bool = False, mesh=None) -> tuple[Posterior, object, object]:
    """The posterior of `alignment` under `model`, every chain's first state (random topologies) and the
    run's random key."""
    taxa = tuple(alignment.taxa)
    if len(taxa) < 4:
        raise InputError(f"{alignment.source}: MC³ over unrooted trees needs at least 4 taxa, not {len(taxa)}")
    template, free = resolve_model(model, alignment)
    template = search_template(template)  # unlinked lengths travel with the chains, `[B, M, K]`
    if isinstance(template, Model):  # what stays fixed is computed once, not every generation
        template = template.with_fixed_parts(free)
    coordinates = ModelCoordinates(template, free)
    if mesh is not None:  # under jax.distributed an array must span the mesh to enter its computations
        coordinates, priors = replicate(coordinates, mesh), replicate(priors, mesh)
    b = settings.runs * settings.chains
    starts = kernel_batch([random_topology_tree(taxa, seed=seed * 7919 + k) for k in range(b)])
    data = place_data(search_data(alignment, starts, template), mesh)  # a partitioned model's parts side by side
    dtype = PRECISIONS[precision]
    widths = phase_widths(len(taxa), max_step_width(template, data, dtype, b, mesh))
    posterior = Posterior(data, coordinates, widths, dtype, len(taxa), priors, prior_only, settings.branch_rate,
                          settings.incremental)
    lengths = search_lengths(starts.branch_lengths, template)
    trees = place_batch((starts.parents, lengths), mesh)
    state = place_batch(init(trees, place_batch(_start_params(coordinates, b), mesh), posterior, settings.program()),
                        mesh)
    return posterior, state, _placed_key(jax.random.PRNGKey(seed), mesh)


@eqx.filter_jit
def _start_params(coordinates, b: int):
    """Every chain's starting model parameters, `[b, ...]` (one program, not one per operation)."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (b,) + x.shape), coordinates.start())


def _placed_key(key, mesh):
    """The run's key on every device of the mesh (under `jax.distributed` it must span the mesh)."""
    return key if mesh is None else replicate(key, mesh)


def _converged(trace, settings: MC3Settings, done: int) -> bool:
    """The stop rule, read once the runs have a block of samples (the first blocks are short, `block_size`:
    two runs' first few trees can agree by chance)."""
    return (settings.stop_asdsf is not None and bool(trace) and done >= settings.block
            and trace[-1][1] < settings.stop_asdsf)


def _part_length_names(model) -> list[str]:
    """Unlinked lengths: every part's tree length is logged too (`TL` is that of their site-weighted mean)."""
    if isinstance(model, PartitionedModel) and model.link == "unlinked":
        return [f"TL.{name}" for name in model.names]
    return []


def _collect(block, count, generation, settings, coordinates, taxa, samples, files) -> None:
    """The block's first `count` samples of every run's cold chain, to the host lists and the output files.
    Unlinked lengths `[.., M, K]`: the trees carry their site-weighted mean, and every part's length is logged."""
    parents, lengths = np.asarray(block.parents), np.asarray(block.lengths)
    part_lengths = lengths if lengths.ndim == 4 else None  # [block, runs, M, K]
    if part_lengths is not None:
        lengths = np.average(part_lengths, axis=-1, weights=coordinates.template.site_counts)
    log_l, log_prior = np.asarray(block.log_likelihood), np.asarray(block.log_prior)
    named = _named_values(coordinates, block.params) if jax.tree.leaves(block.params) else {}
    named = {k: np.asarray(v).reshape(v.shape[:2] + (-1,)) for k, v in named.items()}
    first = generation - (count - 1) * settings.sample_every  # generations are 1-based at the sample
    for i in range(count):
        g = first + i * settings.sample_every
        for r, run in enumerate(samples):
            free = parents[i, r] >= 0
            values = [log_l[i, r], log_prior[i, r], lengths[i, r][free].sum()]
            values += [] if part_lengths is None else list(part_lengths[i, r][free].sum(0))
            values += [x for _, v in sorted(named.items()) for x in v[i, r]]
            run.add(g, parents[i, r], lengths[i, r], taxa, values)
            files.write_sample(r, g, parents[i, r], lengths[i, r], values)


@eqx.filter_jit
def _named_values(coordinates, params):
    """The model parameters of a block's samples `[block, runs, ...]` by name, constrained: one program."""
    return jax.vmap(jax.vmap(coordinates.named_values))(params)


def _result(state, samples, names, settings, trace, taxa, seconds) -> MC3Result:
    # Without the kept partials: gathered from every process they were 2.8 GB per process on four GPUs
    # (carnivores, 8 chains per GPU: 88 MB a chain), a second of a 3-second run (issue #41).
    state = to_host(without_partials(state))
    proposed, accepted = state.chains.proposed.sum(0), state.chains.accepted.sum(0)
    acceptance = {m: float(a / p) for m, p, a in zip(MOVES, proposed, accepted) if p > 0}
    tried = np.asarray(state.swaps_tried)
    swap_rates = np.asarray(state.swaps_accepted) / np.maximum(tried, 1)
    return MC3Result(taxa, samples, names, settings, trace[-1][1] if trace else float("nan"), trace, acceptance,
                     swap_rates, int(state.chains.generation), seconds)


class _OutputFiles:
    """`run{r}.trees` (NEXUS, translate block) and `run{r}.log` (Tracer), appended sample by sample."""

    prefix = "run"

    def __init__(self, out, runs: int, taxa, names):
        self.out, self.runs, self.taxa, self.names = None if out is None else Path(out), runs, taxa, names

    def paths(self) -> list[Path]:
        if self.out is None:
            return []
        return [self.out / f"{self.prefix}{r + 1}.{kind}" for r in range(self.runs) for kind in ("trees", "log")]

    def start(self) -> None:
        for path in self.paths():
            header = nexus_trees_header(self.taxa) if path.suffix == ".trees" else "Gen\t" + "\t".join(self.names) + "\n"
            path.write_text(header)

    def write_sample(self, run, generation, parent, lengths, values) -> None:
        if self.out is None:
            return
        with open(self.out / f"run{run + 1}.trees", "a") as handle:
            handle.write(f"\ttree gen.{generation} = [&U] {tree_newick(parent, lengths, self.taxa)}\n")
        with open(self.out / f"run{run + 1}.log", "a") as handle:
            handle.write(f"{generation}\t" + "\t".join(f"{v:.10g}" for v in values) + "\n")

    def finish(self, result: MC3Result) -> None:
        for r in range(self.runs):
            with open(self.out / f"run{r + 1}.trees", "a") as handle:
                handle.write("End;\n")
        frequencies = result.split_frequencies()
        with open(self.out / "splits.tsv", "w") as handle:
            handle.write("split\t" + "\t".join(f"run{r + 1}" for r in range(self.runs)) + "\tmean\tsd\n")
            for split, f in sorted(frequencies.items(), key=lambda item: (-np.mean(item[1]), sorted(item[0]))):
                sd = np.std(f, ddof=1) if len(f) > 1 else float("nan")
                handle.write(",".join(sorted(split)) + "\t" + "\t".join(f"{x:.4f}" for x in f) +
                             f"\t{np.mean(f):.4f}\t{sd:.4f}\n")
        (self.out / "consensus.tree").write_text(result.consensus() + "\n")
        (self.out / "map.tree").write_text(_map_tree(result) + "\n")
        summary = {"asdsf": result.asdsf, "generations": result.generations, "acceptance": result.acceptance,
                   "swap_rates": result.swap_rates.tolist(), "convergence": result.convergence(),
                   "asdsf_trace": result.asdsf_trace}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def _map_tree(result: MC3Result) -> str:
    """The sampled tree (after burn-in, any run) of highest log posterior, in Newick with taxon names."""
    best = None
    for run in result.runs:
        for k in range(len(run.columns))[run.kept(result.settings.burnin)]:
            value = run.columns[k][0] + run.columns[k][1]
            if best is None or value > best[0]:
                best = (value, run, k)
    _, run, k = best
    return _splits_newick(run.splits[k], run.tip_lengths[k], result.taxa)


def _splits_newick(splits: dict, tips, taxa) -> str:
    """A tree given by its splits (each with its edge length) and terminal lengths."""
    one = RunSamples(splits=[splits], tip_lengths=[np.asarray(tips)])
    return consensus_newick([one], taxa, 0.0, min_frequency=0.5, labels=False)
