"""Branch support: non-parametric bootstrap and SH-aLRT, counted on the splits of `jaxphylo.tree`.

A split is the set of taxa on one side of an internal branch, written as the
side without the alphabetically first taxon (so each split of an unrooted tree
has one form, whatever order a tree lists its taxa in).

SH-aLRT (Guindon et al. 2010): for an internal branch with log-likelihood
`L0` on the ML tree and `L1`, `L2` after its two NNIs (central branch
re-fitted), `delta = 2 (L0 - max(L1, L2))`. RELL replicates resample the
per-site log-likelihoods of the three trees; centred (`c_i = L_i* - L_i`),
each gives `delta* = 2 (largest c - second largest c)`, and the support is the
percentage of replicates with `delta > delta*` (PhyML's and IQ-TREE's SH-like test).

The bootstrap resamples alignment columns (a partitioned alignment's within
each part, as IQ-TREE does; RELL too): a replicate is a vector of pattern
counts, so all replicates run as one batch of trees (one weight row each)
through the same NNI climbing as the search, each from the BIONJ tree of its
own columns, under the ML model. Support = percentage of replicate trees
that contain the split.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._errors import InputError
from ..data import Alignment, distances
from ..runtime import NEVER, BlockRun, alignment_digest, is_local, on_devices, place_batch
from ..tree import Topology, Tree, TreeBatch, bionj, fixed_branches, kernel_batch, kernel_splits, phase_widths, splits
from ..likelihood import (
    PRECISIONS, max_step_width, place_data, search_data, search_lengths, search_template,
)
from ..models import PartitionedModel, part_alignments
from ._fit import MLResult, searched_result
from ._climb import Climb, SearchSettings
from ._lengths import Problem, fitted_tree_problem, optimise_lengths
from ._nni import nni_scores
from ._ufboot import rell_counts

BOOTSTRAP_BATCH = 100  # replicates climbed together (fixed, so that results do not depend on interruptions)


def sh_alrt(alignment: Alignment, result: MLResult, replicates: int = 1000, seed: int = 0,
            precision: str = "float64") -> dict[frozenset, float]:
    """SH-aLRT support (percent) of every internal branch of the ML tree, by split."""

    batch, lengths, problem = fitted_tree_problem(alignment, result.tree, result.model, PRECISIONS[precision])
    data = problem.data
    scores = jax.jit(nni_scores, static_argnums=(5, 6, 7))(batch.parents, lengths, problem.model, data,
                                                           problem.weights, problem.widths, problem.dtype, True)
    valid = np.asarray(scores.valid[0])
    nodes = np.asarray(scores.nodes[0, :, 0])
    per = np.asarray(scores.pattern_gains[0])  # [K, 2, P]: L1 - L0, L2 - L0 per pattern
    weights = np.asarray(data.weights)
    rng = np.random.default_rng(seed)
    counts = rell_counts(weights, getattr(data, "part_of_pattern", None), replicates, rng)  # [R, P]
    # Centred RELL values relative to L0: c0 = 0 - 0, c_i = (sum_R (L_i - L0)) - (sum_obs (L_i - L0)).
    observed = per @ weights  # [K, 2]
    resampled = np.einsum("kjp,rp->rkj", per, counts)
    centred = np.concatenate([np.zeros(resampled.shape[:2] + (1,)), resampled - observed[None]], axis=2)
    top2 = np.sort(centred, axis=2)[:, :, -2:]
    delta_star = 2 * (top2[..., 1] - top2[..., 0])
    delta = 2 * (0.0 - observed.max(axis=1))  # 2 (L0 - max(L1, L2))
    support = 100.0 * np.mean(delta[None] > delta_star, axis=0)
    support = np.where(delta < 0, 0.0, support)  # an NNI that beats the ML tree: no support
    kernel = kernel_splits(np.asarray(batch.parents[0]), batch.taxa)
    return {kernel[v]: float(support[k]) for k, v in enumerate(nodes) if valid[k] and kernel[v] is not None}


class Resampling:
    """A replicate is a draw of sites, each part's from its own sites (IQ-TREE's rule for partitions).

    Sites are numbered across the parts (model units: codons for a codon
    part); `pattern[s]` is site `s`'s pattern on the search's pattern axis and
    `characters[s]` its alignment characters (columns) for the replicate's
    BIONJ start. An unpartitioned alignment is one part, in model units.
    """

    def __init__(self, alignment: Alignment, model, data):
        self.alignment = alignment
        if not isinstance(model, PartitionedModel):
            patterns = alignment.site_patterns()
            self.pattern, self.num_patterns = patterns.site_pattern, patterns.num_patterns
            self.characters, self.parts = None, None
            return
        parts = part_alignments(alignment, model)
        columns = model.scheme.sites(len(alignment.sequences[0]))
        slot = {k: (offset, j, g.weights.shape[1]) for offset, g in zip(data.group_offsets(), data.groups)
                for j, k in enumerate(g.parts)}
        patterns, characters, self.parts = [], [], []
        for k, part in enumerate(parts):
            offset, j, width = slot[k]
            patterns.append(offset + j * width + np.asarray(part.site_patterns().site_pattern))
            characters += list(np.asarray(columns[k]).reshape(part.num_sites, -1))
            self.parts.append(part.num_sites)
        self.pattern, self.characters = np.concatenate(patterns), characters
        self.num_patterns = int(data.weights.shape[0])

    def draw(self, replicates: int, seed: int) -> np.ndarray:
        """`[R, sites]` site indices, in the numbering above."""
        rng = np.random.default_rng(seed)
        if self.parts is None:
            return rng.integers(0, self.alignment.num_sites, size=(replicates, self.alignment.num_sites))
        starts = np.cumsum([0] + self.parts[:-1])
        return np.concatenate([start + rng.integers(0, n, size=(replicates, n)) for start, n in zip(starts, self.parts)],
                              axis=1)

    def counts(self, rows: np.ndarray) -> np.ndarray:
        return np.stack([np.bincount(self.pattern[row], minlength=self.num_patterns) for row in rows])

    def start_distances(self, row: np.ndarray) -> np.ndarray:
        """The replicate's distances for its BIONJ start (saturated pairs at 5). One alignment's columns (not a
        partitioned model's parts, not codons) are weighted by how often the replicate drew them: the
        resampled alignment's distances, without building it (that took three quarters of the host's time
        per replicate, which no second GPU shares)."""
        if self.characters is None and self.alignment.alphabet.symbol_width == 1:
            weights = np.bincount(row, minlength=self.alignment.num_sites)
            return distances(self.alignment, saturated=5.0, site_weights=weights)
        return distances(self.alignment_of(row), saturated=5.0)

    def alignment_of(self, row: np.ndarray) -> Alignment:
        if self.characters is None:
            return _resampled(self.alignment, row)
        columns = np.concatenate([self.characters[s] for s in row])
        raw = np.array([np.frombuffer(s.encode("ascii", "replace"), np.uint8) for s in self.alignment.sequences])
        sequences = tuple(r.tobytes().decode("ascii") for r in raw[:, columns])
        return Alignment(self.alignment.taxa, sequences, self.alignment.alphabet, self.alignment.source)


def _resampled(alignment: Alignment, columns: np.ndarray) -> Alignment:
    """The alignment made of `columns` (model units: codons for codon data), in that order."""
    width = alignment.alphabet.symbol_width
    cells = np.array([np.frombuffer(s.encode("ascii", "replace"), f"S{width}") for s in alignment.sequences])
    sequences = tuple(b"".join(row).decode("ascii") for row in cells[:, columns])
    return Alignment(alignment.taxa, sequences, alignment.alphabet, alignment.source)


def bootstrap(alignment: Alignment, result: MLResult, replicates: int = 100, seed: int = 0, settings=None,
              precision: str = "float64", progress=None, checkpoint=None, stop=NEVER, mesh=None,
              batch: int = BOOTSTRAP_BATCH) -> tuple[dict[frozenset, float], list[Tree]]:
    """Bootstrap support (percent) of every split of the ML tree, and the replicate trees.

    Replicates run `batch` at a time (`BOOTSTRAP_BATCH`), each batch in one computation:
    every replicate its own pattern weights, its own BIONJ start, NNI climbing
    with branch lengths re-fitted under the ML model. With `checkpoint` (a
    path) the finished batches are saved, and a saved file for the same
    inputs is continued; `stop` is read before every NNI round (then the
    finished batches and the climb in progress are saved, and `Interrupted`).
    The batches are fixed by `replicates` and `batch`, so an interrupted and
    resumed bootstrap gives the trees an uninterrupted one gives. A replicate's climb does not depend on
    the others in its batch, so `batch` changes the memory and the time, not the trees, up to rounding
    (tested on the CPU; on DS1 on a GPU, one replicate of 1,000 in one batch ended elsewhere than in
    batches of 100, a support 0.2 apart). On a GPU 1,000 replicates fit in one batch (`benchmarks/bootstrap.py`). `mesh`
    spreads the replicates over its `batch` axis and the patterns over
    `patterns`, as in `search`.
    """

    settings = settings or SearchSettings()
    if mesh is not None and not is_local(mesh):
        result = _from_process_zero(result)
    if batch < 1:
        raise InputError(f"the bootstrap batch must hold at least one replicate, got {batch}")
    resampling = Resampling(alignment, result.model, search_data(alignment, kernel_batch([result.tree]), result.model))
    columns = resampling.draw(replicates, seed)
    record = {"alignment": alignment_digest(alignment),
              "tree": [list(result.tree.topology.parent), np.asarray(result.tree.branch_lengths).tolist()],
              "model": [np.asarray(x).tolist() for x in jax.tree.leaves(result.model)],
              "replicates": replicates, "seed": seed, "precision": precision, "batch": batch,
              "settings": {k: str(v) for k, v in asdict(settings).items()}}
    run = BlockRun(checkpoint, record, stop=stop)
    saved = run.open(None) or {"done": [], "climb": None}  # a saved bootstrap for the same inputs continues
    done, climb = saved["done"], saved["climb"]

    def payload():
        return {"done": done, "climb": None if climb is None else climb.state()}

    on_round = (lambda best: progress(best)) if progress else None
    for first in range(len(done), replicates, batch):
        rows = columns[first: first + batch]
        where = f"after {len(done)} of {replicates} replicates"
        run.stop_point(payload, where)
        if (devices := _share_devices(mesh, len(rows))) is not None:
            climb = _climb_in_shares(devices, resampling, result, rows, settings, precision, climb, stop, on_round)
        else:
            climb = Climb(**climb) if climb is not None else _replicate_starts(resampling, result, rows, settings,
                                                                               precision, mesh)
            problem = _replicate_problem(resampling, result, rows, settings, precision, mesh)
            while not climb.done and stop.reason is None:
                climb.step(lambda _: problem, settings, on_round)
        if not climb.done:
            run.stop_point(payload, where)  # a stop was requested: saves the climb and raises
        model = search_template(result.model)
        trees = [searched_result(p, l, tuple(alignment.taxa), model)[0] for p, l in zip(*climb.batch[:2])]
        done, climb = done + [(list(t.topology.parent), np.asarray(t.branch_lengths)) for t in trees], None
        run.save(payload)
    trees = [Tree(lengths, Topology(tuple(parent), tuple(alignment.taxa), rooted=False)) for parent, lengths in done]
    found = [set(splits(t)) for t in trees]
    supports = {split: 100.0 * np.mean([split in f for f in found]) for split in splits(result.tree)}
    return supports, trees


def _from_process_zero(result: MLResult) -> MLResult:
    """Process 0's tree and model in every process (`jax.distributed`): each process ran the search on its own
    devices, and GPU reductions need not round alike in every run, so the replicates, climbed apart in each
    process, all start from the tree and model that process 0 writes."""
    from jax.experimental import multihost_utils

    arrays, static = eqx.partition(result.model, eqx.is_array)
    parent, lengths, arrays = multihost_utils.broadcast_one_to_all(
        (np.asarray(result.tree.topology.parent), np.asarray(result.tree.branch_lengths), arrays))
    topology = result.tree.topology
    tree = Tree(np.asarray(lengths), Topology(tuple(int(p) for p in parent), topology.taxa, rooted=topology.rooted))
    return replace(result, tree=tree, model=eqx.combine(jax.tree.map(jnp.asarray, arrays), static))


def _share_devices(mesh, replicates: int):
    """The devices that climb a batch's replicates in shares, one share each (`_climb_in_shares`): those of a
    mesh of this process's devices whose patterns are not split; under `jax.distributed`, every device of
    every process (a share keeps its patterns whole: one program over devices of several processes would
    hand each process arrays it cannot read); None otherwise (the batch is one climb)."""
    if mesh is not None and not is_local(mesh):
        return list(mesh.devices.ravel())
    if mesh is None or mesh.shape["patterns"] > 1 or mesh.shape["batch"] < 2 or replicates < 2:
        return None
    return list(mesh.devices[:, 0])


def _climb_in_shares(devices, resampling: Resampling, result, rows, settings, precision, saved, stop, on_round):
    """The batch's climbs, one share of its replicates per device, each run by its own thread: `Climb`, done
    unless `stop` interrupted it (then its state is every share's trees, in the replicates' order).

    Split over a mesh instead, the replicates would climb in lock step: every NNI round and every optimiser
    loop as long as the slowest replicate's anywhere, each iteration waiting for every device (weak scaling
    0.50 on 2 GPUs, issue #41). A replicate's climb depends on its own columns alone (each tree is fitted
    by its own optimiser, and a round keeps a tree unless its own move gains), so shares give the trees that
    one batch gives. A thread per device keeps each GPU fed while the others wait for theirs. Under
    `jax.distributed` each process climbs its own devices' shares, apart from the others (threads in one
    process share its interpreter: on four GPUs their host work queued), and the trees are exchanged once.
    """
    shares = np.array_split(np.arange(len(rows)), len(devices))  # a share may be empty: fewer rows than devices
    start = None if saved is None else Climb(**saved).batch

    def climb_share(part):
        if start is None:
            climb = _replicate_starts(resampling, result, rows[part], settings, precision)
        else:
            climb = Climb(*(np.asarray(x)[part] for x in start), spr=False)
        problem = _replicate_problem(resampling, result, rows[part], settings, precision)
        while not climb.done and stop.reason is None:
            climb.step(lambda _: problem, settings, on_round)
        return climb

    mine = [k for k, (device, part) in enumerate(zip(devices, shares))
            if len(part) and device.process_index == jax.process_index()]
    climbs = on_devices(climb_share, [devices[k] for k in mine], [shares[k] for k in mine]) if mine else []
    if len(mine) == sum(len(part) > 0 for part in shares):  # every share was this process's
        batch, done = [np.concatenate([np.asarray(c.batch[i]) for c in climbs]) for i in range(3)], \
            all(c.done for c in climbs)
    else:
        batch, done = _joined(climbs, [shares[k] for k in mine], devices, shares, result, precision, len(rows))
    whole = Climb(*batch, spr=False)
    if done:
        whole.phase = "done"
    return whole


def _joined(climbs, parts, devices, shares, result, precision, size: int):
    """Every process's climbs of one batch `(parents, lengths, log L)` in the replicates' order, and whether
    all are done: one `process_allgather` of arrays laid out as the whole batch (each process fills its
    own rows, and the others' are read from their owners)."""
    from jax.experimental import multihost_utils

    one = kernel_batch([result.tree])  # the shapes of a climb's rows
    parents, lengths = one.parents, search_lengths(one.branch_lengths, search_template(result.model))
    dtype = PRECISIONS[precision]
    batch = [np.zeros((size,) + parents.shape[1:], np.int32), np.zeros((size,) + lengths.shape[1:], dtype),
             np.zeros(size, dtype)]
    for climb, part in zip(climbs, parts):
        for whole, values in zip(batch, climb.batch):
            whole[part] = np.asarray(values)
    done = np.asarray(all(c.done for c in climbs))
    gathered, done = multihost_utils.process_allgather((batch, done))  # [processes, ...]
    owner = np.zeros(size, int)
    for device, part in zip(devices, shares):
        owner[part] = device.process_index
    rows = np.arange(size)
    return [np.asarray(g)[owner, rows] for g in gathered], bool(np.all(done))


def _replicate_problem(resampling: Resampling, result, columns, settings, precision, mesh=None):
    """The search problem of one batch of resampled site sets: one row of pattern counts per replicate."""

    alignment = resampling.alignment
    counts = resampling.counts(columns)
    model = search_template(result.model)
    data = search_data(alignment, TreeBatch(None, None, tuple(alignment.taxa)), model)  # alignment's order
    data = place_data(data, mesh)
    counts = np.pad(counts, ((0, 0), (0, data.weights.shape[0] - counts.shape[1])))  # the mesh's padding: weight 0
    dtype = PRECISIONS[precision]
    widths = phase_widths(len(alignment.taxa), max_step_width(model, data, dtype, 2 * len(columns), mesh))
    return Problem(model, data, place_batch(jnp.asarray(counts, dtype), mesh), widths, dtype,
                   settings.lengths_method, mesh)


def _replicate_starts(resampling: Resampling, result, columns, settings, precision, mesh=None):
    """Each replicate's BIONJ tree with branch lengths fitted to its columns, as a climb (NNIs only) to run."""

    alignment, starts = resampling.alignment, []
    for row in columns:
        tree = bionj(resampling.start_distances(row), alignment.taxa)
        starts.append(tree.with_branch_lengths(np.clip(np.asarray(tree.branch_lengths, float), 1e-3, 1.0)))
    batch = kernel_batch(starts)
    problem = _replicate_problem(resampling, result, columns, settings, precision, mesh)
    parents = place_batch(batch.parents, mesh)
    lengths = place_batch(search_lengths(batch.branch_lengths, problem.model), mesh)
    lengths, log_l = optimise_lengths(parents, lengths, fixed_branches(parents), problem)
    return Climb(parents, lengths, log_l, spr=False)
