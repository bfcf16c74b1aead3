"""Stage ``agpo train``: RL of the teacher on verifiable relevance grades (any registered algorithm).

Reads the base teacher (the SFT teacher directory, any local HF causal-LM directory, or a packaged model
name such as ``smollm2-135m-instruct``) and the pairs file; trains on the labeled train split (with
``rl_share`` > 0 only its RL part: the queries the SFT teacher did not train on) with the
relevance reward (1 when the parsed grade equals gold); grades the audit split at the start, every
``trainer.eval_every`` steps and at the end: sampled pass@1 and maj@n, and of the greedy grades accuracy,
balanced accuracy, unparseable share and ``audit_predicted/g{k}``, the share of pairs graded k (the
summary's ``audit_predicted/g{k}_end`` is what the pipeline's one-grade gate reads). Writes into
``out_dir``: ``model/`` (the trained teacher, safetensors), ``metrics.jsonl`` (one line per step, appended
as training goes), ``summary.json``, ``curves.png`` and, with ``trainer.checkpoint.every``, ``checkpoints/``.

Rerunning the same command resumes from the newest checkpoint (``resume: true``): ``metrics.jsonl`` is cut
back to that step and the following steps are trained again, so every step appears exactly once. Under
torchrun with a ``deepspeed`` config every rank trains its share of each step and rank 0 writes the
outputs; ``processes: N`` launches that torchrun itself (pipelines.launch), so a command or an Airflow task
trains with N ranks from its config alone (on CPU: gloo, e.g. N = 2 with configs/deepspeed/zero1.json).
The sequence is pipelines.rl.stage's, shared with ``agpo math-train``; this module gives it the task.
"""

from __future__ import annotations

from pathlib import Path

from agpo.models import load_tokenizer
from agpo.pretrained import resolve_base_model
from pipelines.ads.intake.contracts import ContractError, labeled_splits, read_gold_pairs, teacher_part
from pipelines.ads.teacher.audit_metrics import grade_breakdown, grade_pairs, relevance_accuracy, sampled_accuracy
from pipelines.ads.teacher.prompts import teacher_prompt
from pipelines.ads.teacher.relevance_reward import ESCI_GRADES, parse_grade, relevance_reward
from pipelines.ads.teacher.train_config import TrainTeacherConfig
from pipelines.rl.stage import RLTask, run_rl_stage


def run(config: TrainTeacherConfig) -> dict[str, Path]:
    pairs = read_gold_pairs(config.pairs)  # checked before the model is looked for; the unlabeled stay columnar
    base_dir = resolve_base_model(config.base_model)
    return run_rl_stage("train", config, base_dir, relevance_task(config, pairs, base_dir))


def relevance_task(config: TrainTeacherConfig, pairs: list[dict[str, object]], base_dir: Path) -> RLTask:
    """Train on the labeled train split; grade the audit split greedy and sampled (pass@1, maj@n).

    The teacher is prompted as its base was taught (``teacher_prompt.json`` beside the base weights), and the
    trained model gets the same file.
    """
    prompt = teacher_prompt(base_dir, load_tokenizer(base_dir), config.prompt_version)
    train, audit = labeled_splits(pairs, config.pairs, None, config.audit_examples)
    train = teacher_part(train, config.rl_share, "rl")[: config.train_examples]
    if not train:
        raise ContractError(f"{config.pairs}: rl_share {config.rl_share} leaves no gold train pair for RL")
    audit_prompts = [prompt.render_pair(r) for r in audit]
    audit_gold = [r["gold_grade"] for r in audit]
    n, trainer = config.audit_samples, config.trainer
    constraint = prompt.grammar(ESCI_GRADES) if config.audit_constrained else None

    def evaluation(engine, tokenizer):
        def evaluate() -> dict[str, float]:
            predicted, _ = grade_pairs(
                engine, tokenizer, audit_prompts, trainer.rollout.max_new_tokens, constraint=constraint
            )
            greedy = relevance_accuracy(predicted, audit_gold)
            sampled = sampled_accuracy(
                engine,
                tokenizer,
                audit_prompts,
                audit_gold,
                n=n,
                temperature=trainer.rollout.temperature,
                max_new_tokens=trainer.rollout.max_new_tokens,
                seed=trainer.seed,
                constraint=constraint,
            )
            return {
                "audit_accuracy": sampled["pass@1"],
                f"audit_maj@{n}": sampled[f"maj@{n}"],
                "audit_greedy_accuracy": greedy["accuracy"],
                "audit_unparseable": greedy["unparseable"],
                **grade_breakdown("audit_", greedy),
            }

        return evaluate

    return RLTask(
        title="teacher RL",
        prompts=[prompt.render_pair(r) for r in train],
        columns={"gold_grade": [r["gold_grade"] for r in train]},
        reward_fn=relevance_reward,
        answer_fn=parse_grade,
        evaluation=evaluation,
        curves={
            "audit accuracy (sampled, pass@1)": "audit_accuracy",
            "audit accuracy (greedy)": "audit_greedy_accuracy",
            "audit balanced accuracy (greedy)": "audit_balanced_accuracy",
        },
        summary={"prompt_version": prompt.version, "answer_format": prompt.answer_format},
        base_model=config.base_model,
        on_saved=prompt.save,
    )
