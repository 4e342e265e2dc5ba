"""Prompt construction shared by the trainer and the evaluator (one code path for both)."""

from __future__ import annotations

from typing import Any


def format_prompt(
    tokenizer: Any,
    text: str,
    *,
    system_prompt: str | None = None,
    enable_thinking: bool | None = None,
    chat_template: bool = True,
) -> str:
    """The exact prompt string the model sees: the model's chat template with a generation header.

    ``enable_thinking`` is passed to the template only when set (Qwen3's switch; other templates
    ignore unknown variables). Without ``chat_template`` the text is used as it is (base models).
    """
    if not chat_template:
        return text if system_prompt is None else f"{system_prompt}\n\n{text}"
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "model.chat_template is true but the tokenizer has no chat template; "
            "set model.chat_template: false for a base model"
        )
    messages = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    messages.append({"role": "user", "content": text})
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


def stop_token_ids(tokenizer: Any, tokens: list[str] | tuple[str, ...]) -> list[int]:
    """The ids of ``tokens``, each of which must be ONE token of the vocabulary (a chat model's
    end-of-turn such as Qwen's ``<|im_end|>``): both engines then stop on the id itself, exactly,
    and the token stays the response's last (its log-prob trains like an EOS's). Raises
    ``ConfigError`` (a ValueError) naming the tokens that are not."""
    vocab = tokenizer.get_vocab()
    missing = [t for t in tokens if t not in vocab]
    if missing:
        from aggbench.config_errors import ConfigError

        raise ConfigError(
            f"stop token(s) {missing} are not single tokens of this tokenizer's vocabulary; "
            "remove them from model.stop_tokens (models.<model>.stop_tokens, --stop-token)"
        )
    return [int(vocab[t]) for t in tokens]


def prompt_ids(tokenizer: Any, text: str, **kw: Any) -> list[int]:
    """Token ids of one formatted prompt (the template already holds the special tokens): what the
    engine is given, and so what ``sampling.max_prompt_tokens`` counts."""
    return tokenizer(format_prompt(tokenizer, text, **kw), add_special_tokens=False)["input_ids"]


def overlong_prompts(tokenizer: Any, texts: list[str], max_tokens: int, **kw: Any) -> dict[int, int]:
    """{index: token count} of the prompts whose formatted ids number MORE than ``max_tokens``.

    verl's ``data.filter_overlong_prompts`` keeps a row iff ``len(apply_chat_template(messages,
    add_generation_prompt=True)) <= max_prompt_length``; this counts the same ids, built by
    :func:`prompt_ids` exactly as the trainer encodes them."""
    over = {}
    for i, text in enumerate(texts):
        n = len(prompt_ids(tokenizer, text, **kw))
        if n > max_tokens:
            over[i] = n
    return over


def encode_prompts(
    tokenizer: Any, texts: list[str], *, max_tokens: int | None = None, **kw: Any
) -> list[list[int]]:
    """Token ids of each formatted prompt (the template already holds the special tokens)."""
    out = []
    for i, text in enumerate(texts):
        ids = prompt_ids(tokenizer, text, **kw)
        if max_tokens is not None and len(ids) > max_tokens:
            raise ValueError(
                f"prompt {i} has {len(ids)} tokens, above sampling.max_prompt_tokens={max_tokens}; "
                "raise the limit or filter the dataset"
            )
        out.append(ids)
    return out
