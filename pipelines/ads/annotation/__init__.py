"""The parts of annotation: shards (partition), lease (one writer per shard, the partition and the merge),
commits (fingerprints, chunk and shard commits), dedup (repeats graded once), labeling (votes to a label),
merge (row accounting, checksums, summary) and the quality report; the ``annotate`` stage
(pipelines.ads.annotate) drives them."""
