"""The parts of annotation: shards (partition, chunk commits, manifests), labeling (votes to a label) and the
quality report; the ``annotate`` stage (pipelines.ads.annotate) drives them."""
