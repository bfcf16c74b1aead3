"""The ads-relevance pipeline: one module per ``agpo`` stage (data, teacher, train, annotate,
annotate_robustness, distil, evaluate, compare_students, pipeline, ...), each heavy one with its config in a
``<stage>_config`` module that imports no torch, and the parts they share (contracts, ingest, readers, prompts,
synthetic, teacher_metrics, annotation/)."""
