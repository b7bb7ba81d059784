"""What every run stands on: checkpoints and stop requests, device meshes and placement, memory probes,
several processes, product precision, the persistent compilation cache."""

from ._cache import (
    DEFAULT_MAX_BYTES as DEFAULT_MAX_BYTES,
    ENVIRONMENT as ENVIRONMENT,
    SIZE_ENVIRONMENT as SIZE_ENVIRONMENT,
    CacheInfo as CacheInfo,
    cache_dir as cache_dir,
    cache_info as cache_info,
    clear_cache as clear_cache,
    default_cache_dir as default_cache_dir,
    enable_compilation_cache as enable_compilation_cache,
    enabled_cache_dir as enabled_cache_dir,
    host_tag as host_tag,
    max_cache_bytes as max_cache_bytes,
    trim_cache as trim_cache,
)
from ._checkpoint import (
    EXIT_INTERRUPTED as EXIT_INTERRUPTED,
    NEVER as NEVER,
    CheckpointError as CheckpointError,
    Interrupted as Interrupted,
    StopRequests as StopRequests,
    alignment_digest as alignment_digest,
    atomic_write as atomic_write,
    compare_settings as compare_settings,
    load_checkpoint as load_checkpoint,
    parse_duration as parse_duration,
    save_checkpoint as save_checkpoint,
    stop_point as stop_point,
    write_npz as write_npz,
)
from ._driver import BlockRun as BlockRun, block_size as block_size, from_numpy as from_numpy, to_numpy as to_numpy
from ._distributed import join_processes as join_processes, mirror_outputs as mirror_outputs
from ._mesh import (
    AXES as AXES,
    SHARE_TRACING as SHARE_TRACING,
    add_per_tree as add_per_tree,
    batch_specs as batch_specs,
    MIN_PATTERNS_PER_DEVICE as MIN_PATTERNS_PER_DEVICE,
    default_mesh_shape as default_mesh_shape,
    device_mesh as device_mesh,
    is_local as is_local,
    on_devices as on_devices,
    padded_pattern_count as padded_pattern_count,
    place as place,
    place_batch as place_batch,
    replicate as replicate,
    run_mesh as run_mesh,
    run_shares as run_shares,
    shard_batch as shard_batch,
    set_per_tree as set_per_tree,
    splits_batch as splits_batch,
    take_per_tree as take_per_tree,
    to_device as to_device,
    to_host as to_host,
)
from ._memory import (
    ResourceError as ResourceError,
    device_free_memory as device_free_memory,
    gib as gib,
    out_of_memory_message as out_of_memory_message,
    peak_memory_text as peak_memory_text,
    peak_resident_bytes as peak_resident_bytes,
    reset_peak_resident as reset_peak_resident,
    resident_bytes as resident_bytes,
)
from ._precision import product_precision as product_precision, set_product_precision as set_product_precision
