"""The advantage estimators by name, with the keyword parameters each takes and their defaults.

The tensor code is in agpo.advantages, which registers one function per name here and refuses a function
whose keyword parameters differ; the configs validate ``algorithm`` and ``advantage.params`` against this
table without importing torch.
"""

from __future__ import annotations

ESTIMATOR_PARAMS: dict[str, dict[str, object]] = {
    "grpo": {"norm_by_std": True, "eps": 1e-6, "eps_mode": "add"},
    "dr_grpo": {},
    "rloo": {},
    "w_reinforce": {"lambda_psr": 0.1, "correct_threshold": 1.0},
    "agpo": {
        "lambda_neg": 0.5,
        "lambda_pos": 1.0,
        "adv_cap": None,
        "neg_gate": "always",
        "pos_scale": "std",
        "correct_threshold": 1.0,
        "eps": 1e-6,
    },
}


def available_estimators() -> list[str]:
    """Names of the advantage estimators, sorted."""
    return sorted(ESTIMATOR_PARAMS)


def estimator_params(name: str) -> dict[str, object]:
    """The keyword parameters ``name`` accepts, with their defaults; ``ValueError`` for an unknown name."""
    if name not in ESTIMATOR_PARAMS:
        raise ValueError(f"unknown advantage estimator {name!r}; known estimators: {', '.join(available_estimators())}")
    return dict(ESTIMATOR_PARAMS[name])


def validate_estimator_params(name: str, params: dict[str, object]) -> None:
    """Raise ``ValueError`` naming any parameter ``name`` does not accept."""
    known = estimator_params(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(
            f"advantage estimator {name!r} got unknown parameter(s) {unknown}; "
            f"it accepts: {', '.join(sorted(known)) or '(none)'}"
        )
