"""The math grader against a plain sequential math-verify loop, on the same responses: throughput
(``--part speed``) and accuracy by answer style (``--part styles``); both by default.

Builds 2,000 responses from the gold answers of MATH-500, AIME 2024/2025, OlympiadBench and
Minerva (../shared/data, or $AGGBENCH_SHARED_DATA) and perturbations of them: the right answer,
a wrong number, another form of the right answer (``\\frac12`` / ``0.5``, ``025``, ``\\dfrac``), the
DAPO ``Answer:`` line, Minerva's ``final answer is``, long padding, no answer at all. Then grades
them three ways in one run:

  1. ``aggbench grade`` (the real CLI, in a subprocess: process start, worker start and all);
  2. ``grade_math_batch`` on an already started pool (what training rewards pay per step);
  3. a plain loop: ``verify(parse("\\boxed{gold}"), parse(response))`` with math-verify defaults.

It prints each one's throughput, the ratios, and every verdict on which 1 and 3 differ, with the
perturbation kind, so each difference can be judged (target: 2x the plain loop, same verdicts
except where the plain loop misreads a benchmark quirk).

Styles: every MATH-500 problem answered without a box (``So the answer is N.``, ``... the value
we want is $x$.``, ``Therefore, she has N coins.``), with a boxed number decorated by ordinal or
unit text (``N^{\\mathrm{th}}\\text{ term}``, ``\\text{the }N^{\\text{th}}\\text{ day}``, ``\\text{N coins}``),
and, for equation golds, the equation rearranged (right) or doubled (wrong: a normalised form is
asked); beside each right row a control written the same way with a different number or
expression. Both graders grade the same rows; it prints, per style and in all, each one's
accuracy, false negatives and false positives apart, then the rows either one gets wrong
(tests/grading/test_math_answer_styles.py checks the same rows). A report, not a test::

    .venv/bin/python benchmarks/grade_math.py [--part all|speed|styles] [--n 2000] [--workers N]
        [--seed 0] [--show 40]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILLER = (
    "We first restate the problem and set up notation. Let $x$ be the unknown; then $x^2 - 5x + 6 = 0$ "
    "factors as $(x-2)(x-3) = 0$, which is a useful warm-up. Next we check small cases, compute a few "
    "values, and look for a pattern before proving it in general. "
)


def shared_data() -> Path:
    env = os.environ.get("AGGBENCH_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def load_golds(data: Path) -> list[tuple[str, str, object]]:
    """(benchmark, id, gold exactly as the grader receives it)."""
    from aggbench.grading.math import clean_gold

    def rows(rel: str) -> list[dict]:
        return [json.loads(x) for x in (data / rel).read_text(encoding="utf-8").splitlines() if x.strip()]

    out: list[tuple[str, str, object]] = []
    out += [("math500", r["unique_id"], r["answer"]) for r in rows("math500/test.jsonl")]
    out += [("aime24", str(r["id"]), r["answer"]) for r in rows("aime24/test.jsonl")]
    out += [("aime25", str(i), r["answer"]) for i, r in enumerate(rows("aime25/aime25_gkv.jsonl"))]
    out += [("olympiadbench", str(r["id"]), r["final_answer"]) for r in rows("olympiadbench/test.jsonl")]
    # Minerva: the loader hands the grader the content of the solution's one box
    out += [("minerva", str(r["idx"]), clean_gold(r["solution"])) for r in rows("minerva/test.jsonl")]
    return out


def other_form(g: str) -> str:
    """The same answer written differently."""
    if re.fullmatch(r"\d+", g):
        return f"{int(g):03d}" if int(g) < 100 else f"{g}.0"
    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", g)
    if m:
        a, b = int(m.group(2)), int(m.group(3))
        d = b
        for p in (2, 5):
            while d % p == 0:
                d //= p
        if d == 1:  # terminating decimal
            return f"{m.group(1)}{a / b:g}"
        return f"{m.group(1)}\\dfrac{{{a}}}{{{b}}}"
    if re.fullmatch(r"-?\d+\.\d+", g):
        return f"\\frac{{{g.replace('.', '')}}}{{{10 ** len(g.split('.')[1])}}}"
    return g.replace("\\frac", "\\dfrac").replace(",", ", ")


def wrong_number(g: str) -> str:
    nums = list(re.finditer(r"\d+", g))
    if not nums:
        return g + "+1"
    m = nums[-1]
    return g[: m.start()] + str(int(m.group()) + 1) + g[m.end() :]


def build(golds: list[tuple[str, str, object]], n: int, seed: int) -> list[dict]:
    from aggbench.grading.math import clean_gold

    rng = random.Random(seed)
    kinds = ["correct", "wrong_number", "other_form", "dapo", "minerva", "padding", "no_answer"]
    weights = [3, 3, 2, 1, 1, 1, 1]
    rows = []
    for k in range(n):
        bench, pid, gold = golds[k % len(golds)] if k < len(golds) else rng.choice(golds)
        g = clean_gold(gold[0] if isinstance(gold, list) else gold)
        kind = rng.choices(kinds, weights)[0]
        pad = FILLER * rng.randint(1, 4)
        response = {
            "correct": f"{pad}So the answer is $\\boxed{{{g}}}$.",
            "wrong_number": f"{pad}So the answer is $\\boxed{{{wrong_number(g)}}}$.",
            "other_form": f"{pad}So the answer is $\\boxed{{{other_form(g)}}}$.",
            "dapo": f"{pad}\nAnswer: ${g}$",
            "minerva": f"{pad}\nFinal Answer: The final answer is ${g}$. I hope it is correct.",
            "padding": f"{FILLER * rng.randint(20, 60)}So the answer is $\\boxed{{{g}}}$.",
            "no_answer": pad,
        }[kind]
        intended = kind not in ("wrong_number", "no_answer")
        rows.append(
            {"id": f"{bench}/{pid}", "kind": kind, "intended": intended, "response": response, "answer": gold}
        )
    return rows


# --------------------------------------------------------------------------- answer styles

INTEGER = re.compile(r"-?\d+")
PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# Ordinal and unit decorations of a bare number N, as models write them in a box
DECORATIONS = [
    "{n}^{{\\mathrm{{th}}}}\\text{{ term}}",
    "{n}^{{\\text{{th}}}}",
    "\\text{{the }}{n}^{{\\text{{th}}}}\\text{{ day}}",
    "{n}^{{th}}",
    "{n}~\\text{{units}}",
    "\\text{{{n} coins}}",
]


def other_value(g: str) -> str:
    """A different answer of the same shape: the first number not in a subscript plus 1 (a base
    subscript such as ``52_8`` is no value: math-verify ignores it, so ``52_9`` "equals" ``52_8``)."""
    for m in re.finditer(r"\d+", g):
        if not re.search(r"_\{?$", g[: m.start()]):
            return g[: m.start()] + str(int(m.group()) + 1) + g[m.end() :]
    return g + "+1"


def equation_forms(gold: str) -> tuple[str, str] | None:
    """(the same equation rearranged, the equation times 2) for a gold that is an equation in some
    unknown (MATH-500: a plane, two lines, ``x=5``); None for any other gold."""
    import sympy
    from math_verify import parse

    if "=" not in gold:
        return None
    eq = next((v for v in parse("\\boxed{" + gold + "}") if isinstance(v, sympy.Basic)), None)
    if not isinstance(eq, sympy.Eq) or not eq.free_symbols:
        return None
    moved = f"{sympy.latex(sympy.expand(eq.lhs - eq.rhs))} = 0"
    scaled = f"{sympy.latex(sympy.expand(2 * eq.lhs))} = {sympy.latex(sympy.expand(2 * eq.rhs))}"
    return moved, scaled


def style_rows(data: Path, seed: int = 0) -> list[dict]:
    """Responses to every MATH-500 problem in the styles the grader must read, and controls.

    Each row: ``style`` (``unboxed_*``, ``decorated``, ``equation_*``), ``intended`` (True: the
    response holds the gold answer; False: a control that holds a different number or
    expression, written the same way), ``response`` and ``answer`` (the gold as stored).
    Unboxed styles end in a last sentence with no box: ``So the answer is N.``, ``... is $x$.``,
    ``Therefore, she has N coins.``; ``unboxed_unstated`` (all controls, to be refused) holds the
    gold mid-derivation in a response that never states an answer; decorated ones box a number with ordinal or unit text. Equation
    golds get their equation rearranged (right) and multiplied by 2 (wrong: a normalised form was
    asked).
    """
    from aggbench.grading.math import clean_gold

    rng = random.Random(seed)
    rows: list[dict] = []
    problems = [
        json.loads(x) for x in (data / "math500" / "test.jsonl").read_text(encoding="utf-8").splitlines() if x
    ]
    for k, r in enumerate(problems):
        g = clean_gold(r["answer"])
        pad = FILLER * rng.randint(1, 3)

        def add(style: str, intended: bool, response: str, r: dict = r) -> None:
            rows.append(
                {
                    "id": r["unique_id"],
                    "style": style,
                    "intended": intended,
                    "response": response,
                    "answer": r["answer"],
                }
            )

        for intended, ans in ((True, g), (False, other_value(g))):
            written = ans if PLAIN_NUMBER.fullmatch(ans) else f"${ans}$"
            add("unboxed_answer_is", intended, f"{pad}So the answer is {written}.")
            add("unboxed_is_math", intended, f"{pad}Putting it all together, the value we want is ${ans}$.")
        # refused: the gold value met mid-derivation in a response that never states an answer
        # (plain math-verify reads its last number or math, and calls it right)
        add(
            "unboxed_unstated",
            False,
            f"{pad}Substituting gives ${g}$ for the first part; the other cases follow the same way. "
            "Let me know if you'd like me to elaborate on any step!",
        )
        if INTEGER.fullmatch(g):
            n = int(g)
            for intended, m in ((True, n), (False, n + 1)):
                add("unboxed_sentence", intended, f"{pad}Therefore, she has {m} coins.")
                if n > 0:
                    form = DECORATIONS[k % len(DECORATIONS)].format(n=m)
                    add("decorated", intended, f"{pad}So it is $\\boxed{{{form}}}$.")
                    add(
                        "unboxed_decorated",
                        intended,
                        f"{pad}So the answer is the ${m}^{{\\text{{th}}}}$ one.",
                    )
        forms = equation_forms(g)
        if forms is not None:
            moved, scaled = forms
            add("equation_rearranged", True, f"{pad}The equation is $\\boxed{{{moved}}}$.")
            add("equation_scaled", False, f"{pad}The equation is $\\boxed{{{scaled}}}$.")
    return rows


def confusion(verdicts: list[bool], intended: list[bool]) -> tuple[int, int, int]:
    """(right, false negatives, false positives) of verdicts against the intended labels."""
    right = sum(v == i for v, i in zip(verdicts, intended, strict=True))
    fn = sum(i and not v for v, i in zip(verdicts, intended, strict=True))
    fp = sum(v and not i for v, i in zip(verdicts, intended, strict=True))
    return right, fn, fp


def report_styles(rows: list[dict], ours: list[bool], plain: list[bool], show: int) -> None:
    """Accuracy, false negatives and false positives of both graders, per style and in all."""
    print(
        f"\n{'style':<22}{'rows':>6}{'right':>7}  {'aggbench acc   FN   FP':>24}  {'plain acc   FN   FP':>21}"
    )
    styles = list(dict.fromkeys(r["style"] for r in rows))
    for style in [*styles, "all"]:
        idx = [i for i, r in enumerate(rows) if style in ("all", r["style"])]
        intended = [rows[i]["intended"] for i in idx]
        a = confusion([ours[i] for i in idx], intended)
        p = confusion([plain[i] for i in idx], intended)
        print(
            f"{style:<22}{len(idx):>6}{sum(intended):>7}  {a[0] / len(idx):>14.4f}{a[1]:>5}{a[2]:>5}"
            f"  {p[0] / len(idx):>11.4f}{p[1]:>5}{p[2]:>5}"
        )
    off = [
        (r, a, p)
        for r, a, p in zip(rows, ours, plain, strict=True)
        if a != r["intended"] or p != r["intended"]
    ]
    for r, a, p in off[:show]:
        print(
            f"  {r['id']:<34} {r['style']:<20} intended={r['intended']!s:<5} aggbench={a!s:<5} plain={p!s:<5}"
            f" gold={r['answer'][:30]!r} ...{r['response'][-60:]!r}"
        )


def plain_loop(rows: list[dict]) -> list[bool]:
    from math_verify import parse, verify

    out = []
    for r in rows:
        golds = r["answer"] if isinstance(r["answer"], list) else [r["answer"]]
        gold = [x for g in golds for x in parse("\\boxed{" + str(g) + "}")]
        out.append(bool(verify(gold, parse(r["response"]))))
    return out


def run_cli(rows: list[dict], workers: int | None) -> tuple[list[dict], float]:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        exe = Path(sys.executable).with_name("aggbench")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "aggbench.cli"]
        cmd += ["grade", "--grader", "math", "--input", str(src), "--output", str(dst), "--no-progress"]
        if workers:
            cmd += ["--workers", str(workers)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        elapsed = time.perf_counter() - t0
        return [json.loads(x) for x in dst.read_text(encoding="utf-8").splitlines()], elapsed


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (Linux /proc; 0 elsewhere)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=40, help="differing verdicts to print in full")
    ap.add_argument("--part", choices=["all", "speed", "styles"], default="all")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the plain loop's math-verify timeouts log whole responses

    data = shared_data()
    if args.part in ("all", "speed"):
        speed(data, args)
    if args.part in ("all", "styles"):
        styles(data, args)


def styles(data: Path, args: argparse.Namespace) -> None:
    from aggbench.grading.math import grade_math_batch
    from aggbench.grading.pool import GradingPool, default_workers

    rows = style_rows(data, args.seed)
    print(f"\n{len(rows)} MATH-500 responses in answer styles: {dict(Counter(r['style'] for r in rows))}")
    with GradingPool(workers=args.workers or default_workers(), timeout_s=10.0) as pool:
        verdicts = grade_math_batch([r["response"] for r in rows], [r["answer"] for r in rows], pool=pool)
    ours = [v.correct for v in verdicts]
    plain = plain_loop(rows)
    report_styles(rows, ours, plain, args.show)
    missed = Counter(v.reason for v, r in zip(verdicts, rows, strict=True) if v.correct != r["intended"])
    print(f"aggbench's reasons where it is off: {dict(missed)}")


def speed(data: Path, args: argparse.Namespace) -> None:
    from aggbench.grading.math import grade_math_batch
    from aggbench.grading.pool import GradingPool, default_workers

    rows = build(load_golds(data), args.n, args.seed)
    workers = args.workers or default_workers()
    print(f"{len(rows)} responses from {data}; kinds: {dict(Counter(r['kind'] for r in rows))}")
    print(
        f"CPUs usable: {default_workers()}, grader workers: {workers}, load average: {os.getloadavg()[0]:.1f}\n"
    )

    cli_rows, t_cli = run_cli(rows, workers)
    with GradingPool(workers=workers, timeout_s=10.0) as pool:
        grade_math_batch(["\\boxed{1}"] * workers * 4, ["1"] * workers * 4, pool=pool)  # workers up
        pids = pool.pids
        c0, t0 = cpu_seconds(pids), time.perf_counter()
        warm = grade_math_batch([r["response"] for r in rows], [r["answer"] for r in rows], pool=pool)
        t_warm = time.perf_counter() - t0
        cpu_warm = cpu_seconds(pids) - c0 if pool.pids == pids else float("nan")
    c0, t0 = time.process_time(), time.perf_counter()
    plain = plain_loop(rows)
    t_plain = time.perf_counter() - t0
    cpu_plain = time.process_time() - c0

    n = len(rows)
    ours = [r["correct"] for r in cli_rows]
    assert ours == [v.correct for v in warm], "the CLI and the Python entry point disagree"
    print(f"{'grader':<44}{'seconds':>9}{'responses/s':>13}{'vs plain':>10}")
    for name, t in [
        ("plain math-verify loop (sequential)", t_plain),
        ("aggbench grade (subprocess, cold start)", t_cli),
        ("grade_math_batch (started pool)", t_warm),
    ]:
        print(f"{name:<44}{t:>9.2f}{n / t:>13.1f}{t_plain / t:>9.2f}x")
    # Wall-clock ratios depend on how busy the machine is; CPU seconds do not.
    print(
        f"CPU seconds: plain loop {cpu_plain:.2f}, started pool (all workers) {cpu_warm:.2f}"
        f" -> {cpu_plain / cpu_warm:.2f}x less CPU per response; load average now {os.getloadavg()[0]:.1f}"
    )

    intended = [r["intended"] for r in rows]
    print(
        f"\nagreement with the intended label: aggbench {sum(a == b for a, b in zip(ours, intended, strict=True)) / n:.4f}, "
        f"plain {sum(a == b for a, b in zip(plain, intended, strict=True)) / n:.4f}"
    )
    off = [r for r in cli_rows if r["correct"] != r["intended"]]
    for r in off[: args.show]:
        gold = r["answer"] if isinstance(r["answer"], str) else r["answer"][0]
        print(
            f"  not as intended: {r['id']:<28} {r['kind']:<12} gold={gold[:40]!r} extracted={str(r['extracted'])[:40]!r} ({r['reason']})"
        )
    print(f"reasons: {dict(Counter(r['reason'] for r in cli_rows))}")
    diff = [(r, p) for r, p in zip(cli_rows, plain, strict=True) if r["correct"] != p]
    by_kind = Counter((r["kind"], r["correct"], p) for r, p in diff)
    print(f"\nverdicts that differ: {len(diff)} of {n}")
    for (kind, a, p), c in sorted(by_kind.items(), key=lambda x: -x[1]):
        print(f"  {c:4d}  kind={kind:<13} aggbench={a!s:<5} plain={p!s:<5}")
    for r, p in diff[: args.show]:
        gold = r["answer"] if isinstance(r["answer"], str) else r["answer"][0]
        tail = r["response"][-70:].replace("\n", " ")
        print(
            f"  - {r['id']:<32} {r['kind']:<12} gold={gold[:40]!r:<44} aggbench={r['correct']!s:<5}"
            f" ({r['reason']}, extracted={str(r['extracted'])[:30]!r}) plain={p}  ...{tail!r}"
        )


if __name__ == "__main__":
    main()
