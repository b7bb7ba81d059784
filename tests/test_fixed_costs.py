"""The fixed costs of a run: the persistent compilation cache (where it is, how to move or stop it, that a changed
version misses rather than breaks), and programs that are neither traced nor compiled twice."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

import jaxphylo as jp
from jaxphylo.cli import main
from jaxphylo.runtime import (
    DEFAULT_MAX_BYTES, cache_dir, cache_info, clear_cache, default_cache_dir, host_tag, max_cache_bytes, trim_cache,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_default_folder_follows_the_platform_and_the_variable_moves_or_stops_it(monkeypatch, tmp_path):
    monkeypatch.delenv("JAXPHYLO_CACHE_DIR", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "jaxphylo" / "xla" == cache_dir()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "jaxphylo" / "xla"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert default_cache_dir() == tmp_path / "home" / "Library" / "Caches" / "jaxphylo" / "xla"
    monkeypatch.setenv("JAXPHYLO_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"
    for off in ("off", "OFF", "0", "none"):
        monkeypatch.setenv("JAXPHYLO_CACHE_DIR", off)
        assert cache_dir() is None
    assert max_cache_bytes() == DEFAULT_MAX_BYTES
    monkeypatch.setenv("JAXPHYLO_CACHE_MAX_SIZE", "500M")
    assert max_cache_bytes() == 500 * 2**20
    monkeypatch.setenv("JAXPHYLO_CACHE_MAX_SIZE", "lots")
    with pytest.raises(jp.InputError, match="JAXPHYLO_CACHE_MAX_SIZE"):
        max_cache_bytes()


def test_the_suite_never_writes_the_users_cache_folder():
    in_use = jax.config.jax_compilation_cache_dir
    home_default = Path(os.path.expanduser("~")) / ".cache" / "jaxphylo"
    assert in_use is None or not Path(in_use).resolve().is_relative_to(home_default.resolve())


# One program compiled in a fresh process: prints its value and what the persistent cache did (JSON). With an
# argument, the jaxlib version that the cache key hashes is changed first, as after an upgrade.
PROGRAM = """
import json, sys
import jax
if len(sys.argv) > 1:
    from jax._src import cache_key  # the version string JAX hashes into every entry's key
    cache_key.jaxlib_version_str = sys.argv[1]
import jaxphylo
counts = {"hits": 0, "misses": 0}
def listen(event, **kwargs):
    for name in counts:
        if event == f"/jax/compilation_cache/cache_{name}":
            counts[name] += 1
jax.monitoring.register_event_listener(listen)
value = float(jax.jit(lambda x: (jax.numpy.sin(x) * 3.0).sum())(jax.numpy.arange(5.0)))
print(json.dumps({"value": value, "folder": jax.config.jax_compilation_cache_dir, **counts}))
"""


def _fresh(env: dict, *argv: str) -> dict:
    """Run PROGRAM in a fresh process with `env` (and no JAX cache setting unless `env` has one)."""
    inherited = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", PROGRAM, *argv], capture_output=True, text=True, timeout=300,
                          env={**inherited, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_jaxphylo_caches_programs_and_a_changed_version_misses_rather_than_breaks(tmp_path):
    folder = tmp_path / "cache"
    env = {"JAXPHYLO_CACHE_DIR": str(folder)}
    first = _fresh(env)
    assert first["folder"] == str(folder / host_tag()) and first["misses"] >= 1 and first["hits"] == 0
    written = cache_info(folder).entries
    assert written >= 1  # even a program that compiles in milliseconds is kept
    again = _fresh(env)
    assert again["hits"] >= 1 and again["misses"] == 0 and again["value"] == first["value"]
    upgraded = _fresh(env, "0.0.0-another-version")
    assert upgraded["hits"] == 0 and upgraded["misses"] >= 1 and upgraded["value"] == first["value"]
    assert cache_info(folder).entries > written  # kept beside the other version's, not over it
    # An entry cut short (a disk filled, a process killed mid-write) is compiled again, with a warning at most.
    for entry in folder.glob("*/*-cache"):
        entry.write_bytes(entry.read_bytes()[:20])
    assert _fresh(env)["value"] == first["value"]


def test_off_and_a_cache_configured_in_jax_are_respected(tmp_path):
    off = _fresh({"JAXPHYLO_CACHE_DIR": "off"})
    assert off["folder"] is None and off["hits"] == off["misses"] == 0
    mine = tmp_path / "mine"
    theirs = _fresh({"JAXPHYLO_CACHE_DIR": str(tmp_path / "jaxphylo"), "JAX_COMPILATION_CACHE_DIR": str(mine)})
    assert theirs["folder"] == str(mine) and not (tmp_path / "jaxphylo").exists()


def test_cache_info_and_clear(monkeypatch, tmp_path, capsys):
    folder = tmp_path / "cache"
    folder.mkdir()
    for k in range(3):  # one entry at the top, two in a processor kind's subfolder
        where = folder if k == 0 else folder / host_tag()
        where.mkdir(exist_ok=True)
        (where / f"jit_f-{k}-cache").write_bytes(b"x" * 1000)
    (folder / "notes.txt").write_text("not ours")
    monkeypatch.setenv("JAXPHYLO_CACHE_DIR", str(folder))
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(folder) in out and "3 compiled programs" in out
    assert trim_cache(folder, 2500) == 1 and cache_info(folder).entries == 2
    assert main(["cache", "clear"]) == 0
    assert "removed 2" in capsys.readouterr().out
    assert cache_info(folder).entries == 0 and (folder / "notes.txt").exists()
    monkeypatch.setenv("JAXPHYLO_CACHE_DIR", "off")
    assert main(["cache", "info"]) == 0 and "off" in capsys.readouterr().out
    assert clear_cache(tmp_path / "absent") == 0


class Programs:
    """Counts what JAX does while inside: traces (jaxprs built) and compilations (XLA or persistent-cache loads)."""

    def __enter__(self):
        self.traced, self.compiled = [], []
        self._listener = self._listen
        jax.monitoring.register_event_time_span_listener(self._listener)
        return self

    def _listen(self, event, start, end, fun_name=None, **kwargs):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            self.traced.append(fun_name)
        elif event == "/jax/core/compile/backend_compile_duration":
            self.compiled.append(fun_name)

    def __exit__(self, *exc):
        from jax._src import monitoring  # jax.monitoring has no public way to remove one listener

        monitoring.unregister_event_time_span_listener(self._listener)


def _simulated(prefix: str, sites: int, seed: int, missing: float):
    model = jp.parse_model("GTR+G4{0.7}")
    tree = jp.random_topology_tree([f"{prefix}{k}" for k in range(10)], seed=seed)
    return jp.simulate(tree, model, sites, seed=seed, missing=missing), tree, model


def test_pattern_buckets_pad_with_columns_that_add_nothing():
    from jaxphylo.likelihood import bucket_patterns, pattern_bucket, pattern_data

    assert [pattern_bucket(n) for n in (1, 16, 17, 300, 320, 321, 413, 934, 1024, 1025)] == \
        [16, 16, 20, 320, 320, 384, 448, 1024, 1024, 1280]
    assert all(n <= pattern_bucket(n) <= max(16, 1.25 * n) for n in range(1, 5000))
    alignment, tree, model = _simulated("t", 150, 3, 0.1)
    plain = pattern_data(alignment, tree)
    padded = bucket_patterns(plain)
    patterns = alignment.site_patterns().num_patterns
    assert padded.tip_codes.shape[1] == pattern_bucket(patterns) > patterns
    assert padded.tip_table.shape[0] == 8 and float(padded.weights[patterns:].sum()) == 0
    per_pattern = jp.pattern_log_likelihoods(alignment, tree, model)
    assert per_pattern.shape == (patterns,)  # per-site outputs drop the padding
    from jaxphylo.likelihood import data_log_likelihood

    # The padding changes nothing: the same value as unpadded data, to rounding in the order of the sum.
    unpadded = float(data_log_likelihood(plain, tree, model))
    assert float(jp.log_likelihood(alignment, tree, model)) == pytest.approx(unpadded, rel=1e-13)
    assert float((alignment.site_patterns().weights * per_pattern).sum()) == pytest.approx(unpadded, rel=1e-13)
    marginals = jp.ancestral_marginals(alignment, tree, model)
    assert marginals.shape == (tree.num_tips - 1, alignment.num_sites, 4)
    first, _ = jp.branch_length_derivatives(alignment, tree, model)
    numeric = jax.grad(lambda b: data_log_likelihood(plain, tree.with_branch_lengths(b), model))(tree.branch_lengths)
    assert jax.numpy.allclose(first, numeric, rtol=1e-10, atol=1e-8)


def test_a_second_alignment_of_the_same_size_class_compiles_nothing():
    first, tree_1, model = _simulated("a", 320, 1, 0.05)
    second, tree_2, _ = _simulated("b", 300, 2, 0.1)  # other taxa, another topology, another pattern count
    counts = [x.site_patterns().num_patterns for x in (first, second)]
    from jaxphylo.likelihood import pattern_bucket

    assert counts[0] != counts[1] and pattern_bucket(counts[0]) == pattern_bucket(counts[1])
    jp.log_likelihood(first, tree_1, model).block_until_ready()
    with Programs() as programs:
        value = float(jp.log_likelihood(second, tree_2, model))
    assert programs.compiled == [] and programs.traced == [] and value < 0


def test_a_second_identical_call_traces_nothing(tmp_path, capsys):
    alignment, tree, model = _simulated("c", 200, 4, 0.0)
    jp.log_likelihood(alignment, tree, model).block_until_ready()
    with Programs() as programs:
        jp.log_likelihood(alignment, tree, model).block_until_ready()
    assert programs.traced == [] and programs.compiled == []
    from conftest import write_fasta

    fasta = write_fasta(alignment, tmp_path / "a.fasta")
    newick = tmp_path / "t.nwk"
    jp.write_tree(tree, newick)
    argv = ["loglik", str(fasta), str(newick), "-m", "GTR+G4{0.7}"]
    assert main(argv) == 0
    with Programs() as programs:
        assert main(argv) == 0
    assert programs.traced == [] and programs.compiled == []
    printed = capsys.readouterr().out.split()
    assert printed[0] == printed[1]


def test_a_second_ml_search_in_one_process_traces_nothing(tmp_path):
    """`jaxphylo ml` run twice in one process (a notebook, a script over many genes): the second search builds
    no jaxpr and compiles nothing; no weak type or changing static argument retraces."""
    from conftest import write_fasta

    alignment, _, _ = _simulated("m", 300, 5, 0.0)
    argv = ["ml", str(write_fasta(alignment, tmp_path / "a.fasta")), "-m", "GTR+G4", "--seed", "1",
            "--patience", "2", "--starts", "4"]
    with Programs() as first:
        assert main(argv + ["--out", str(tmp_path / "one")]) == 0
    # The model is fitted with 1e-3 at the start and 1e-4 at the end: one program (none if an earlier test
    # compiled it), not one per tolerance.
    assert first.compiled.count("jit(_minimise)") <= 1, first.compiled
    with Programs() as programs:
        assert main(argv + ["--out", str(tmp_path / "two")]) == 0
    assert programs.traced == [] and programs.compiled == []
    assert (tmp_path / "one.treefile").read_text() == (tmp_path / "two.treefile").read_text()


def test_an_optimisers_tolerance_and_iterations_are_data_not_program():
    """`minimise` with another tolerance or iteration cap runs the program it compiled, and still obeys both."""
    from jaxphylo.ml import minimise

    def objective(x, centre):
        return jax.numpy.sum((x - centre) ** 4)

    x0, centre = jax.numpy.zeros(3), jax.numpy.asarray([1.0, -2.0, 0.5])
    minimise(objective, x0, (centre,), "lbfgs", 1e-3, 2000)
    with Programs() as programs:
        loose = minimise(objective, x0, (centre,), "lbfgs", 1e-1, 2000)
        tight = minimise(objective, x0, (centre,), "lbfgs", 1e-12, 2000)
        capped = minimise(objective, x0, (centre,), "lbfgs", 1e-12, 3)
    assert programs.traced == [] and programs.compiled == []
    assert int(capped[2]) == 3 and int(loose[2]) < int(tight[2]) <= 2000
    assert float(tight[1]) < float(loose[1]) and float(tight[1]) < 1e-6


def test_the_host_schedule_packs_and_runs_the_device_schedules_program():
    """One known tree's packed host schedule has the device (level) schedule's shapes, so the program compiled for
    one runs the other; it uses no more slots or steps, and gives the same log L and gradient (float64, to
    rounding: the same products summed in another order)."""
    import jax.numpy as jnp
    import numpy as np

    from jaxphylo.likelihood import pattern_data, schedule_pattern_log_likelihoods
    from jaxphylo.tree import binarize, branch_index, device_schedule, host_schedule, phase_widths, trim_slots

    model = jp.parse_model("HKY{2}+F{.3,.2,.2,.3}+G4{0.5}")
    for n, max_width in ((5, None), (27, None), (27, 2), (200, 16), (200, 64)):
        tree = jp.random_topology_tree([f"t{k}" for k in range(n)], seed=n)
        parent = np.asarray(binarize(tree.topology)[0])
        widths = phase_widths(n, max_width)
        host = host_schedule(parent, widths)
        device = jax.device_get(device_schedule(jnp.asarray(parent[None]), widths))
        for name in ("children", "layout", "steps", "offsets", "root_row"):
            a, d = getattr(host, name), getattr(device, name)
            assert a.shape == d.shape and a.dtype == d.dtype, (n, name)
        assert trim_slots(host).num_slots <= trim_slots(device).num_slots
        assert host.steps.sum() <= device.steps.sum()
        alignment = jp.simulate(tree, model, 60, seed=0)
        data, index = pattern_data(alignment, tree), branch_index(tree.topology)
        run = jax.jit(jax.value_and_grad(lambda lengths, schedule: jnp.sum(data.weights * schedule_pattern_log_likelihoods(
            model, lengths, data, schedule, index, jnp.float64))))
        (value, grad), (expected, expected_grad) = run(tree.branch_lengths, host), run(tree.branch_lengths, device)
        assert run._cache_size() == 1, "both schedules run one program"
        assert float(value) == pytest.approx(float(expected), rel=1e-13)
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-10, atol=1e-12)
    # 1,000 random taxa at width 64: the levels pad to 1,340 slots in 36 steps, the packed steps to about 1,040 in 24.
    tree = jp.random_topology_tree([f"t{k}" for k in range(1000)], seed=0)
    packed = trim_slots(host_schedule(np.asarray(binarize(tree.topology)[0]), phase_widths(1000, 64)))
    assert packed.num_slots <= 1060 and packed.steps.sum() <= 26


def test_a_packed_schedules_one_step_phases_copy_no_partials(monkeypatch):
    """The XLA passes (a GPU's) on a packed schedule, whose tail is phases of one step each, need about the
    level schedule's temporaries per partials buffer. Run outside a loop, such a step made XLA copy whole
    partials buffers (300 taxa x 1,000 patterns, width 32: 4.44 buffers of temporaries against the level
    schedule's 3.71; 1,000 x 1,000,000 on four H200s: 121 GiB per GPU against 65.4), so those phases keep
    their count as data (3.85 here). The bound, 0.4 buffers, is half the copy."""
    import jax.numpy as jnp
    import numpy as np

    from jaxphylo.likelihood import PatternData, kernels, schedule_pattern_log_likelihoods
    from jaxphylo.likelihood.kernels import exact_steps
    from jaxphylo.tree import binarize, branch_index, device_schedule, host_schedule, phase_widths, trim_slots

    monkeypatch.setattr(kernels.cpu, "available", lambda: False)
    jax.clear_caches()  # the kernel choice is made when tracing
    taxa, patterns = 300, 1000
    tree = jp.random_topology_tree([f"t{k}" for k in range(taxa)], seed=0, mean_branch_length=0.05)
    model = jp.parse_model("HKY{2}+F{.3,.2,.2,.3}+G4{0.5}")
    rng = np.random.default_rng(0)
    codes = np.vstack([rng.integers(0, 4, (taxa, patterns)), np.full((1, patterns), 4)]).astype(np.int32)
    data = PatternData(jnp.asarray(codes), jnp.asarray(np.vstack([np.eye(4), np.ones((1, 4))])),
                       jnp.asarray(rng.integers(1, 4, patterns).astype(float)))
    index, parent, widths = branch_index(tree.topology), np.asarray(binarize(tree.topology)[0]), phase_widths(taxa, 32)
    packed = trim_slots(host_schedule(parent, widths))
    level = trim_slots(jax.device_get(device_schedule(jnp.asarray(parent[None]), widths)))
    assert 1 in exact_steps(packed)
    try:
        per_buffer = {}
        for name, schedule in (("packed", packed), ("level", level)):
            run = jax.jit(jax.value_and_grad(lambda lengths: jnp.sum(data.weights * schedule_pattern_log_likelihoods(
                model, lengths, data, schedule, index, jnp.float64, exact_steps(schedule)))))
            buffer = (schedule.num_slots + 1) * 4 * patterns * 4 * 8  # one [rows, C, P, S] float64 partials buffer
            per_buffer[name] = run.lower(tree.branch_lengths).compile().memory_analysis().temp_size_in_bytes / buffer
    finally:
        jax.clear_caches()  # later tests get the C++ kernel again
    assert per_buffer["packed"] <= per_buffer["level"] + 0.4, per_buffer


@pytest.mark.parametrize("name, on_gpu", [("primates_mtDNA", 64), ("DS1", 32), ("carnivores", 4)])
def test_nuts_chains_fill_a_gpu_by_the_alignments_size(name, on_gpu):
    """`sample`'s NUTS chains when none are asked for: 4 on a CPU; on a GPU the power of two whose partials total at
    most `GPU_CELLS`, 4 to 64. On the H200 a value and gradient of 64 chains of primates (12 x 413) took 1.8x one of 4
    chains, 32 of DS1's (27 x 934) 1.75x; carnivores (62 x 5,565) grew in proportion from 8 chains on."""
    from conftest import dataset

    from jaxphylo.inference.nuts import GPU_CHAINS, default_chains
    from jaxphylo.likelihood import partials_cells, pattern_data

    alignment = jp.read_alignment(dataset(name) / "alignment.fasta")
    tree = jp.bionj(jp.distances(alignment, "k2p", saturated=5.0), alignment.taxa)
    cells = partials_cells(pattern_data(alignment, tree), tree, jp.parse_model("HKY+G4"))
    assert default_chains(cells, "gpu") == on_gpu and default_chains(cells, "cpu") == 4
    counts = [default_chains(2**k, "gpu") for k in range(10, 30)]
    assert counts == sorted(counts, reverse=True) and set(counts) <= {4, 8, 16, 32, 64}
    assert (min(counts), max(counts)) == GPU_CHAINS
