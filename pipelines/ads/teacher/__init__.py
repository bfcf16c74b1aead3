"""The LLM teacher: SFT warm start (sft, ``agpo teacher``), RL (train, ``agpo train``), how it is prompted (prompts),
what it answers (answer_format, answer_grammar), the verifiable reward (relevance_reward), how its answers become
a label (labeling, voting_config: votes or exact grade probabilities), its audit figures (metrics) and the gate
that decides whether its labels are worth annotating with (gate)."""
