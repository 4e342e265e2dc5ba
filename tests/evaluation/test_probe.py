"""`aggbench probe` (issue 28, item 7): the contamination probe on the tiny model, CPU only.

The untrained tiny model completes nothing verbatim, so an exact-match rate of 0 alone would test
nothing. A model that HAS memorised a problem is built for real instead: the tiny model trained by
next-token prediction on one MATH-500 problem's text until it reproduces it (a few seconds on one
thread). The probe must score that problem exact, and only that one; the untrained model must not.
The structural checks: the split is the model's own tokens (prefix + target == the problem text,
the prefix the first floor(0.6 n) tokens), one row per record in order, the summary's rates
recomputed from the rows, the printed table equal to probe.md.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from helpers.jsonl import read_jsonl

LIMIT = 6
# MATH-500's 4th problem, "How many positive whole-number divisors does 196 have?": short, ASCII
MEMORISED = 3


@pytest.fixture(scope="module")
def records(shared_data):
    from aggbench.data.benchmarks import load_benchmark

    return load_benchmark("math500", data_dir=shared_data, limit=LIMIT)


@pytest.fixture(scope="module")
def memorised_model(tiny_model, records, tmp_path_factory) -> Path:
    """The tiny model after next-token training on one problem's raw text (no special tokens, as
    the probe feeds it) until greedy decoding reproduces the text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("memorised") / "model"
    shutil.copytree(tiny_model, out)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([tokenizer(records[MEMORISED]["prompt"], add_special_tokens=False)["input_ids"]])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(150):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    model.eval()
    with torch.no_grad():  # memorised: every next token is the argmax given the text before it
        assert (model(input_ids=ids).logits[0, :-1].argmax(-1) == ids[0, 1:]).all(), loss.item()
    model.save_pretrained(out)
    torch.set_num_threads(threads)
    return out


def _probe(checkpoint: Path, out: Path, shared_data: Path, *args: str):
    argv = ["probe", "--checkpoint", str(checkpoint), "--benchmarks", "math500", "--out", str(out)]
    argv += ["--limit", str(LIMIT), "--data-dir", str(shared_data), "--quiet", *args]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    return result, json.loads((out / "probe.json").read_text()), read_jsonl(out / "math500.jsonl")


def test_probe_on_the_tiny_model_writes_rows_summary_and_table(tiny_model, records, shared_data, tmp_path):
    from transformers import AutoTokenizer

    from aggbench.evaluation.probe import summarise

    result, info, rows = _probe(tiny_model, tmp_path, shared_data, "--label", "tiny-base")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["math500.jsonl", "probe.json", "probe.md"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert [r["id"] for r in rows] == [rec["id"] for rec in records]
    for row, rec in zip(rows, records, strict=True):
        ids = tokenizer(rec["prompt"], add_special_tokens=False)["input_ids"]
        assert row["prefix"] + row["target"] == rec["prompt"]  # the tiny tokenizer round-trips ASCII
        assert row["prefix_tokens"] == int(0.6 * len(ids)) and row["target_tokens"] == len(ids) - int(
            0.6 * len(ids)
        )
        assert tokenizer(row["prefix"], add_special_tokens=False)["input_ids"] == ids[: row["prefix_tokens"]]
        # the tiny model has 512 positions: prefix + continuation fit them (the 731-character 5th
        # problem's does not: it is scored on the target's first 512 - prefix tokens, and says so)
        assert row["budget"] == min(row["target_tokens"], 512 - row["prefix_tokens"])
        assert row["capped"] == (row["budget"] < row["target_tokens"])
        assert 1 <= row["continuation_tokens"] <= row["budget"]
        assert row["finish_reason"] in ("stop", "length") and row["exact"] is not None
        assert row["exact"] == (" ".join(row["continuation"].split()) == " ".join(row["target"].split()))
    assert not any(r["exact"] for r in rows)  # an untrained model memorised nothing
    assert [r["capped"] for r in rows] == [i == 4 for i in range(LIMIT)]
    bench = info["benchmarks"]["math500"]
    assert {k: bench[k] for k in summarise(rows)} == summarise(rows)
    assert (
        bench["n"] == bench["n_problems"] == LIMIT and bench["exact_match"] == 0.0 and bench["n_exact"] == 0
    )
    assert bench["capped"] == 1 and bench["not_probed"] == {}
    assert info["fraction"] == 0.6 and info["engine"] == "hf" and info["label"] == "tiny-base"
    assert info["protocol"]["prompt"].startswith("the raw prefix: no chat template")
    table = (tmp_path / "probe.md").read_text()
    assert result.stdout == table
    assert f"| tiny-base | math500 | 0.6 | {LIMIT} | 0.0% (0/{LIMIT}) |" in table


def test_probe_scores_a_memorised_problem_exact(memorised_model, tiny_model, records, shared_data, tmp_path):
    result, info, rows = _probe(memorised_model, tmp_path / "memorised", shared_data)
    assert [r["exact"] for r in rows] == [i == MEMORISED for i in range(LIMIT)]
    hit = rows[MEMORISED]
    assert hit["prefix"] + hit["continuation"] == records[MEMORISED]["prompt"]
    assert hit["prefix_match"] == 1.0 and hit["rouge_l"] == 1.0
    assert all(r["prefix_match"] < 1.0 for i, r in enumerate(rows) if i != MEMORISED)
    bench = info["benchmarks"]["math500"]
    assert bench["n_exact"] == 1 and bench["exact_match"] == round(1 / LIMIT, 6)
    assert f"| 16.7% (1/{LIMIT}) |" in result.stdout
    # the control: the same problem, the same probe, the model before it memorised the text
    _, _, base = _probe(tiny_model, tmp_path / "base", shared_data)
    assert base[MEMORISED]["exact"] is False and base[MEMORISED]["prefix"] == hit["prefix"]


def test_probe_cap_and_context_are_counted_not_hidden(memorised_model, records, shared_data, tmp_path):
    """--max-tokens 5 scores each problem on its target's first 5 tokens (the memorised one stays
    exact, and says it was capped); --max-context 100 leaves the prefixes of 100 tokens or more
    unprobed (no verdict, not counted in the rate); --fraction 0.4 moves the split."""
    _, info, rows = _probe(
        memorised_model,
        tmp_path,
        shared_data,
        "--max-tokens",
        "5",
        "--max-context",
        "100",
        "--fraction",
        "0.4",
    )
    assert info["max_context"] == 100 and info["fraction"] == 0.4 and info["max_tokens"] == 5
    over = [r for r in rows if r["prefix_tokens"] >= 100]
    assert over and all(r["finish_reason"] == "prompt_too_long" and r["exact"] is None for r in over)
    probed = [r for r in rows if r["exact"] is not None]
    assert all(r["budget"] == min(5, r["target_tokens"], 100 - r["prefix_tokens"]) for r in probed)
    assert all(r["continuation_tokens"] <= r["budget"] and r["capped"] for r in probed)
    assert rows[MEMORISED]["exact"] is True
    assert rows[MEMORISED]["prefix_tokens"] == int(0.4 * len(records[MEMORISED]["prompt"]))
    bench = info["benchmarks"]["math500"]
    assert bench["n"] == len(probed) < LIMIT and bench["not_probed"] == {"prompt_too_long": len(over)}
    assert bench["capped"] == len(probed) and bench["n_exact"] == sum(r["exact"] for r in probed)


def test_split_and_measures():
    from aggbench.evaluation.probe import common_prefix, normalise, rouge_l, score_continuation, split_ids

    assert split_ids([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.6) == ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10])
    assert split_ids([1, 2], 0.99) == ([1], [2]) and split_ids([1, 2, 3], 0.01) == ([1], [2, 3])
    assert split_ids([1], 0.6) is None and split_ids([], 0.6) is None
    assert normalise("  a \n\tb  c ") == "a b c"
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0
    assert rouge_l("a b c d", "a b c d") == 1.0 and rouge_l("x y", "a b") == 0.0
    # LCS "a c d" = 3 of 4 candidate and 5 reference words: F1 = 2 * 3/4 * 3/5 / (3/4 + 3/5) = 2/3
    assert rouge_l("a x c d", "a b c d e") == pytest.approx(2 / 3)
    verdict = score_continuation([7, 8, 0, 0], " the  rest\n", [7, 8, 9, 10], "the rest")
    assert verdict == {"exact": True, "prefix_match": 0.5, "rouge_l": 1.0}


def test_probe_bad_inputs_name_the_field_and_the_fix(tiny_model, shared_data, tmp_path):
    from aggbench.evaluation.probe import ProbeOptions
    from aggbench.evaluation.score import EvaluationError

    def run(*args: str):
        argv = [
            "probe",
            "--checkpoint",
            str(tiny_model),
            "--out",
            str(tmp_path),
            "--data-dir",
            str(shared_data),
        ]
        return CliRunner().invoke(main, [*argv, *args])

    bad = run("--benchmarks", "math500", "--fraction", "1.5")
    assert bad.exit_code == 2 and "--fraction" in bad.output
    bad = run("--benchmarks", "math500,math500")
    assert bad.exit_code == 1 and "math500 twice" in bad.output and "Traceback" not in bad.output
    bad = run("--benchmarks", "no_such_benchmark")
    assert bad.exit_code == 1 and "no_such_benchmark" in bad.output and "math500" in bad.output
    bad = run("--benchmarks", "math500", "--tensor-parallel-size", "2")
    assert bad.exit_code == 1 and "--engine vllm" in bad.output
    with pytest.raises(EvaluationError, match=r"--fraction 0: must lie strictly between 0 and 1"):
        ProbeOptions(fraction=0)
    assert not list(tmp_path.iterdir())  # nothing written before the inputs are good
