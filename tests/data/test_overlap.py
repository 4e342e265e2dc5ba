"""Verbatim and near-copy overlap of selection splits and training files with test benchmarks
(``data.overlap.shared_problems``), on real rows from ../shared/data: the report notes each
(selection, test) pair that shares problems under the selected table
(tests/report/test_selected_table.py covers the note), and each (training set, test) pair under
every table of its blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from aggbench.data import load_benchmark
from aggbench.data.fetch import fetch_benchmarks
from aggbench.data.holdout import problem_key
from aggbench.data.near import Problems
from aggbench.data.overlap import Shared

DAPO_EVAL = "train/dapo17k/dapo_repo_eval_aime-2024_dapo_format.jsonl"
LCB = "livecodebench/lcb_v5_2408_2501_public_tests_rllm.jsonl"


def test_a_holdout_drawn_from_aime_problems_is_found_to_hold_aime24s(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """data.overlap.shared_problems on real rows: a training set built from DAPO's AIME-2024 file (its
    problems are AIME 2024's, in DAPO's schema and instruction) holds 5 out; fetched beside aime24 (from
    ../shared/data's AIME-2024 file) all 5 are found in aime24, none in MATH-500; a benchmark that was
    not fetched is left out rather than counted as sharing none."""
    from aggbench.data.overlap import Shared, shared_problems

    shipped = yaml.safe_load(
        (Path(__file__).parents[2] / "configs" / "datasets" / "dapo17k.yaml").read_text()
    )
    root = tmp_path / "specs"
    (root / "datasets").mkdir(parents=True)
    (root / "benchmarks").mkdir()
    spec = {**shipped, "name": "dapoaime", "offline_file": DAPO_EVAL, "holdout": {"n": 5, "seed": 0}}
    (root / "datasets" / "dapoaime.yaml").write_text(yaml.safe_dump(spec))
    val = yaml.safe_load(
        (Path(__file__).parents[2] / "configs" / "benchmarks" / "dapo17k_val.yaml").read_text()
    )
    (root / "benchmarks" / "dapoaime_val.yaml").write_text(
        yaml.safe_dump({**val, "name": "dapoaime_val", "holdout_of": "dapoaime"})
    )
    monkeypatch.setenv("AGGBENCH_DATASET_DIR", str(root / "datasets"))
    monkeypatch.setenv("AGGBENCH_BENCHMARK_DIR", str(root / "benchmarks"))
    from aggbench.cli.report import _overlaps
    from aggbench.layout import benchmark_data_dir

    results = tmp_path / "results"
    fetched = benchmark_data_dir(results)
    fetch_benchmarks(
        ["dapoaime_val", "aime24", "math500"], fetched, data_dir=shared_data, echo=lambda _: None
    )
    pairs = [("dapoaime_val", "aime24"), ("dapoaime_val", "math500"), ("dapoaime_val", "olympiadbench")]
    got = shared_problems(pairs, fetched)
    assert got[("dapoaime_val", "aime24")] == Shared(5) and got[("dapoaime_val", "math500")] == Shared(0)
    assert "olympiadbench: not in the fetched copy" in got[("dapoaime_val", "olympiadbench")]
    # the report's reading of a grid's selections: (selection, test) pairs, per dataset too
    selection = {"aime24": "dapoaime_val", "math500": {"dapoaime": "dapoaime_val"}}
    exp = {
        "results_dir": str(results),
        "benchmarks": ["dapoaime_val", "aime24", "math500"],
        "datasets": {"dapoaime": {}},
        "evaluation": {"selection": selection},
    }
    chosen, trained = _overlaps(exp)
    assert chosen == {("dapoaime_val", "aime24"): Shared(5), ("dapoaime_val", "math500"): Shared(0)}
    missing = "no prepared file data/dapoaime.jsonl in the results directory"  # relative: same everywhere
    assert trained == {("dapoaime", "aime24"): missing, ("dapoaime", "math500"): missing}


def test_date_windowed_splits_of_one_fetched_file_are_compared_within_their_windows(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two windows of the shipped LiveCodeBench spec (as livecodebench and livecodebench_val are) are
    fetched as the same rows (a fetch keeps no window); each is read in its own date window, so two
    disjoint windows share no problem although their files are the same, and a window inside another
    shares all of its own; a window without problems is not compared."""
    from aggbench.data.fetch import records_file
    from aggbench.data.overlap import Shared, shared_problems

    shipped = yaml.safe_load(
        (Path(__file__).parents[2] / "configs" / "benchmarks" / "livecodebench.yaml").read_text()
    )
    windows = {"lcb_early": ("2024-08-01", "2024-11-01"), "lcb_late": ("2024-11-01", "2025-02-01")}
    windows |= {"lcb_all": ("2024-08-01", "2025-02-01"), "lcb_none": ("2030-01-01", "2030-02-01")}
    for name, (start, end) in windows.items():
        spec = {**shipped, "name": name, "date_window": {"start": start, "end": end}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("AGGBENCH_BENCHMARK_DIR", str(tmp_path))
    fetched = tmp_path / "fetched"
    fetch_benchmarks(
        list(windows), fetched, data_dir=shared_data, allow_public_tests_only=True, echo=lambda _: None
    )
    files = {n: records_file(fetched, n).read_text() for n in windows}
    assert files["lcb_early"] == files["lcb_late"] == files["lcb_all"]
    early = len(load_benchmark("lcb_early", fetched=fetched))
    got = shared_problems([("lcb_early", "lcb_late"), ("lcb_early", "lcb_all")], fetched)
    assert (
        got == {("lcb_early", "lcb_late"): Shared(0), ("lcb_early", "lcb_all"): Shared(early)} and early > 0
    )
    # an empty window is a reason, not a zero: "shares none" would read as compared
    empty = shared_problems([("lcb_early", "lcb_none")], fetched)
    assert empty == {("lcb_early", "lcb_none"): "lcb_none: no problems in its date window"}


def test_a_prepared_training_file_is_compared_with_the_tests_on_its_bare_problems(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training set built from DAPO's AIME-2024 file with 5 problems held out: prepare-data wraps
    every problem in DAPO's instruction, which is taken off again. Of the other 25 problems, 24 are
    aime24's verbatim and the 25th is too, reworded: DAPO's copy of the torus problem ("Torus
    $\\mathcal T$ is the surface ... When a sphere of radius $11$ rests inside") is not aime24's text
    ("Torus $T$ ... (so like a donut)"); the reworded count finds it. None is MATH-500's. A file
    prepared under another template is a reason, not a count."""
    from click.testing import CliRunner

    from aggbench.cli import main
    from aggbench.cli.report import _overlaps
    from aggbench.data import load_training_spec
    from aggbench.data.overlap import Shared, TrainingFile, shared_problems
    from aggbench.layout import benchmark_data_dir, data_file

    shipped = yaml.safe_load(
        (Path(__file__).parents[2] / "configs" / "datasets" / "dapo17k.yaml").read_text()
    )
    (tmp_path / "datasets").mkdir()
    spec = {**shipped, "name": "dapoaime", "offline_file": DAPO_EVAL, "holdout": {"n": 5, "seed": 0}}
    (tmp_path / "datasets" / "dapoaime.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("AGGBENCH_DATASET_DIR", str(tmp_path / "datasets"))
    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(shared_data))
    results = tmp_path / "results"
    prepared = data_file(results, "dapoaime")
    res = CliRunner().invoke(main, ["prepare-data", "dapoaime", "--out", str(prepared)])
    assert res.exit_code == 0, res.output
    first = json.loads(prepared.read_text().splitlines()[0])["prompt"]
    assert first.startswith("Solve the following math problem step by step.")  # wrapped, as trained on
    fetched = benchmark_data_dir(results)
    fetch_benchmarks(["aime24", "math500"], fetched, data_dir=shared_data, echo=lambda _: None)
    exp = {
        "results_dir": str(results),
        "benchmarks": ["aime24", "math500"],
        "datasets": {"dapoaime": {"spec": "dapoaime"}, "unprepared": {"spec": "dapoaime"}},
        "evaluation": {},
    }
    _, got = _overlaps(exp)
    assert got[("dapoaime", "aime24")] == Shared(24, 1) and got[("dapoaime", "math500")] == Shared(0)
    assert got[("unprepared", "aime24")] == "no prepared file data/unprepared.jsonl in the results directory"
    # a file prepared under another template, a row without a text prompt: reasons naming the line
    other = TrainingFile(
        "dapoaime",
        prepared,
        load_training_spec("dapoaime").model_copy(update={"instruction_template": "Q: {prompt}"}),
    )
    [why] = shared_problems([(other, "aime24")], fetched).values()
    assert (
        why.startswith(f"{prepared}:1: field 'prompt': does not match instruction_template")
        and "prepare it again" in why
    )
    for bad, what in (
        ({"answer": "1"}, "expected text, got NoneType"),
        ({"prompt": [1]}, "expected text, got list"),
    ):
        broken = tmp_path / "broken.jsonl"
        broken.write_text(prepared.read_text().splitlines()[0] + "\n" + json.dumps(bad) + "\n")
        side = TrainingFile("dapoaime", broken, load_training_spec("dapoaime"))
        assert (
            shared_problems([(side, "aime24")], fetched)[side, "aime24"]
            == f"{broken}:2: field 'prompt': {what}"
        )


MATH = ["aime24", "aime25", "math500", "olympiadbench", "minerva"]


@pytest.fixture(scope="module")
def fetched_math(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    fetched = tmp_path_factory.mktemp("overlap") / "fetched"
    fetch_benchmarks(MATH, fetched, data_dir=shared_data, echo=lambda _: None)
    return fetched


def _prompts(name: str, fetched: Path) -> list[str]:
    return [r["prompt"] for r in load_benchmark(name, fetched=fetched)]


def test_the_normalisation_and_spans_are_lm_evals_decontamination_ones(fetched_math: Path) -> None:
    """data.near writes out lm-eval's decontamination normalisation (its Janitor prints a traceback
    on import): on every real math problem the words and 8-word spans are the Janitor's
    (``normalize_string`` then ``word_ngrams``), whitespace aside."""
    import contextlib
    import io

    pytest.importorskip("lm_eval")
    from aggbench.data.near import NEAR_WORDS, normalise, spans

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from lm_eval.decontamination.janitor import Janitor, word_ngrams
    janitor = Janitor()
    texts = [t for name in MATH for t in _prompts(name, fetched_math)]
    assert len(texts) > 1500
    for text in texts:
        theirs = janitor.normalize_string(text)
        assert normalise(text).split() == theirs.split()
        assert spans(normalise(text)) == set(word_ngrams(theirs, NEAR_WORDS))


def _bench(texts: list[str], name: str = "t") -> Problems:
    return Problems.of((f"{name} #{i}", t) for i, t in enumerate(texts))


def _ratio(test: str, other: str, bench: list[str], *, strip_other: bool = True) -> float:
    """The documented similarity: difflib over the words, the benchmark's common spans out of the
    test problem and (``strip_other``) of the other one."""
    import difflib

    from aggbench.data.near import _without, common_spans, normalise

    common = common_spans([_bench(bench)])
    a = _without(normalise(test), common)
    b = _without(normalise(other), common) if strip_other else normalise(other).split()
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def test_near_copies_between_real_benchmarks_and_stock_phrases_that_are_not(
    shared_data: Path, fetched_math: Path
) -> None:
    """Of every ordered pair of the real math benchmarks, only MATH-500 and OlympiadBench share a
    problem: the two-dice product problem, reworded (0.59, at least NEAR_RATIO; DAPO's torus
    rewording of aime24's scores 0.63). aime24 and aime25 share a 13-word span (AIME's "...
    relatively prime positive integers. Find $m+n$", which lm-eval's 13-gram rule alone would flag)
    and no problem. aime24 with every number raised by one (other problems, other answers) is
    found as near copies of 25 of its 30 problems: the note's "or with other numbers"."""
    import re

    from aggbench.data.near import NEAR_RATIO, near_copies, normalise, spans
    from aggbench.data.overlap import shared_problems

    got = shared_problems([(a, b) for a in MATH for b in MATH if a != b], fetched_math)
    dice = {("math500", "olympiadbench"), ("olympiadbench", "math500")}
    assert {pair: n for pair, n in got.items() if n} == {pair: Shared(0, 1) for pair in dice}
    [where] = got["olympiadbench", "math500"].examples
    assert re.fullmatch(r"math500 id \S+ against olympiadbench id \S+", where), where
    aime = [
        set().union(*(spans(normalise(t), 13) for t in _prompts(n, fetched_math)))
        for n in ("aime24", "aime25")
    ]
    assert "as fracmn where m and n are relatively prime positive integers find mn" in aime[0] & aime[1]
    math500, olympiad, aime24 = (_prompts(n, fetched_math) for n in ("math500", "olympiadbench", "aime24"))
    [a] = [t for t in math500 if "6-sided dice are thrown" in t]
    [b] = [t for t in olympiad if "product of the two numbers on the top faces is divisible by 5" in t]
    assert round(_ratio(a, b, math500), 2) == 0.59 >= NEAR_RATIO
    dapo = [json.loads(line)["prompt"][0]["content"] for line in (shared_data / DAPO_EVAL).open()]
    [torus] = [t for t in aime24 if t.startswith("Torus $T$")]
    [theirs] = {t.split("\n\n")[1] for t in dapo if "Torus $\\mathcal T$" in t}
    assert round(_ratio(torus, theirs, aime24), 2) == 0.63
    shifted = [re.sub(r"\d+", lambda m: str(int(m.group()) + 1), t) for t in aime24]
    assert len(near_copies(_bench(shifted, "s"), {"aime24": _bench(aime24)})["aime24"]) == 25


def test_reformatted_copies_at_any_length_and_copies_inside_a_side_are_found(fetched_math: Path) -> None:
    """A copy that differs in maths delimiters, case or closing punctuation is a near copy at any
    length (short problems are not compared by similarity), but a changed sign, power or decimal
    point is not that (another problem); an empty text matches nothing. Three variants of one
    problem inside a selection split do not hide it as a phrase three problems share would be."""
    import re

    from aggbench.data.near import NEAR_MIN_WORDS, near_copies

    math500, aime24 = (_prompts(n, fetched_math) for n in ("math500", "aime24"))
    short = [t for t in math500 if len(t.split()) < NEAR_MIN_WORDS and "$" in t and "+" in t][:3]
    assert len(short) == 3
    test = {"math500": _bench(math500)}
    for copy in (
        [re.sub(r"\$(.*?)\$", r"\\(\1\\)", t, count=1) for t in short],
        [t.upper() + " !" for t in short],
    ):
        assert len(near_copies(_bench(copy, "s"), test)["math500"]) == 3, copy
    assert near_copies(_bench([t.replace("+", "-", 1) for t in short], "s"), test) == {"math500": []}
    assert near_copies(_bench(["...", "$$"], "s"), {"t": _bench(["?"])}) == {"t": []}
    [torus] = [t for t in aime24 if t.startswith("Torus $T$")]
    variants = [torus.replace("Torus $T$", f"A torus $\\mathcal T_{i}$") for i in range(3)]
    split = _bench([variants[0].replace("so like a donut", "a doughnut"), *variants[1:], *aime24[:2]], "s")
    found = near_copies(split, {"aime24": _bench(aime24, "aime24")})["aime24"]
    assert [(_bench(aime24, "aime24").raw[k], split.raw[o]) for k, o in found] == [
        (torus, split.raw[o]) for _, o in found
    ]
    assert len(found) == 1


def test_boilerplate_is_taken_out_of_both_sides_and_counted_over_all_test_benchmarks(
    shared_data: Path, fetched_math: Path
) -> None:
    """A Minerva problem under a long preamble its benchmark repeats, copied with three words
    changed: with the preamble left in the copy it is under NEAR_RATIO alike, with it out of both
    (as done) a near copy. LiveCodeBench's first three problems alone hold too little to tell its
    boilerplate ("Input", "Constraints", ...): counted over the whole benchmark, none of the others
    is a near copy of them; counted over the three, some are."""
    from aggbench.data.near import NEAR_MIN_WORDS, NEAR_RATIO, _without, common_spans, near_copies, normalise

    minerva = _prompts("minerva", fetched_math)
    common = common_spans([_bench(minerva)])
    kept = [t for t in minerva if len(_without(normalise(t), common)) >= NEAR_MIN_WORDS]
    [worst] = sorted(kept, key=lambda t: len(_without(normalise(t), common)) / len(normalise(t).split()))[:1]
    words = worst.split()
    copy = " ".join(
        ["zzz" if i in (len(words) - 2, len(words) - 5, len(words) - 9) else w for i, w in enumerate(words)]
    )
    assert _ratio(worst, copy, minerva, strip_other=False) < NEAR_RATIO <= _ratio(worst, copy, minerva)
    test = _bench(minerva)
    found = [test.raw[k] for k, _ in near_copies(_bench([copy], "s"), {"minerva": test})["minerva"]]
    assert worst in found  # (with a sibling subproblem under the same preamble, a variant of it)
    lcb = [json.loads(line)["problem"] for line in (shared_data / LCB).open()]
    first, rest = _bench(lcb[:3], "first"), _bench(lcb[10:], "rest")
    assert near_copies(rest, {"first": first})["first"]  # three problems' boilerplate is rare
    assert near_copies(rest, {"first": first}, common_spans([first, _bench(lcb)])) == {"first": []}


def test_a_wrapper_every_problem_carries_is_not_evidence_of_a_near_copy() -> None:
    """Inside one long instruction (an AtCoder-style block, a prompt template) a different problem
    that starts like a test problem shares most of its words with it, enough for the similarity
    threshold; without the spans the test benchmark's problems share, it is not a near copy, while
    the same problem with three words changed is. A problem with fewer than NEAR_MIN_WORDS words
    left is matched only as reformatted: the built-in task's validation and test puzzles, which
    differ in a map, a start or a count, are not near copies of each other."""
    import difflib

    from aggbench.data.near import NEAR_MIN_WORDS, NEAR_RATIO, _without, common_spans, near_copies, normalise

    wrap = (
        "You will be given a question and will write a correct program that reads standard input. {} "
        "Enclose your code within delimiters as follows and do not test it on the sample inputs."
    )
    tree = (
        "Given a tree with N vertices and a positive integer K, count the unordered pairs of distinct "
        "vertices whose distance in the tree is exactly K, and print that count on one line."
    )
    problems = [
        tree,
        "Given an integer array of length N, find the longest strictly increasing contiguous run in it "
        "and print its length, or print zero when the array is empty or holds one element only.",
        "Given a string S of lowercase English letters, print the number of distinct palindromic "
        "substrings of S, counting each distinct substring once however often it occurs in S.",
    ]
    test = {"t": _bench([wrap.format(p) for p in problems])}
    common = common_spans(test.values())
    assert min(len(_without(t, common)) for t in test["t"].texts.values()) >= NEAR_MIN_WORDS
    other = (
        "Given a tree with N vertices and a positive integer K, remove every leaf until one vertex or two "
        "adjacent vertices are left, and print how many rounds of removal that took."
    )
    reworded = tree.replace("vertices", "nodes").replace("one line", "a line")
    whole = difflib.SequenceMatcher(None, *(normalise(wrap.format(p)).split() for p in (tree, other)))
    assert whole.ratio() >= NEAR_RATIO  # the wrapper alone would make them one problem
    side = [wrap.format(p) for p in (other, "Given a graph print whether it is bipartite.")]
    assert near_copies(_bench(side, "s"), test) == {"t": []}
    side.append(wrap.format(reworded))
    [(key, at)] = near_copies(_bench(side, "s"), test)["t"]
    assert test["t"].raw[key] == wrap.format(tree) and at == problem_key(wrap.format(reworded))
    # the built-in task: 13-word puzzles, some with the same map and another start, one word apart
    val, tiny = ([r["prompt"] for r in load_benchmark(n)] for n in ("tiny_val", "tiny_test"))
    alike = [
        (a, b)
        for a in val
        for b in tiny
        if difflib.SequenceMatcher(None, normalise(a).split(), normalise(b).split()).ratio() >= 0.9
    ]
    assert alike and max(len(t.split()) for t in val + tiny) < NEAR_MIN_WORDS
    assert near_copies(_bench(val, "v"), {"t": _bench(tiny)}) == {"t": []}
    assert Shared(0, 1, ("t id 3 against v id 9",)).describe("t") == (
        "1 of t's problems as a near copy (near copy: the same problem reformatted, reworded or with "
        "other numbers, aggbench.data.near; check t id 3 against v id 9)"
    )
    both = Shared(2, 3, ("a", "b")).describe("t")
    assert both.startswith("2 of t's problems verbatim and 3 more as near copies (verbatim: the same")
    assert both.endswith("; check a, b)")
    assert (
        Shared(2).describe("t")
        == "2 of t's problems verbatim (verbatim: the same text up to Unicode form and spacing)"
    )
