"""`jaxphylo env [ALIGNMENT]`: the devices, the mesh a run would use, and the versions; and the mesh options.

Wired into `jaxphylo.cli.build_parser` by `add_env_command(commands)`. The
options `--devices N` and `--mesh batch=B,patterns=P` of the commands that run
on many devices are read by `select_devices` and `parse_mesh_option`; errors
are one-line `InputError`s, which `jaxphylo.cli.main` prints as one line.
"""

from __future__ import annotations

from .._errors import InputError
from ._common import mesh_lines, parse_mesh_option, select_devices

def add_command(subparsers) -> None:
    """Add the `env` subcommand to the `jaxphylo` parser's subparsers."""
    env = subparsers.add_parser("env", help="print the devices, the mesh a run would use, JAX/CUDA versions, float64")
    env.add_argument("alignment", nargs="?", help="also print the default mesh for this alignment (one tree)")
    env.add_argument("--data-type", choices=("dna", "protein", "codon"), default=None)
    env.add_argument("--genetic-code", type=int, default=1)
    env.add_argument("--trees", type=int, default=1, help="trees evaluated together (chains, replicates; default 1)")
    env.add_argument("--devices", type=int, default=None, help="use the first N devices (default: all visible)")
    env.add_argument("--mesh", help="mesh to show instead of the default, e.g. batch=2,patterns=4")
    env.set_defaults(run=run)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _cuda_versions() -> str:
    """CUDA runtime and cuDNN versions JAX loaded, or why there are none."""
    try:
        from jax._src.lib import cuda_versions
    except ImportError:
        cuda_versions = None
    if cuda_versions is None:
        return "none (no CUDA plugin installed)"

    formats = (("CUDA runtime", "cuda_runtime_get_version", lambda n: f"{n // 1000}.{n % 1000 // 10}"),  # 12080
               ("cuDNN", "cudnn_get_version", lambda n: f"{n // 10000}.{n % 10000 // 100}.{n % 100}"))  # 90800
    parts = []
    for name, getter, show in formats:
        try:
            parts.append(f"{name} {show(int(getattr(cuda_versions, getter)()))}")
        except Exception as err:  # a plugin without its library: say so, not a traceback
            parts.append(f"{name} unavailable ({type(err).__name__})")
    return ", ".join(parts)


def environment_lines(devices) -> list[str]:
    """What `jaxphylo env` prints about the installation and the devices."""
    import jax
    import jaxlib

    import jaxphylo
    from ..runtime import device_free_memory
    from ..likelihood.kernels import cpu as _cpu_kernel

    lines = [f"jaxphylo {jaxphylo.__version__}; JAX {jax.__version__}, jaxlib {jaxlib.__version__}; "
             f"backend {jax.default_backend()}",
             f"CUDA: {_cuda_versions()}",
             f"float64: {'on' if jax.config.jax_enable_x64 else 'off'} (jax_enable_x64)",
             f"processes: index {jax.process_index()} of {jax.process_count()}"]
    kinds: dict[str, int] = {}
    for device in devices:
        kind = device.platform + ("" if device.device_kind == device.platform else f" ({device.device_kind})")
        kinds[kind] = kinds.get(kind, 0) + 1
    lines.append("devices: " + ", ".join(f"{count} x {kind}" for kind, count in kinds.items()))
    local = set(jax.local_devices())
    for device in devices:
        if device in local:
            free, total = device_free_memory(device)
            memory = f"{_gib(free)} free of {_gib(total)}" + (" (host RAM, shared)" if device.platform == "cpu" else "")
        else:
            memory = "(another process's device)"
        lines.append(f"  {device.id:>3}  process {device.process_index}  {device.device_kind:<24} {memory}")
    if jax.default_backend() == "cpu":
        reason = _cpu_kernel.unavailable_reason()
        lines.append("CPU kernel: " + ("C++ custom calls" if reason is None else f"unavailable: {reason}"))
    return lines


def run(args) -> None:
    """Print the environment, then the mesh: `--mesh` as given, else the default for the alignment (if any)."""
    import jaxphylo as jp
    from ..runtime import default_mesh_shape, device_mesh

    devices = select_devices(args.devices)
    if args.trees < 1:
        raise InputError(f"--trees {args.trees}: must be at least 1")
    num_patterns = taxa = None
    if args.alignment:
        alignment = jp.read_alignment(args.alignment, data_type=args.data_type, genetic_code=args.genetic_code)
        num_patterns, taxa = alignment.site_patterns().num_patterns, len(alignment.taxa)
    if args.mesh:
        mesh, how = parse_mesh_option(args.mesh, devices), "--mesh"
    else:
        mesh = device_mesh(devices, *default_mesh_shape(len(devices), args.trees, num_patterns))
        how = f"default for {args.trees} tree{'s' if args.trees > 1 else ''}"
    for line in environment_lines(devices) + mesh_lines(mesh, num_patterns, taxa, how):
        print(line)
