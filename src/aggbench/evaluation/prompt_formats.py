"""Raw prompt formats: a whole prompt string, special tokens included, written as an evaluation's
source writes it, so a model can be evaluated on exactly its source's prompt.

Qwen2.5-Math's evaluation does not call the tokenizer's chat template (``math_eval.py`` runs
without ``--apply_chat_template``): it formats ``PROMPT_TEMPLATES[prompt_type]`` of
``evaluation/utils.py`` around the question, and ``qwen25-math-cot`` puts its instruction in the
system turn only. Going through the chat template instead would add the template's own default
system prompt (Qwen2.5-Math's template has one) next to the benchmark's instruction in the user
turn, i.e. the instruction twice. A format applies only to the graders it was written for
(``graders``): the math format is never used for LiveCodeBench, which keeps its own prompt.

``models.<m>.prompt_format: NAME`` or a list of names (``aggbench generate --prompt-format NAME``,
repeatable) selects them; a benchmark gets the first written for its grader. A format that wraps
the problem holds the instruction (the benchmark's ``prompt_template`` is not applied); one that
wraps the benchmark's user prompt (``lcb-codeqwen``) keeps it. The prompt is tokenised as it is
(``add_special_tokens=False``), the special tokens being in the text.
"""

from __future__ import annotations

from dataclasses import dataclass

from aggbench.registry import Registry


@dataclass(frozen=True)
class PromptFormat:
    """``template``: the whole prompt with one ``{input}``; ``wraps``: what ``{input}`` is, the raw
    problem ("problem") or the benchmark's own user prompt, its ``prompt_template`` rendered
    ("user_prompt"); ``graders``: the benchmarks' graders it applies to; ``source``: repository,
    path and commit."""

    name: str
    template: str
    graders: tuple[str, ...]
    source: str
    wraps: str = "problem"

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


# lcb_runner's CodeQwenInstruct style, the one its lm_styles.py gives Qwen2.5 and Qwen3 models:
# PromptConstants.SYSTEM_MESSAGE_CODEQWEN + "\n\n" + get_codeqwen_question_template_answer(question),
# i.e. the system turn, "<|im_start|>user" and a blank line, the question prompt (livecodebench.yaml's
# prompt_template, the same text), then "<|im_end|>\n<|im_start|>assistant\n". Through a chat
# template the user turn would start after one newline, not two.
PROMPT_FORMATS.add(
    "lcb-codeqwen",
    PromptFormat(
        "lcb-codeqwen",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\n{input}"
        "<|im_end|>\n<|im_start|>assistant\n",
        graders=("code",),
        source="LiveCodeBench/LiveCodeBench lcb_runner/prompts/code_generation.py (CodeQwenInstruct) @ "
        "28fef95ea8c9f7a547c8329f2cd3d32b92c1fa24",
        wraps="user_prompt",
    ),
)


def get_prompt_format(name: str) -> PromptFormat:
    """The format, or RegistryError listing the valid names."""
    return PROMPT_FORMATS.get(name)
