"""HDF5 experience checkpoints: the on-disk format (write, open, verify, inspect).

The only package that imports ``h5py``: :mod:`.write` writes the files, :mod:`.read` opens,
reads and verifies them (and :mod:`.inspect` inspects them);
:mod:`.files` holds what needs no HDF5 (names, markers, retention, JSON encodings).
Nothing here uses MPI: the collective protocol that decides *when* and *who* writes lives
in :mod:`conduit_hpc.features.checkpointing`.

A checkpoint is a directory ``ckpt-NNNNNN`` under a checkpoint root::

    ckpt-000007/
        buffer-0000.h5   one per buffer rank: /shards/<id>/{seq,priority,init_priority,
                         columns/<field>} with the cut's cursors and counters as attributes
        learner.h5       optional: /arrays/<name> (model and optimizer state, any rank's)
                         with description/units attributes when the writer gave them
        manifest.h5      spec, config (TOML text), layout, placement, every rank's RNG state
                         and counters, a CRC-32 per dataset of every other file, and HDF5
                         virtual datasets: /experience/<field> (every shard's rows as one
                         global array), /index/{priority,shard,seq}; /learner and
                         /weights link into learner.h5's /arrays. Every dataset carries
                         ``description`` and ``units`` attributes (the spec's field
                         descriptions; /index/priority says ``alpha_applied = False``
                         and ``alpha``)
        DONE             JSON, written last: file sizes and the manifest's SHA-256
        DAMAGED          only when a resume fell back past it as damaged: JSON, the reason;
                         the checkpoint is kept as evidence, never restored, and retention
                         neither counts nor deletes it

Files are written into ``.tmp-ckpt-NNNNNN-*`` and fsync'ed, the directory is renamed into
place, and ``DONE`` is written (and fsync'ed) last. A directory without ``DONE``, a file
shorter than recorded (truncated), a dataset whose checksum differs or whose HDF5 metadata
is damaged (any h5py error reading it), a schema version from the future or a checkpoint of
a different spec is refused with a
:class:`~conduit_hpc.errors.CheckpointError` naming the file and the reason. Only numeric
arrays, strings and JSON are read back: no pickle is ever loaded, nothing is executed.
"""

from conduit_hpc.checkpoint.files import (
    CHUNK_BYTES,
    DAMAGED,
    DONE,
    FORMAT,
    LEARNER_FILE,
    MANIFEST,
    SCHEMA_VERSION,
    TMP_PREFIX,
    checkpoint_name,
    checksum,
    damage_of,
    dataset_attrs,
    done_record,
    is_complete,
    list_checkpoints,
    mark_damaged,
    newest_first,
    next_seq,
    prune,
    rng_from_json,
    rng_to_json,
    seq_of,
    spec_from_json,
    spec_to_json,
)
from conduit_hpc.checkpoint.inspect import format_report, inspect_checkpoint
from conduit_hpc.checkpoint.read import Checkpoint, ShardRecord, open_checkpoint
from conduit_hpc.checkpoint.write import (
    finalize,
    write_arrays_file,
    write_manifest,
    write_shard_file,
)

__all__ = [
    "CHUNK_BYTES",
    "DAMAGED",
    "DONE",
    "FORMAT",
    "LEARNER_FILE",
    "MANIFEST",
    "SCHEMA_VERSION",
    "TMP_PREFIX",
    "Checkpoint",
    "ShardRecord",
    "checkpoint_name",
    "checksum",
    "damage_of",
    "dataset_attrs",
    "done_record",
    "finalize",
    "format_report",
    "inspect_checkpoint",
    "is_complete",
    "list_checkpoints",
    "mark_damaged",
    "newest_first",
    "next_seq",
    "open_checkpoint",
    "prune",
    "rng_from_json",
    "rng_to_json",
    "seq_of",
    "spec_from_json",
    "spec_to_json",
    "write_arrays_file",
    "write_manifest",
    "write_shard_file",
]
