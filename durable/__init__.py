"""Durable files shared by the agpo and student libraries.

- ``durable.fileio``: the primitives: ``fsync_file``, ``fsync_dir`` (makes a rename or a new entry in a
  folder durable) and ``sha256_file``;
- ``durable.checkpoint``: checksummed training checkpoints, saved atomically (temp folder, fsync,
  rename) and verified before they load.

The atomic single-file write (temp file beside the target, fsync, rename, fsync of the folder) is
``pipelines.io.write_atomic``, built on ``fsync_dir``; the libraries write no other files.
"""
