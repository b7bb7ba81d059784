"""Running NUTS in short chunks, saved as they go, so an interrupted run loses nothing.

A run directory holds `run.json` (what was asked: compared on resume),
`checkpoint.pkl` and `blocks/block_NNNNN.npz` (`block` draws of every chain).
The sampler advances every chain together by a few iterations per device
call (a chunk, sized to take about `CHUNK_SECONDS`) and, between chunks,
reads the stop flag (`jaxphylo.runtime._checkpoint.StopRequests`: SIGTERM, SIGINT,
SIGUSR1, `--max-time`). On a stop, in warmup or after it, the checkpoint
takes the full NUTS state (position, step size, mass matrix and the
adaptation's running windows, random key) and the draws of the unfinished
block, and `Interrupted` is raised. The checkpoint is also written at every
block's end and at least every `SAVE_EVERY` seconds.

The chunk length is an argument of one compiled loop, so iterations are the
same computation however a run is cut: a run stopped and resumed any number
of times writes the same bytes as one that never stopped (same seed, same
devices and chain method).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions import Unit
from numpyro.infer import NUTS, init_to_value

from ...runtime import (
    NEVER, BlockRun, CheckpointError, atomic_write, compare_settings, peak_memory_text, reset_peak_resident, write_npz,
)
from ..._errors import InputError

EXTRA_FIELDS = ("diverging", "num_steps", "accept_prob")
CHUNK_MAX = 64  # iterations per device call at most (the draw buffer's length)
CHUNK_SECONDS = 2.0  # target time of one chunk: how soon a stop request is answered
SAVE_EVERY = 600.0  # seconds between checkpoints inside a block (what a SIGKILL could lose)


@dataclass
class Draws:
    """All saved draws: `samples[name]` and `stats[name]` shaped `[chains, draws, ...]`."""

    samples: dict
    stats: dict

    @property
    def num_draws(self) -> int:
        return next(iter(self.stats.values())).shape[1] if self.stats else 0


CPU_CHAINS = 4
# On a GPU, vectorized chains are nearly free until their partials fill the device. Measured on an H200
# (benchmarks/results/nuts-sweep-h200.json, HKY+G4 value and gradient of B chains at once): at 2^25 cells in all,
# one call took at most 1.8x the 4-chain call (primates 12 x 413 patterns, 64 chains: 1.54 ms against 0.84; DS1
# 27 x 934, 32 chains: 2.62 against 1.50), while carnivores (62 x 5,565: 2^23.4 cells a chain) grew in proportion
# from 8 chains on. NUTS's minimum ESS per second rose with it: 239, 774 and 1,724 with 4, 16 and 64 chains on primates.
GPU_CELLS = 2**25
GPU_CHAINS = (4, 64)  # at least as many as on a CPU; at most 64, where the outputs start to weigh


def default_chains(cells: int, backend: str | None = None) -> int:
    """How many NUTS chains to run when the user does not say: 4 on a CPU (one per core, `parallel`); on a GPU the
    largest power of two whose partials (`cells` per chain, `likelihood.partials_cells`) total at most
    `GPU_CELLS`, within `GPU_CHAINS`, all vectorized in one program."""
    if (backend or jax.default_backend()) == "cpu":
        return CPU_CHAINS
    low, high = GPU_CHAINS
    fits = 2 ** int(np.floor(np.log2(max(GPU_CELLS // max(cells, 1), 1))))
    return int(np.clip(fits, low, high))


def chain_method(chains: int) -> str:
    """`parallel` (one device per chain, `pmap`) when there are enough devices on a CPU, else `vectorized` (`vmap`)."""
    if jax.default_backend() == "cpu" and jax.local_device_count() >= chains > 1:
        return "parallel"
    return "vectorized"


def _check_run_directory(out: Path, settings: dict, resume: bool) -> bool:
    """Whether `out` holds a checkpoint to resume; a clear error when it holds something else."""
    record = out / "run.json"
    if not record.exists():
        if resume and out.exists() and any(out.iterdir()):
            raise InputError(f"{out}: nothing to resume (no run.json)")
        out.mkdir(parents=True, exist_ok=True)
        (out / "blocks").mkdir(exist_ok=True)
        record.write_text(json.dumps(settings, indent=2, sort_keys=True))
        return False
    if not resume:
        raise InputError(f"{out} already holds a run; continue it with --resume or choose another --out")
    try:
        saved = json.loads(record.read_text())
    except json.JSONDecodeError:
        raise CheckpointError(f"{record}: damaged run record") from None
    compare_settings(str(out), saved, settings, ignore=("samples",))
    if saved.get("samples") != settings.get("samples"):
        record.write_text(json.dumps(settings, indent=2, sort_keys=True))
    return (out / "checkpoint.pkl").exists()


class ChainStepper:
    """Every chain's NUTS transitions as two compiled functions: `init(keys, data)` and
    `advance(state, n, data) -> (state, draws [CHUNK_MAX, chains, ...])` (the first `n` rows are filled).

    The data are arguments, never constants of the program (XLA would fold them).
    """

    def __init__(self, kernel: NUTS, warmup: int, method: str):
        self.kernel, self.method = kernel, method

        def init(key, data):
            return kernel.init(key, warmup, None, (data,), {})

        def advance(state, n, data):
            def record(s):
                return (s.z,) + tuple(getattr(s, f) for f in EXTRA_FIELDS)

            empty = jax.tree.map(lambda x: jnp.zeros((CHUNK_MAX,) + jnp.shape(x), jnp.result_type(x)), record(state))

            def body(i, carry):
                s, buffer = carry
                s = kernel.sample(s, (data,), {})
                return s, jax.tree.map(lambda b, x: b.at[i].set(x), buffer, record(s))

            return jax.lax.fori_loop(0, n, body, (state, empty))

        if method == "parallel":
            self._init = jax.pmap(init, in_axes=(0, None))
            self._advance = jax.pmap(advance, in_axes=(0, None, None))
        else:
            self._init = jax.jit(jax.vmap(init, in_axes=(0, None)))
            self._advance = jax.jit(jax.vmap(advance, in_axes=(0, None, None)))

        # Unconstrained positions to the sites' values and the deterministic sites.
        self.constrain = jax.jit(lambda z, data: jax.vmap(kernel.postprocess_fn((data,), {}))(z))

    def init(self, keys, data):
        return self._init(keys, data)

    def compile_chunk(self, keys, data):
        """The chunk program compiled on shapes alone (for its memory): nothing is run or allocated."""
        shapes = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree)
        state = jax.eval_shape(self._init, keys, shapes(data))
        return self._advance.lower(state, jax.ShapeDtypeStruct((), jnp.int32), shapes(data)).compile()

    def advance(self, state, n: int, data):
        """`n` more iterations of every chain; draws as host arrays `[chains, n, ...]`."""
        state, (z, *stats) = self._advance(state, jnp.asarray(n, jnp.int32), data)
        host = jax.device_get((z, stats))
        rows = lambda x: np.asarray(x)[:, :n]  # [chains, CHUNK_MAX, ...] -> [chains, n, ...]
        return state, jax.tree.map(rows, host[0]), {f: rows(v) for f, v in zip(EXTRA_FIELDS, host[1])}


def run_nuts(model, data, init: dict, out, *, settings: dict, chains: int = 4, warmup: int = 500,
             samples: int = 1000, block: int = 100, seed: int = 0, resume: bool = False,
             progress: bool = True, method: str | None = None, log=print, stop=NEVER, check_start=None) -> Draws:
    """NUTS on `model(data)`, `chains` chains, saved in blocks of `block` draws under `out`.

    `settings` describes the run (data, analysis, sampler options); a resumed
    run must match it except for `samples`, which may grow. `stop` (a
    `StopRequests`) is read between chunks: when it fires the run saves and
    raises `Interrupted`. A start whose log density or gradient is not finite
    is an error: `check_start()`, if given, raises the one that names the cause.
    Later non-finite proposals are divergent transitions: rejected (the chain
    stays where it was) and counted in the `diverging` statistic.
    """
    out = Path(out)
    method = method if method in ("parallel", "vectorized") else chain_method(chains)
    settings = json.loads(json.dumps(dict(settings, chains=chains, warmup=warmup, block=block, seed=seed,
                                          samples=samples, chain_method=method)))  # as it reads back
    resuming = _check_run_directory(out, settings, resume)
    run = BlockRun(out / "checkpoint.pkl", {k: v for k, v in settings.items() if k != "samples"}, stop=stop)
    total = -(-samples // block)
    saved = run.open(resuming)  # a checkpoint of other settings is refused before anything compiles
    stepper = _stepper(model, init, warmup, method)
    state = stepper.init(jax.random.split(jax.random.PRNGKey(seed), chains), data)
    if not (np.all(np.isfinite(np.asarray(state.potential_energy)))
            and all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(state.z_grad))):
        if check_start is not None:
            check_start()  # names the parameter, branch or pattern
        raise InputError("the log posterior or its gradient is not finite at the starting values")
    position, pending = 0, None
    if saved is not None:
        state = jax.tree.unflatten(jax.tree.structure(state), saved["state"])
        position, pending = saved["position"], saved["pending"]
        log(f"# resuming {out}: {max(position - warmup, 0)} of {total * block} draws per chain done")
    else:
        log(f"# warmup: {chains} chains x {warmup} iterations ({method})")
    bar = _progress_bar(progress, warmup + total * block, position)
    last_save, chunk = time.monotonic(), 1

    def payload():
        return {"position": position, "state": [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))],
                "pending": pending}

    try:
        while position < warmup + total * block:
            run.stop_point(payload, f"after {position} iterations")
            boundary = warmup if position < warmup else warmup + block * ((position - warmup) // block + 1)
            n = min(chunk, boundary - position)
            began = time.monotonic()
            state, z, stats = stepper.advance(state, n, data)
            if chunk == 1 and n == 1:
                reset_peak_resident()  # compilation's peak is not the run's
            chunk = _next_chunk(n, time.monotonic() - began)
            position += n
            if position > warmup:
                pending = _append(pending, (z, stats))
            bar(n)
            if position > warmup and (position - warmup) % block == 0:
                index = (position - warmup) // block - 1
                divergent = int(pending[1]["diverging"].sum())
                _write_block(out, index, stepper, data, model, *pending)
                pending = None
                run.save(payload)
                last_save = time.monotonic()
                log(f"# block {index + 1}/{total} saved: {block} draws x {chains} chains, {divergent} divergent; "
                    f"peak memory so far: {peak_memory_text()}")
            elif time.monotonic() - last_save > SAVE_EVERY:
                run.save(payload)
                last_save = time.monotonic()
    finally:
        bar(None)
    run.save(payload)  # the same bytes as the last block's save, or warmup's
    log(f"# peak memory while sampling: {peak_memory_text()}")
    return load_draws(out, total)


_LAST_STEPPER: list = []  # [(model, key), stepper]: one entry, so compiled programs do not pile up


def _stepper(model, init: dict, warmup: int, method: str) -> ChainStepper:
    """The compiled sampler of `model` from `init`; the last one is kept, so that running the same analysis
    again in one process (a resume, a notebook cell run twice, the dry run before a run) compiles nothing."""
    key = (model, warmup, method, tuple((k, np.asarray(v).tobytes()) for k, v in sorted(init.items())))
    if not _LAST_STEPPER or _LAST_STEPPER[0] != key:
        _LAST_STEPPER[:] = [key, ChainStepper(NUTS(model, init_strategy=init_to_value(values=init)), warmup, method)]
    return _LAST_STEPPER[1]


def chunk_program(model, data, init: dict, chains: int, warmup: int, method: str | None = None):
    """`(name, compile)` for `jaxphylo.likelihood.plan`: the memory of the sampler's own chunk program."""
    method = method if method in ("parallel", "vectorized") else chain_method(chains)
    stepper = _stepper(model, init, warmup, method)
    keys = jax.random.split(jax.random.PRNGKey(0), chains)
    return f"NUTS chunk of {chains} chain{'s' * (chains > 1)} ({method})", lambda: stepper.compile_chunk(keys, data)


def _next_chunk(n: int, seconds: float) -> int:
    """Iterations for the next call: about CHUNK_SECONDS' worth at the last call's pace, doubling at most."""
    pace = seconds / n
    return int(np.clip(CHUNK_SECONDS / max(pace, 1e-9), 1, min(2 * n, CHUNK_MAX)))


def _append(pending, chunk):
    if pending is None:
        return chunk
    join = lambda a, b: np.concatenate([a, b], axis=1)
    return jax.tree.map(join, pending[0], chunk[0]), {k: join(pending[1][k], chunk[1][k]) for k in pending[1]}


def _write_block(out: Path, index: int, stepper: ChainStepper, data, model, z, stats) -> None:
    chains, num = next(iter(jax.tree.leaves(z))).shape[:2]
    flat = jax.tree.map(lambda x: x.reshape((chains * num,) + x.shape[2:]), z)
    draws = {k: np.asarray(v).reshape((chains, num) + v.shape[1:]) for k, v in stepper.constrain(flat, data).items()}
    stats = dict(stats, **_log_densities(model, data, draws))
    atomic_write(out / "blocks" / f"block_{index:05d}.npz",
                 lambda h: write_npz(h, {**{f"sample:{k}": v for k, v in draws.items()},
                                         **{f"stat:{k}": v for k, v in stats.items()}}))


def _progress_bar(enabled: bool, total: int, done: int):
    """`update(n)` advances a tqdm bar (stderr); `update(None)` closes it."""
    if not enabled:
        return lambda n: None
    from tqdm.auto import tqdm

    bar = tqdm(total=total, initial=done, unit="it", file=sys.stderr, dynamic_ncols=True)
    return lambda n: bar.close() if n is None else bar.update(n)


def _log_densities(model, data, draws: dict) -> dict:
    """Log posterior (constrained space), log-likelihood and log prior of every draw, in one model pass."""
    chains, num = next(iter(draws.values())).shape[:2]
    flat = {k: v.reshape((chains * num,) + v.shape[2:]) for k, v in draws.items()}

    def split(draw):
        trace = handlers.trace(handlers.substitute(model, draw)).get_trace(data)
        likelihood = prior = 0.0
        for site in trace.values():
            if site["type"] != "sample":
                continue
            term = jnp.sum(site["fn"].log_prob(site["value"]))
            factor = isinstance(site["fn"], Unit)  # numpyro.factor: our 1/x priors
            if site["is_observed"] and not factor:
                likelihood = likelihood + term
            else:
                prior = prior + term
        return likelihood, prior

    likelihood, prior = jax.vmap(split)(flat)
    shaped = lambda x: np.asarray(x).reshape(chains, num)
    return {"posterior": shaped(likelihood + prior), "likelihood": shaped(likelihood), "prior": shaped(prior)}


def load_draws(out, blocks: int | None = None) -> Draws:
    """The draws of the first `blocks` saved blocks of a run directory (all by default)."""
    files = sorted((Path(out) / "blocks").glob("block_*.npz"))[:blocks]
    if not files:
        raise InputError(f"{out}: no saved draws")
    parts = [dict(np.load(f)) for f in files]
    joined = {k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]}
    return Draws({k[7:]: v for k, v in joined.items() if k.startswith("sample:")},
                 {k[5:]: v for k, v in joined.items() if k.startswith("stat:")})


def progress_printer(stream=sys.stderr):
    return lambda message: print(message, file=stream, flush=True)
