"""The built-in tiny model: a ~2.6M-parameter Llama from config, a character-level tokenizer, a
supervised warm start on the synthetic task (``aggbench.tiny.task``) and a sampled-accuracy probe.

Everything here runs on CPU in seconds to minutes, so the whole pipeline (prepare, train,
generate, grade, report) can be exercised on a laptop or in CI. torch and transformers are
imported inside the functions: importing this module is cheap.

The directory written by :func:`build_tiny_model` is an ordinary Hugging Face model directory::

    AutoModelForCausalLM.from_pretrained(DIR); AutoTokenizer.from_pretrained(DIR)

Tokenizer: one token per character (printable ASCII, newline, tab), ``\\boxed{`` as one token, and
special tokens ``<|pad|> <|bos|> <|eos|> <|unk|> <|system|> <|user|> <|assistant|>``. A
conversation renders as ``<|bos|><|user|>TEXT<|eos|><|assistant|>``; the assistant's answer
ends with ``<|eos|>``, where ``generate`` stops. Characters outside that set become ``<|unk|>``
(the only case where encode/decode does not round-trip).

Warm start (defaults: 500 steps of batch 16, lr 1e-3, worked answers only for the first half).
Measured on the 2-core CI machine, which was shared with other jobs at the time (so wall times
are upper bounds; one thread's CPU time for the whole build + warm start + probe was ~220 s):
seed 0 (worked_fraction 0.5) and seed 1 (0.35) reached sampled accuracy 57% / 49% (temperature
1, 32 test prompts x 8 samples), worked answers 99% right, guesses 22% / 24% (chance: 20%), and
mean response length 26.1 / 22.2 tokens when correct vs 4.3 / 4.0 when incorrect (eos counted).
The look-up that makes worked answers right forms abruptly after ~250-300 steps: a model warmed
up for fewer steps answers near chance in both styles and has no length gap, so use one only to
test plumbing.
"""

from __future__ import annotations

import copy
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aggbench.tiny.task import (
    BOX,
    KNOBS,
    TaskConfig,
    make_task,
    response_style,
    sft_examples,
    task_reward,
)

PAD, BOS, EOS, UNK = "<|pad|>", "<|bos|>", "<|eos|>", "<|unk|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, *ROLE_TOKENS.values())
CHARACTERS = "\n\t" + "".join(chr(i) for i in range(32, 127))

# Jinja, rendered by transformers' apply_chat_template. Extra keyword arguments (e.g. Qwen3's
# ``enable_thinking``) are accepted and ignored, so callers can treat every model alike.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('tiny model chat template: role must be system, user or assistant, got ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

MODEL_SHAPE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    rope_theta=10000.0,
    attention_dropout=0.0,
)

# Warm-start defaults, measured on 2 CPU cores: what matters is the number of steps (the in-context
# copy forms abruptly after ~200-300 of them), not examples, so small batches; lr 3e-3 never formed
# it in 300 steps, 1e-3 did.
DEFAULT_SFT_STEPS = 500
DEFAULT_SFT_BATCH = 16
DEFAULT_SFT_LR = 1e-3


def build_tokenizer():
    """The character-level tokenizer as a transformers fast tokenizer (``tokenizers`` WordLevel)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for token in (*SPECIAL_TOKENS, BOX, *CHARACTERS):
        vocab[token] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Split into "\boxed{" or single characters; [\s\S] so that newlines are characters too.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"\\boxed\{|[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join without spaces: decode(encode(s)) == s
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )


def build_tiny_model(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Write a freshly initialised tiny model and its tokenizer to ``out_dir``; returns the path.

    Same seed, same weights. The generation config stops at ``<|eos|>``, pads with ``<|pad|>`` and
    samples plainly (no top-k/top-p) so that temperature-1 rollouts are the policy's distribution.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (PAD, BOS, EOS)}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=ids[PAD],
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        **MODEL_SHAPE,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=64,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _mark_tokenizer_class(out)
    return out


def _mark_tokenizer_class(model_dir: Path) -> None:
    # transformers 5 writes its own class name (TokenizersBackend); PreTrainedTokenizerFast is the
    # name both transformers 4.x and 5.x resolve, so the directory loads with either.
    path = model_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def render_prompt(tokenizer, prompt: str) -> str:
    """The prompt text exactly as rollouts see it: one user turn plus the assistant header."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def sft_batch(tokenizer, examples: list[tuple[str, str, str]]):
    """Right-padded tensors for a warm-start step; labels are -100 outside the assistant's answer.

    Returns input_ids [B, T] long, attention_mask [B, T] long, labels [B, T] long.
    """
    import torch

    prompts = tokenizer([render_prompt(tokenizer, p) for p, _, _ in examples], add_special_tokens=False)
    targets = tokenizer([t + tokenizer.eos_token for _, t, _ in examples], add_special_tokens=False)
    rows = [(p, t) for p, t in zip(prompts["input_ids"], targets["input_ids"], strict=True)]
    width = max(len(p) + len(t) for p, t in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, t) in enumerate(rows):
        n = len(p) + len(t)
        input_ids[i, :n] = torch.tensor(p + t)
        attention_mask[i, :n] = 1
        labels[i, len(p) : n] = torch.tensor(t)
    return input_ids, attention_mask, labels


def sft_warm_start(
    model_dir: str | Path,
    *,
    steps: int = DEFAULT_SFT_STEPS,
    batch_size: int = DEFAULT_SFT_BATCH,
    lr: float = DEFAULT_SFT_LR,
    seed: int = 0,
    task: TaskConfig | None = None,
    worked_only_fraction: float = 0.5,
    progress: bool = True,
) -> list[float]:
    """Supervised warm start on the task's worked + guess answers; saves the model back in place.

    The first ``worked_only_fraction`` of the steps see worked answers only, without the lab knobs'
    text (the skill: copying and looking up letters in context, which forms abruptly after
    ~200-300 steps; the same for every ``gap``/``spread`` setting, so the lab's models share it
    exactly, see :func:`aggbench.tiny.lab.warm_start_settings`); the rest see the
    ``task.worked_fraction`` mix under the task's knobs, which sets how often the warmed-up policy
    guesses and how long each style is. Loss is on the assistant tokens (answer + eos) only, with
    prompts rendered through the chat template exactly as at RL time. Plain AdamW; linear warm-up
    over 5% of the steps, constant, then cosine decay to 10% of ``lr`` over the last 40%.
    Deterministic on CPU: same seed, settings and torch thread count, same weights (the thread
    count splits reductions: 1 and 2 threads differ after 4 steps; the workflow's prepare rules pin
    it, and ``aggbench_model.json`` records it as ``sft_threads``). Returns the per-step losses.
    """
    state = SftState.start(model_dir, steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    task = task or TaskConfig()
    skill_steps = math.ceil(worked_only_fraction * steps)
    state.run(skill_task(task), range(skill_steps), progress=progress)
    state.run(task, range(skill_steps, steps), progress=progress)
    state.model.save_pretrained(model_dir)
    return state.losses


def skill_task(task: TaskConfig) -> TaskConfig:
    """The warm start's first phase: worked answers only, without the mix phase's knobs (gap and
    spread)."""
    return replace(task, worked_fraction=1.0, **{k: getattr(TaskConfig, k) for k in KNOBS})


@dataclass
class SftState:
    """A warm start in progress (model, tokenizer, optimizer, example stream, losses), so that runs
    which share their first steps can share them (:meth:`fork`)."""

    model: Any
    tokenizer: Any
    optimizer: Any
    rng: random.Random
    steps: int
    batch_size: int
    lr: float
    losses: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, model_dir: str | Path, *, steps: int, batch_size: int, lr: float, seed: int) -> SftState:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.train()
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        return cls(model, tokenizer, optimizer, random.Random(f"tiny-sft-{seed}"), steps, batch_size, lr)

    def fork(self) -> SftState:
        """An independent copy: continuing it gives what continuing this one would."""
        model, optimizer = copy.deepcopy((self.model, self.optimizer))  # together: shared parameters
        rng = random.Random()
        rng.setstate(self.rng.getstate())
        return replace(self, model=model, optimizer=optimizer, rng=rng, losses=list(self.losses))

    def lr_at(self, step: int) -> float:
        warmup, decay_from = max(1, self.steps // 20), int(0.6 * self.steps)
        if step < warmup:
            return self.lr * (step + 1) / warmup
        if step < decay_from:
            return self.lr
        frac = (step - decay_from) / max(1, self.steps - decay_from)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    def run(self, task: TaskConfig, steps: range, *, progress: bool = False) -> None:
        import torch

        bar = _progress(steps, desc="warm start", enabled=progress)
        for step in bar:
            batch = sft_examples(self.rng, task, self.batch_size)
            input_ids, attention_mask, labels = sft_batch(self.tokenizer, batch)
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_at(step)
            loss = self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.losses.append(loss.item())
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{self.losses[-1]:.3f}", refresh=False)


def _progress(iterable, *, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, disable=not enabled or not sys.stderr.isatty(), leave=False)


def sample_responses(model, tokenizer, prompts: list[str], *, n_samples: int, max_new_tokens: int, seed: int):
    """Sample ``n_samples`` responses per prompt at temperature 1; returns (texts, lengths).

    texts: list of len(prompts) * n_samples decoded responses (special tokens dropped), prompt-major.
    lengths: response lengths in tokens, counting the eos token when the response has one.
    """
    import torch

    rendered = [render_prompt(tokenizer, p) for p in prompts for _ in range(n_samples)]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        batch = tokenizer(rendered, add_special_tokens=False, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    response = out[:, batch["input_ids"].shape[1] :]  # [N, T_new]
    # a finished row is its tokens up to and including the first eos (generate pads after it); an
    # unfinished one ran to the full width
    lengths = [
        row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        for row in response.tolist()
    ]
    texts = tokenizer.batch_decode(response, skip_special_tokens=True)
    return texts, lengths


def probe_accuracy(
    model_dir: str | Path,
    *,
    n_prompts: int = 32,
    n_samples: int = 8,
    max_new_tokens: int = 64,
    seed: int = 0,
    task: TaskConfig | None = None,
) -> dict[str, Any]:
    """Sampled accuracy and response lengths on test prompts: the warm start's report card.

    Returns accuracy, mean_len_correct, mean_len_incorrect (tokens incl. eos; None when empty),
    guess_fraction (responses without a hop line, see ``task.response_style``), and the counts.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    _, test = make_task(seed, 0, n_prompts, cfg=task)
    texts, lengths = sample_responses(
        model,
        tokenizer,
        [r["prompt"] for r in test],
        n_samples=n_samples,
        max_new_tokens=max_new_tokens,
        seed=seed,
    )
    answers = [r["answer"] for r in test for _ in range(n_samples)]
    rewards = [task_reward(t, a) for t, a in zip(texts, answers, strict=True)]
    right = [n for n, r in zip(lengths, rewards, strict=True) if r > 0]
    wrong = [n for n, r in zip(lengths, rewards, strict=True) if r == 0]
    is_guess = [response_style(t) == "guess" for t in texts]
    by_style = {
        style: [r for r, g in zip(rewards, is_guess, strict=True) if g == (style == "guess")]
        for style in ("guess", "worked")
    }
    return {
        "accuracy": sum(rewards) / len(rewards),
        "accuracy_guess": _mean(by_style["guess"]),
        "accuracy_worked": _mean(by_style["worked"]),
        "mean_len_correct": _mean(right),
        "mean_len_incorrect": _mean(wrong),
        "guess_fraction": sum(is_guess) / len(texts),
        "n_responses": len(texts),
        "n_prompts": n_prompts,
        "n_samples": n_samples,
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def thread_count_mismatch(recorded: int | None) -> str | None:
    """None when a warm start recorded on ``recorded`` torch threads (None: not recorded) is what
    this process would train; else the mismatch, said for an error (the weights depend on it)."""
    import torch

    now = torch.get_num_threads()
    if recorded is None or recorded == now:
        return None
    return (
        f"was trained on {recorded} torch threads and this process runs {now}, and a warm start's "
        "weights depend on the thread count"
    )


def build_and_warm_start(
    out_dir: str | Path,
    *,
    seed: int = 0,
    sft_steps: int = DEFAULT_SFT_STEPS,
    task: TaskConfig | None = None,
    progress: bool = True,
    probe_prompts: int = 32,
    skill_from: str | Path | None = None,
) -> dict[str, Any]:
    """Build + warm-start the tiny model into ``out_dir`` and probe it (``probe_prompts`` test
    prompts x 8 samples; 0 skips the probe); returns the facts for ``aggbench_model.json``.
    ``skill_from``: a saved skill phase (``aggbench.tiny.lab.prepare_skill_phase``) to continue
    from instead of running it here; the weights are the same (on the same torch thread count)."""
    import torch

    task = task or TaskConfig()
    t0 = time.monotonic()
    if skill_from is not None and sft_steps:
        from aggbench.tiny.lab import continue_from_skill_phase

        losses = continue_from_skill_phase(
            skill_from, out_dir, seed=seed, steps=sft_steps, task=task, progress=progress
        )
    else:
        build_tiny_model(out_dir, seed=seed)
        losses = (
            sft_warm_start(out_dir, steps=sft_steps, seed=seed, task=task, progress=progress)
            if sft_steps
            else []
        )
    facts: dict[str, Any] = {
        "sft_batch_size": DEFAULT_SFT_BATCH,
        "sft_lr": DEFAULT_SFT_LR,
        "sft_final_loss": round(losses[-1], 4) if losses else None,
        "sft_seconds": round(time.monotonic() - t0, 1),
        "sft_threads": torch.get_num_threads(),  # the weights depend on it (sft_warm_start)
        "max_response_tokens": task.max_response_tokens(),
    }
    if skill_from is not None and sft_steps:
        facts["skill_phase_from"] = Path(skill_from).name  # sft_seconds: this job's part only
    if probe_prompts:
        facts["probe"] = probe_accuracy(
            out_dir,
            n_prompts=probe_prompts,
            seed=seed,
            task=task,
            max_new_tokens=task.max_response_tokens() + 8,
        )
    return facts
