"""Experiments over the stages (``agpo study ...``, ``agpo compare-students``): scarce gold, real text, label
sensitivity, annotation robustness and student comparisons."""
