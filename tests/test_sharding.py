"""The likelihood sharded over a device mesh (issue #20) equals the unsharded one.

JAX reads XLA_FLAGS once, at start-up, so the runs on 4 forced CPU devices and
the two-process `jax.distributed` run happen in subprocesses
(tests/_sharded_check.py); these tests assert on the JSON line they print.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxphylo as jp
from jaxphylo import cli
from jaxphylo.runtime import MIN_PATTERNS_PER_DEVICE, default_mesh_shape

HELPER = Path(__file__).with_name("_sharded_check.py")
TOLERANCE = 1e-10


def _environment(devices: int, xla_flags: str = "") -> dict:
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", ""))
    return dict(os.environ, XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={devices} {xla_flags}".strip(),
                JAX_PLATFORMS="cpu")


def _result(stdout: str) -> dict:
    """The helper's JSON line (gloo prints its own lines to stdout too)."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result in the helper's output:\n{stdout}"
    return json.loads(lines[-1])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cpu_collectives_reason() -> str | None:
    """Why this JAX build cannot run collectives across CPU processes, or None."""
    import jax

    if "jax_cpu_collectives_implementation" not in jax.config.values:
        return f"JAX {jax.__version__} has no jax_cpu_collectives_implementation option"
    try:
        from jax._src.lib import _jax
    except ImportError:
        return "jaxlib's extension module is not importable"
    if not hasattr(_jax, "make_gloo_tcp_collectives"):
        return f"jaxlib {jax.__version__} was built without gloo CPU collectives"
    return None


class _Helpers:
    """The helper processes, all started at once (they mostly compile: overlapping them saves wall time)."""

    def __init__(self, folder: Path):
        self.folder, self.processes = folder, {}

    def start(self, name: str, arguments: list[str], devices: int, xla_flags: str = "", **environment) -> None:
        with open(self.folder / f"{name}.out", "w") as out, open(self.folder / f"{name}.err", "w") as err:
            command = [sys.executable, str(HELPER), *arguments]
            self.processes[name] = subprocess.Popen(command, env=dict(_environment(devices, xla_flags), **environment),
                                                    stdout=out, stderr=err, text=True)

    def start_command(self, name: str, command: list[str], devices: int, **environment) -> None:
        """Any command (a `jaxphylo` CLI process), with more environment variables."""
        with open(self.folder / f"{name}.out", "w") as out, open(self.folder / f"{name}.err", "w") as err:
            self.processes[name] = subprocess.Popen(command, env=dict(_environment(devices), **environment),
                                                    stdout=out, stderr=err, text=True)

    def finish_command(self, name: str, timeout: float = 600) -> tuple[int, str, str]:
        self.processes[name].wait(timeout=timeout)
        return (self.processes[name].returncode, (self.folder / f"{name}.out").read_text(),
                (self.folder / f"{name}.err").read_text())

    def finish(self, name: str, timeout: float = 240) -> dict:
        process = self.processes[name]
        process.wait(timeout=timeout)
        stderr = (self.folder / f"{name}.err").read_text()
        assert process.returncode == 0, stderr[-3000:]
        return _result((self.folder / f"{name}.out").read_text())

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


MCMC = ["mcmc", "--model", "HKY", "--runs", "2", "--chains", "2", "--generations", "200", "--sample-every", "50",
        "--block", "2", "--seed", "1"]
ML = ["ml", "-m", "HKY", "--fast", "-b", "4", "--seed", "1"]


@pytest.fixture(scope="module")
def helpers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded")
    launched = _Helpers(folder)
    launched.start("meshes", ["meshes"], 4)
    alignment = jp.simulate(jp.random_topology_tree([f"t{i}" for i in range(8)], seed=3, mean_branch_length=0.1),
                            jp.parse_model("HKY{3}+G4{0.5}"), 201, seed=2)
    (folder / "aln.fasta").write_text("".join(f">{t}\n{x}\n" for t, x in zip(alignment.taxa, alignment.sequences)))
    launched.start("runs", ["runs", str(folder / "aln.fasta"), str(folder / "reference")], 4)
    # The XLA kernels, as on a GPU (the C++ kernel's custom call is never partitioned), every program compiled
    # afresh (a program read from the compilation cache is not dumped).
    launched.start("collectives", ["collectives", str(folder / "aln.fasta"), str(folder / "dump")], 4,
                   f"--xla_dump_to={folder / 'dump'}", JAXPHYLO_CPU_LIBRARY="none", JAXPHYLO_CACHE_DIR="off")
    if _cpu_collectives_reason() is None:
        port, mcmc_port, ml_port = _free_port(), _free_port(), _free_port()
        cli = [sys.executable, "-m", "jaxphylo.cli"]
        launched.start_command("ml_one", [*cli, *ML, str(folder / "aln.fasta"), "--out", str(folder / "ml_one")], 2,
                               PYTHONPATH=str(Path(__file__).parents[1]))
        for i in range(2):
            launched.start_command(f"ml{i}", [*cli, "--distributed", *ML, str(folder / "aln.fasta"), "--out",
                                              str(folder / "ml_two")], 2,
                                   JAXPHYLO_COORDINATOR=f"127.0.0.1:{ml_port}", JAXPHYLO_NUM_PROCESSES="2",
                                   JAXPHYLO_PROCESS_ID=str(i), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
                                   PYTHONPATH=str(Path(__file__).parents[1]))
            launched.start(f"process{i}", ["distributed", str(port), str(i)], 2)
            launched.start_command(f"mcmc{i}", [sys.executable, "-m", "jaxphylo.cli", "--distributed", *MCMC,
                                                str(folder / "aln.fasta"), "-o", str(folder / "distributed")], 2,
                                   JAXPHYLO_COORDINATOR=f"127.0.0.1:{mcmc_port}", JAXPHYLO_NUM_PROCESSES="2",
                                   JAXPHYLO_PROCESS_ID=str(i), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
                                   PYTHONPATH=str(Path(__file__).parents[1]))
    yield launched
    launched.stop()


def test_bootstrap_searches_mc3_and_nuts_on_meshes_equal_one_device(helpers):
    """Bootstrap replicates (each an NNI search with its lengths re-fitted; batch 2 x patterns 2, and in shares
    on 4 x 1, also stopped and resumed), MC³ with a run per device (4 x 1) and NUTS
    (`sample --mesh patterns=4`): the same trees, supports and draws as on one device. The sharded sums differ
    from the unsharded ones in the last bits; a search's decisions absorb that, while NUTS's trajectories
    amplify it (1e-13 becomes ~1e-6 in 30 iterations, and the chains part after ~100): its draws agree to
    1e-4. (MC³ on a mesh across processes: the two-process test below.)"""
    result = helpers.finish("runs", timeout=900)
    assert result["devices"] == 4
    assert result["bootstrap"]["supports_equal"] and result["bootstrap"]["rf"] == 0
    assert result["bootstrap"]["lengths"] <= 1e-6  # L-BFGS stops where the rounding of its steps leaves it
    shares = result["shares"]
    assert shares["supports_equal"] and shares["rf"] == 0
    # Shares re-fit their lengths in other batches: a stop of L-BFGS (0.01 log L in a window) one iteration
    # earlier or later moves a length by up to ~1e-4.
    assert shares["lengths"] <= 1e-3
    assert shares["stops"] == 3 and shares["resumed"]["supports_equal"] and shares["resumed"]["rf"] == 0
    assert shares["resumed"]["lengths"] <= 1e-3
    assert result["mc3"] <= 1e-9
    assert result["nuts"] <= 1e-4


def test_a_batch_split_over_devices_stays_split(helpers):
    """MC³ (a run per device) and bootstrap replicates (two per device) on a mesh of 4 x 1: the programs that
    start and run the chains (`init`, whose first partials are `full_partials`, and `run_block`), fit the replicates' lengths (`lbfgs_lengths`,
    `newton_lengths`) and score their NNIs (`_propose`) move no trees' data between devices: no all-gather,
    collective permute or all-to-all. Trees indexed by an index array over the batch made XLA gather every
    device's partials onto every device, so that each GPU computed the whole batch: bootstrap time grew with
    the number of GPUs (issue #41). The chains' generations and the replicates' climbs run apart, a share per
    device, with no collective at all: in lock step, every loop ran as long as its slowest member anywhere,
    waiting on an all-reduce of its condition each iteration (weak scaling 0.52 and 0.38 on four GPUs)."""
    result = helpers.finish("collectives", timeout=900)
    assert result["devices"] == 4 and not result["cpu_kernel"]
    wanted = {"jit_init", "jit_run_block", "jit_lbfgs_lengths", "jit_newton_lengths", "jit__propose"}
    assert wanted <= set(result["compiled"])
    for program, counts in result["programs"].items():
        if program.split(".", 1)[1] in wanted:
            assert counts["all-gather"] == counts["collective-permute"] == counts["all-to-all"] == 0, (program,
                                                                                                     counts)
    apart = {"jit_run_block", "jit_lbfgs_lengths", "jit_newton_lengths", "jit__propose"}
    assert not [program for program in result["programs"] if program.split(".", 1)[1] in apart]


def test_two_process_mcmc_writes_once_and_equals_one_device(helpers):
    """`jaxphylo --distributed mcmc` in two processes (2 CPU devices each, gloo; the default mesh: batch 2, a
    run per row, x patterns 2): process 0 writes the outputs and prints the summary, process 1 prints
    nothing; the chains equal a one-device run's."""
    if reason := _cpu_collectives_reason():
        pytest.skip(reason)
    helpers.finish("runs", timeout=900)  # also wrote the one-device reference run
    (first, out0, err0), (second, out1, err1) = (helpers.finish_command(f"mcmc{i}") for i in range(2))
    assert first == 0 and second == 0, (err0[-2000:], err1[-2000:])
    assert "LnL" in out0 and out1 == ""
    assert [line for line in err1.splitlines() if not line.startswith("[Gloo]")] == []
    ours = np.genfromtxt(helpers.folder / "distributed" / "run1.log", names=True, delimiter="\t")
    reference = np.genfromtxt(helpers.folder / "reference" / "run1.log", names=True, delimiter="\t")
    for name in reference.dtype.names:
        np.testing.assert_allclose(ours[name], reference[name], rtol=1e-9)


def test_two_process_ml_bootstrap_equals_one_process(helpers):
    """`jaxphylo --distributed ml -b 4` in two processes (2 CPU devices each): each process searches on its own
    two devices, process 0's tree and model go to both, and the replicates climb in shares over all four
    devices, each process its own, the trees exchanged once. The tree file (the ML tree with its bootstrap
    supports) equals that of one process with two devices; process 1 prints nothing."""
    if reason := _cpu_collectives_reason():
        pytest.skip(reason)
    (first, _, err0), (second, out1, err1) = (helpers.finish_command(f"ml{i}") for i in range(2))
    one, _, err = helpers.finish_command("ml_one")
    assert first == 0 and second == 0 and one == 0, (err0[-2000:], err1[-2000:], err[-2000:])
    assert [line for line in (out1 + err1).splitlines() if not line.startswith("[Gloo]")] == []
    assert (helpers.folder / "ml_two.treefile").read_text() == (helpers.folder / "ml_one.treefile").read_text()


def test_sharded_equals_unsharded_on_1x4_2x2_4x1_meshes(helpers):
    result = helpers.finish("meshes")
    assert result["devices"] == 4
    assert result["patterns"] % 4, "the case must exercise padding"
    assert set(result["meshes"]) == {"1x4", "2x2", "4x1"}
    for shape, figures in result["meshes"].items():
        for name, difference in figures.items():
            if name not in ("seconds", "padded_patterns"):
                assert difference <= TOLERANCE, (shape, name, difference)
    assert result["meshes"]["1x4"]["padded_patterns"] % 4 == 0
    assert result["meshes"]["1x4"]["padded_patterns"] > result["patterns"]


def test_two_process_distributed_run_on_localhost(helpers):
    if reason := _cpu_collectives_reason():
        pytest.skip(reason)
    results = [helpers.finish(f"process{i}") for i in range(2)]
    assert sorted(r["process"] for r in results) == [0, 1]
    for r in results:
        assert r["processes"] == 2 and r["global_devices"] == 4 and r["local_devices"] == 2
        assert r["mesh"] == {"batch": 1, "patterns": 4}
        assert abs(r["sharded"] - r["single"]) <= TOLERANCE, r
        assert r["gradient_difference"] <= TOLERANCE, r
        assert r["mc3"] <= 1e-9, r  # runs in shares over both processes' devices equal one device's
        # bootstrap shares climbed by each process on its own devices: the trees of one batch (lengths to the
        # L-BFGS tolerance, as for shares in one process)
        assert r["bootstrap_supports_equal"] and r["bootstrap_topologies_equal"], r
        assert r["bootstrap_lengths"] <= 1e-3, r
    assert results[0]["sharded"] == results[1]["sharded"]


def test_default_mesh_rule():
    assert default_mesh_shape(8) == (1, 8)  # one tree: every device on patterns
    assert default_mesh_shape(8, trees=8, num_patterns=10**6) == (8, 1)  # trees split without communication
    assert default_mesh_shape(8, trees=4, num_patterns=10**6) == (4, 2)
    assert default_mesh_shape(8, trees=6, num_patterns=10**6) == (2, 4)  # 6 trees: batch must divide them
    few = MIN_PATTERNS_PER_DEVICE  # too few patterns for 4 pattern shards: pad the 6 trees to 8 instead
    assert default_mesh_shape(8, trees=6, num_patterns=few) == (4, 2)
    assert default_mesh_shape(8, trees=3, num_patterns=10**6) == (1, 8)


def test_mesh_errors_are_one_line_input_errors(capsys):
    devices = jp.device_mesh().devices.ravel().tolist()
    assert jp.device_mesh(devices).shape == {"batch": 1, "patterns": len(devices)}
    with pytest.raises(jp.InputError, match="does not divide"):
        jp.device_mesh(devices, batch=len(devices) + 1)
    for text, message in (("batch=2,patterns=", "expected batch=B,patterns=P"), ("rows=1", "expected"),
                          ("batch=1,batch=1", "given twice"), ("batch=0", "at least 1"),
                          (f"batch=1,patterns={len(devices) + 1}", "but there are")):
        assert cli.main(["env", "--mesh", text]) == 2  # the option as a user gives it
        error = capsys.readouterr().err
        assert message in error and error.count("\n") == 1, error
    assert cli.main(["env", "--mesh", f"patterns={len(devices)}"]) == 0
    assert "mesh: batch=1 x patterns=" in capsys.readouterr().out


def test_env_command_prints_devices_versions_and_mesh(capsys, tmp_path):
    alignment = tmp_path / "a.fasta"
    alignment.write_text(">a\nACGTAC\n>b\nACGTTC\n>c\nAGGTAC\n")
    assert cli.main(["env", str(alignment)]) == 0
    out = capsys.readouterr().out
    for text in ("JAX ", "jaxlib ", "CUDA: ", "float64: on", "processes: index 0 of 1", "devices: ", "free of",
                 "mesh: batch=1 x patterns=", "3 taxa x 6 patterns"):
        assert text in out, (text, out)


def test_distributed_without_a_cluster_is_one_line(monkeypatch, capsys):
    """`jaxphylo --distributed` where no cluster can be found, or with half the settings: exit 2, one line."""

    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "JAXPHYLO_")):
            monkeypatch.delenv(name)
    assert cli.main(["--distributed", "env"]) == 2
    monkeypatch.setenv("JAXPHYLO_COORDINATOR", "127.0.0.1:1")
    assert cli.main(["--distributed", "env"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "JAXPHYLO_COORDINATOR" in lines[0] and "JAXPHYLO_PROCESS_ID" in lines[1], lines
