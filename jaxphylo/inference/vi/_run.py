"""`vi`: a variational run, from an alignment to its outputs, in resumable blocks (`runtime.BlockRun`).

Blocks of `VISettings.block` Adam steps run on the device (`_fit.run_block`);
between blocks the host appends the trace, writes the checkpoint (the whole
fitting state: both networks, Adam's moments, the key, the step, and the trace
so far) and reads stop requests. A resumed run cuts `trace.tsv` back to the
checkpoint and continues: it ends with the bytes of a run that never stopped.

At the end (`estimate`, a key of its own) fresh particles from q give the
importance-sampled `log p(y)` per repeat and the ELBO, and their trees the
split frequencies and majority-rule consensus of q (`inference.mc3`'s
summaries) and the trees written to `samples.trees`.

The model's parameters are fixed at the values its string gives (its defaults
where it names none: JC69 has none; `+F` takes the alignment's frequencies);
only q is learned.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

from ..._errors import InputError
from ...data import Alignment, distances
from ...io import nexus_trees_header
from ...likelihood import PRECISIONS, max_step_width, search_data
from ...models import PartitionedModel, model_record, parse_model
from ...runtime import NEVER, BlockRun, alignment_digest, from_numpy, to_numpy
from ...tree import kernel_batch, phase_widths, random_topology_tree
from ..mc3 import RunSamples, consensus_newick, split_frequencies, tree_newick
from ._fit import VISettings, estimate, initial_fit_state, member, run_block, select
from ._objective import Target

TRACE_COLUMNS = ("step", "beta", "bound_K", "elbo")


@dataclass
class VIResult:
    """What a run found: the trace, the estimates from q and its trees' splits."""

    taxa: tuple
    settings: VISettings
    q: object  # the fitted `Variational`
    trace: np.ndarray  # [steps, 4]: step, beta, K-sample bound, mean log w (the last two at beta = 1)
    log_ml: np.ndarray  # [repeats] importance-sampled log p(y), `importance` particles each
    elbo: np.ndarray  # [repeats]
    samples: RunSamples  # every estimating particle's tree (column: log w)
    steps: int  # steps trained
    seconds: float  # training in this session
    kept_step: int = 0  # the step of the kept q: the end of the block where a member's mean bound was highest

    def split_frequencies(self) -> dict:
        """`{split: frequency under q}` (over the `repeats x importance` trees drawn from q)."""
        return {split: float(f[0]) for split, f in split_frequencies([self.samples], 0.0).items()}

    def consensus(self) -> str:
        return consensus_newick([self.samples], self.taxa, 0.0)

    def summary(self) -> dict:
        return {"log_ml_mean": float(np.mean(self.log_ml)), "log_ml_sd": _sd(self.log_ml),
                "log_ml": self.log_ml.tolist(), "elbo_mean": float(np.mean(self.elbo)), "elbo_sd": _sd(self.elbo),
                "steps": self.steps, "kept_step": self.kept_step, "particles_per_estimate": self.settings.importance,
                "repeats": self.settings.repeats}


def _sd(x) -> float:
    return float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")


def target_of(alignment: Alignment, model, settings: VISettings, precision: str = "float64") -> Target:
    """The benchmark's posterior of `alignment`: the fixed model, Exponential(branch_rate) edges, uniform trees."""
    taxa = tuple(alignment.taxa)
    if len(taxa) < 4:
        raise InputError(f"{alignment.source}: vi over unrooted trees needs at least 4 taxa, not {len(taxa)}")
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    fixed = parse_model(model, alignment=alignment) if isinstance(model, str) else model
    if isinstance(fixed, PartitionedModel):
        raise InputError("vi takes one substitution model, not a partitioned one")
    data = search_data(alignment, kernel_batch([random_topology_tree(taxa, seed=0)]), fixed)
    dtype = PRECISIONS[precision]
    batch = max(settings.particles, settings.eval_batch)
    widths = phase_widths(len(taxa), max_step_width(fixed, data, dtype, batch))
    return Target(data, fixed, widths, dtype, len(taxa), settings.branch_rate)


def program_settings(settings: VISettings) -> VISettings:
    """The settings with what does not shape the training program set aside (a static argument: runs that
    differ only in length or estimates share one compilation)."""
    return replace(settings, steps=1, anneal=0, repeats=1, importance=1, tree_samples=1, selections=1)


def vi(
    alignment: Alignment,
    model,
    settings: VISettings | None = None,
    *,
    seed: int = 0,
    precision: str = "float64",
    out=None,
    resume: bool = False,
    progress=None,
    stop=NEVER,
) -> VIResult:
    """Fit q(tree, lengths) to the posterior of `alignment` under `model` (see the package), then estimate.

    `out` (a folder) receives `trace.tsv` (appended every block) and
    `checkpoint.pkl`, and at the end `summary.json` (log ML mean and sd over
    repeats, ELBO), `splits.tsv`, `consensus.tree`, `samples.trees` (NEXUS,
    `tree_samples` trees from q) and `trace.png`. `progress(step, bound, elbo)`
    is called after every block.

    The q estimated from is the last block's member of highest mean `K`-sample bound, unless an earlier block
    had a member whose mean bound was higher by more than one step's spread (the sd of that last member's
    bounds over its block): then that member as it was at the end of that block. One step can throw a q out of
    its mode for good (DS1, 16,000 steps on an H200: the best member's bound fell from -7,113 to -7,212 at
    step 5,576 and the population never came back), and a run should not return less than it had found; a
    difference within the noise keeps the last q (the block means' maximum is biased towards noisy winners).
    """
    settings = settings or VISettings()
    taxa = tuple(alignment.taxa)
    target = target_of(alignment, model, settings, precision)
    state = initial_fit_state(len(taxa), settings, seed, distances(alignment, saturated=5.0))
    arrays, static = eqx.partition(state, eqx.is_array)
    record = {"alignment": alignment_digest(alignment), "model": model_record(model), "seed": seed,
              "precision": precision, "settings": {k: str(v) for k, v in asdict(settings).items()}}
    folder = None if out is None else Path(out)
    trace_path = None if folder is None else folder / "trace.tsv"
    run = BlockRun(None if folder is None else folder / "checkpoint.pkl", record,
                   [] if folder is None else [trace_path], stop)
    trace: list = []
    scores = np.zeros(settings.population)  # every member's mean K-sample bound over the last block
    spread = np.zeros(settings.population)  # and their sd over it
    kept = (-np.inf, None)  # (the highest block score so far, that member's arrays): the q a run returns
    if (saved := run.open(resume)) is not None:
        state = eqx.combine(from_numpy(saved["state"], arrays), static)
        trace = [tuple(row) for row in saved["trace"]]
        scores, spread = saved["scores"], saved.get("spread", spread)  # (checkpoints before the kept q had none)
        if saved.get("kept") is not None:
            kept = (saved["kept_score"], from_numpy(saved["kept"], arrays))  # a member: the population's structure
    elif trace_path is not None:
        trace_path.write_text("\t".join(TRACE_COLUMNS) + "\n")

    def payload():
        return {"state": to_numpy(eqx.filter(state, eqx.is_array)), "trace": np.asarray(trace), "scores": scores,
                "spread": spread, "kept_score": kept[0], "kept": None if kept[1] is None else to_numpy(kept[1])}

    program = program_settings(settings)
    selection_steps = {settings.steps * i // 10 for i in range(1, settings.selections + 1)} \
        if settings.population > 1 else set()
    began = time.perf_counter()
    while (first := int(state.step[0])) < settings.steps:
        run.stop_point(payload, f"after {first} steps")
        count = min(settings.block, settings.steps - first)
        state, rows = run_block(state, target, program, np.int32(count), np.int32(settings.steps),
                                np.int32(settings.anneal))
        rows = np.asarray(rows)[:, :count]  # [P, count, 3]
        scores, spread = rows[:, :, 1].mean(1), rows[:, :, 1].std(1)
        top = _top(scores)
        if scores[top] > kept[0]:
            kept = (float(scores[top]), eqx.filter(member(state, top), eqx.is_array))
        best = np.argmax(rows[:, :, 1], 0)  # the trace follows, step by step, the member with the highest bound
        rows = [(first + i + 1,) + tuple(float(x) for x in rows[best[i], i]) for i in range(count)]
        trace.extend(rows)
        if trace_path is not None:
            with open(trace_path, "a") as handle:
                handle.writelines("\t".join(f"{x:.10g}" for x in row) + "\n" for row in rows)
        if any(first < step <= first + count for step in selection_steps):
            state, source = select(state, scores)
            scores, spread = scores[source], spread[source]
        run.save(payload)
        if progress is not None:
            progress(trace[-1][0], trace[-1][2], trace[-1][3])
    seconds = time.perf_counter() - began
    top = _top(scores)
    lost = kept[1] is not None and kept[0] - scores[top] > spread[top]
    fitted = eqx.combine(kept[1], static) if lost else member(state, top)
    log_ml, elbo, parents, lengths, log_w = estimate(fitted.q, target, settings,
                                                     jax.random.fold_in(jax.random.PRNGKey(seed), 1 << 20))
    samples = RunSamples()
    for k in range(len(log_w)):
        samples.add(k + 1, parents[k], lengths[k], taxa, [log_w[k]])
    result = VIResult(taxa, settings, fitted.q, np.asarray(trace, float).reshape(-1, len(TRACE_COLUMNS)), log_ml,
                      elbo, samples, int(state.step[0]), seconds, int(fitted.step))
    if folder is not None:
        _write_outputs(folder, result, parents, lengths)
    return result


def _top(scores) -> int:
    """The member of highest block score; a diverged one (NaN or infinite bound) never."""
    return int(np.argmax(np.where(np.isfinite(scores), scores, -np.inf)))


def _write_outputs(folder: Path, result: VIResult, parents, lengths) -> None:
    (folder / "summary.json").write_text(json.dumps(result.summary(), indent=1) + "\n")
    with open(folder / "splits.tsv", "w") as handle:
        handle.write("split\tfrequency\n")
        ranked = sorted(result.split_frequencies().items(), key=lambda item: (-item[1], sorted(item[0])))
        handle.writelines(",".join(sorted(split)) + f"\t{f:.4f}\n" for split, f in ranked)
    (folder / "consensus.tree").write_text(result.consensus() + "\n")
    with open(folder / "samples.trees", "w") as handle:
        handle.write(nexus_trees_header(result.taxa))
        handle.writelines(f"\ttree q.{k + 1} = [&U] {tree_newick(parents[k], lengths[k], result.taxa)}\n"
                          for k in range(min(result.settings.tree_samples, len(parents))))
        handle.write("End;\n")
    plot_trace(result.trace, folder / "trace.png")


def plot_trace(trace: np.ndarray, path: Path) -> None:
    """The K-sample bound and the ELBO estimate against the step (moving averages over 1% of the run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    window = max(1, len(trace) // 100)
    smooth = lambda x: np.convolve(x, np.ones(window) / window, mode="valid")
    if len(trace):
        steps = trace[window - 1:, 0]
        axis.plot(steps, smooth(trace[:, 2]), label=f"K-sample bound (mean of {window})")
        axis.plot(steps, smooth(trace[:, 3]), label=f"ELBO estimate (mean of {window})")
        tail = trace[len(trace) // 2:, 2:]
        low, high = np.nanpercentile(tail, 1), np.nanmax(tail)
        axis.set_ylim(low - 0.1 * (high - low + 1), high + 0.1 * (high - low + 1))
    axis.set_xlabel("step")
    axis.set_ylabel("nats")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)
