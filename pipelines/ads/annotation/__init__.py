"""Labeling at scale and human review: the ``agpo annotate`` stage (annotate) and its parts, shards (partition),
commits (fingerprints, chunk and shard commits), dedup (repeats graded once), merge (row accounting, checksums,
summary) and the quality report (the teacher's labeler, pipelines.ads.teacher.labeling, grades each chunk);
``agpo review export`` / ``import`` (review_export, review_import) take doubtful pairs to people and their
grades back."""
