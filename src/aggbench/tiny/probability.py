"""The tiny model's probability of answering correctly, computed instead of sampled.

The built-in task is synthetic, so the answers a warm-started tiny model gives are (almost all)
strings of a known, small set: the warm start's answer styles (``aggbench.tiny.task.style_target``)
for this problem, a guess of each letter of the map, and, with the lab's knobs, their padded or
filler-opened forms. Teacher-forcing each of them under the model at the sampling temperature gives
its exact probability (the product of the next-token probabilities of its tokens and the closing
eos, given the prompt as rollouts see it). Summed:

    p_correct  = sum of P(t) over the templates t that are correct      (a lower bound: a correct
                 answer outside the templates, such as a worked answer with a wrong middle hop and
                 a right box, is not counted)
    p_covered  = sum of P(t) over all templates                         (so the true probability
                 of a correct answer lies in [p_correct, p_correct + 1 - p_covered])

Averaged over a benchmark's problems, ``prob_correct`` is what avg@k estimates by sampling, without
the sampling noise, and ``prob_uncovered`` (the mean of 1 - p_covered) bounds how far it may be
below it. Use it where ``prob_uncovered`` is below ``USABLE_BELOW`` (a model that left the warm
start's styles, as RL may make it, is not measured well by it).

torch is imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from aggbench.tiny.model import render_prompt
from aggbench.tiny.task import BOX, Problem, TaskConfig, style_target

# the mean uncovered mass below which prob_correct stands for the accuracy (at most 2 points)
USABLE_BELOW = 0.02


def parse_prompt(prompt: str) -> Problem:
    """The problem of a task prompt (``Problem.prompt``'s inverse): ``Map a>b ... From a, apply it 3 times.``"""
    head, _, tail = prompt.partition(". From ")
    pairs = head.removeprefix("Map ").split()
    start, _, rest = tail.partition(", apply it ")
    hops = int(rest.split()[0])
    return Problem(mapping=tuple(tuple(p.split(">")) for p in pairs), start=start, hops=hops)  # type: ignore[misc]


def answer_stems(problem: Problem, cfg: TaskConfig) -> list[tuple[str, list[str]]]:
    """The warm start's style set for ``problem`` under ``cfg`` as (stem, letters): each answer is a
    stem (the lines before the box, newline-ended, or empty), then ``\\boxed{X}`` for a letter X of
    the stem's list: the worked answer's hop lines with the right letter only; the guess's opening
    (empty, or the negative gap's filler lines) with every letter of the map; each also with the
    spread knob's padding where it pads that style (``"echo"`` writes the letter before the box, so
    its guesses have one stem per letter)."""
    letters = sorted({src for src, _ in problem.mapping})
    out = []
    for padded in (False, True) if cfg.spread != "low" else (False,):
        worked = style_target(problem, cfg, "worked", padded=padded)
        out.append((worked[: worked.rindex(BOX)], [problem.answer]))
        if padded and not cfg.pads("guess"):
            continue
        if padded and cfg.spread == "echo":
            for x in letters:
                guess = style_target(problem, cfg, "guess", padded=True, letter=x)
                out.append((guess[: guess.rindex(BOX)], [x]))
        else:
            guess = style_target(problem, cfg, "guess", padded=padded)
            out.append((guess[: guess.rindex(BOX)], letters))
    return out


def answer_templates(problem: Problem, cfg: TaskConfig) -> list[tuple[str, bool]]:
    """(text, correct) of every answer of :func:`answer_stems` (distinct texts)."""
    return [
        (f"{stem}{BOX}{x}}}", x == problem.answer)
        for stem, letters in answer_stems(problem, cfg)
        for x in letters
    ]


def template_probabilities(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    cfg: TaskConfig,
    *,
    prompt_ids: list[list[int]] | None = None,
    temperature: float = 1.0,
    group_size: int = 8,
) -> list[dict[str, float]]:
    """Per prompt ``{"p_correct", "p_covered"}`` under ``model`` at ``temperature`` (top-p 1, no
    top-k: the distribution evaluation samples from). ``prompts``: raw task prompts; ``prompt_ids``:
    their token ids exactly as generation feeds them (default: the chat-rendered user turn).

    Nothing is computed twice: up to ``group_size`` problems whose rendered prompts have the same
    length run together (1), their key/value cache is copied once per stem and the stems plus the
    box token continue from it (2): the box position's next-token distribution gives every letter at
    once; then each (stem, letter) continues with the letter and ``}`` (3), which gives them and eos.
    Positions are passed explicitly, since stems of different lengths are right-padded."""
    import torch

    box = tokenizer.convert_tokens_to_ids(BOX)
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt_ids = prompt_ids or [enc(render_prompt(tokenizer, p)) for p in prompts]
    problems = [parse_prompt(p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompt_ids[i]))
    groups: list[list[int]] = []
    for i in order:
        if groups and len(groups[-1]) < group_size and len(prompt_ids[groups[-1][0]]) == len(prompt_ids[i]):
            groups[-1].append(i)
        else:
            groups.append([i])
    out = [{"p_correct": 0.0, "p_covered": 0.0} for _ in prompts]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    step = _Stepper(model, temperature, device)
    try:
        with torch.no_grad():
            for group in groups:
                stems = [  # (problem, stem ids, letters)
                    (i, enc(stem), letters) for i in group for stem, letters in answer_stems(problems[i], cfg)
                ]
                head, cache = step.prompt([prompt_ids[i] for i in group])
                where = {i: k for k, i in enumerate(group)}
                stem_lp, at_box, cache = step.extend(
                    cache, [where[i] for i, _, _ in stems], [s + [box] for _, s, _ in stems], head
                )
                rows = [(r, x) for r, (_, _, letters) in enumerate(stems) for x in letters]
                tail_lp, _, _ = step.extend(
                    cache,
                    [r for r, _ in rows],
                    [enc(x) + enc("}") for _, x in rows],
                    at_box,
                    eos=tokenizer.eos_token_id,
                )
                for (r, x), value in zip(rows, tail_lp, strict=True):
                    i = stems[r][0]
                    p = math.exp(stem_lp[r] + value)
                    out[i]["p_covered"] += p
                    out[i]["p_correct"] += p if x == problems[i].answer else 0.0
    finally:
        model.train(was_training)
    return out


class _Stepper:
    """Teacher-forced continuations from a key/value cache, with explicit positions and masks."""

    def __init__(self, model: Any, temperature: float, device: Any) -> None:
        self.model, self.temperature, self.device = model, temperature, device
        # transformers 5.x names the cache argument `cache` (`past_key_values` is deprecated there)
        self.cache_arg = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )

    def _logp(self, logits):
        import torch

        return torch.log_softmax(logits.float() / self.temperature, dim=-1).cpu()

    def prompt(self, ids: list[list[int]]):
        """Prompts of one length [g, Lp] -> (next-token log-probs [g, V], (cache, mask [g, Lp], ends [g]))."""
        import torch

        x = torch.tensor(ids, device=self.device)
        res = self.model(input_ids=x, use_cache=True)
        cache = getattr(res, self.cache_arg, None) or res.past_key_values
        mask = torch.ones_like(x)
        ends = torch.full((len(ids),), x.shape[1], dtype=torch.long)
        return self._logp(res.logits[:, -1]), (cache, mask.cpu(), ends)

    def extend(self, state, parents: list[int], feeds: list[list[int]], before, eos: int | None = None):
        """Each row continues its parent row of ``state`` with ``feeds[r]``; ``before`` [parents, V]:
        the parents' next-token log-probs. Returns (log-prob of each row's feed, plus of ``eos`` after
        it when given; the next-token log-probs after each row's feed [rows, V]; the new state)."""
        import torch

        cache, mask, ends = state
        idx = torch.tensor(parents)
        cache.batch_select_indices(idx.to(self.device))
        width = max(len(f) for f in feeds)
        ids = torch.zeros((len(feeds), width), dtype=torch.long)
        new = torch.zeros((len(feeds), width), dtype=torch.long)
        for r, f in enumerate(feeds):
            ids[r, : len(f)] = torch.tensor(f)
            new[r, : len(f)] = 1
        pos = ends[idx][:, None] + torch.arange(width)[None, :]  # each row's own positions
        full = torch.cat([mask[idx], new], dim=1)
        res = self.model(
            input_ids=ids.to(self.device),
            attention_mask=full.to(self.device),
            position_ids=pos.to(self.device),
            **{self.cache_arg: cache},
        )
        lp = self._logp(res.logits)  # [rows, width, V]
        values, after = [], torch.empty((len(feeds), lp.shape[-1]))
        for r, f in enumerate(feeds):
            v = float(before[parents[r], f[0]])
            if len(f) > 1:
                v += float(lp[r, torch.arange(len(f) - 1), torch.tensor(f[1:])].double().sum())
            after[r] = lp[r, len(f) - 1]
            if eos is not None:
                v += float(after[r, eos])
            values.append(v)
        lengths = torch.tensor([len(f) for f in feeds])
        return values, after, (cache, full, ends[idx] + lengths)


def summarize(per_problem: list[dict[str, float]]) -> dict[str, float]:
    """A benchmark's ``prob_correct`` (mean lower bound), ``prob_uncovered`` (mean 1 - covered) and
    ``prob_uncovered_max`` (the worst problem's), fractions."""
    n = len(per_problem)
    uncovered = [max(0.0, 1.0 - r["p_covered"]) for r in per_problem]
    return {
        "prob_correct": sum(r["p_correct"] for r in per_problem) / n,
        "prob_uncovered": sum(uncovered) / n,
        "prob_uncovered_max": max(uncovered),
    }
