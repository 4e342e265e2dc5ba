"""Raw prompt formats: a whole prompt string, special tokens included, written as an evaluation's
source writes it, so a model can be evaluated on exactly its source's prompt.

Qwen2.5-Math's evaluation does not call the tokenizer's chat template (``math_eval.py`` runs
without ``--apply_chat_template``): it formats ``PROMPT_TEMPLATES[prompt_type]`` of
``evaluation/utils.py`` around the question, and ``qwen25-math-cot`` puts its instruction in the
system turn only. Going through the chat template instead would add the template's own default
system prompt (Qwen2.5-Math's template has one) next to the benchmark's instruction in the user
turn, i.e. the instruction twice. A format applies only to the graders it was written for
(``graders``): the math format is never used for LiveCodeBench, which keeps its own prompt.

``models.<m>.prompt_format: NAME`` (``aggbench generate --prompt-format NAME``) selects one; the
benchmark's ``prompt_template`` is then not applied (the format holds the instruction), and the
prompt is tokenised as it is (``add_special_tokens=False``), the special tokens being in the text.
"""

from __future__ import annotations

from dataclasses import dataclass

from aggbench.registry import Registry


@dataclass(frozen=True)
class PromptFormat:
    """``template``: the whole prompt with one ``{input}`` (the raw problem); ``graders``: the
    benchmarks' graders it applies to; ``source``: repository, path and commit."""

    name: str
    template: str
    graders: tuple[str, ...]
    source: str

    def render(self, problem: str) -> str:
        """The prompt for one problem (the problem's own braces are left alone)."""
        head, sep, tail = self.template.partition("{input}")
        return head + problem + tail

    def applies_to(self, grader: str) -> bool:
        return grader in self.graders


PROMPT_FORMATS: Registry[PromptFormat] = Registry("prompt format")
PROMPT_FORMATS.add(
    "qwen25-math-cot",
    PromptFormat(
        "qwen25-math-cot",
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n",
        graders=("math",),
        source="QwenLM/Qwen2.5-Math evaluation/utils.py PROMPT_TEMPLATES['qwen25-math-cot'] @ a45202bd16f1ec06f433442dc1152d0074773465",
    ),
)


def get_prompt_format(name: str) -> PromptFormat:
    """The format, or RegistryError listing the valid names."""
    return PROMPT_FORMATS.get(name)
