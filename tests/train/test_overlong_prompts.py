"""Issue 13, item 6: a prompt longer than ``sampling.max_prompt_tokens`` is dropped before training
(verl's ``data.filter_overlong_prompts``: keep a row iff its templated prompt ids number <= the
limit), with the count and ids reported; it never crashes a cell mid-run, and a resume never draws
it. ``aggbench prepare-data --fit-to CELL`` drops the same rows when the data is written; a
dataset none of whose prompts fits is refused naming the field and the fix."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggbench.config import load_train_config
from aggbench.data.jsonl import DataError
from aggbench.prompts import prompt_ids
from aggbench.train.loop import train
from aggbench.train.prompt_fit import fit_prompts
from helpers.trainer_support import cell_config, metrics_rows, stable, write_cell

LIMIT = 24
LONG = "7" * 200  # 200 characters: far over LIMIT with the tiny model's character tokenizer


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from helpers.tiny_models import tiny_model_for_tests

    return tiny_model_for_tests(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _cfg(tmp_path: Path, model: Path, data: Path, *, steps: int = 2, **overrides):
    over = {"tracking.enabled": False, "sampling.max_prompt_tokens": LIMIT, **overrides}
    return cell_config(tmp_path / "cell.yaml", model, data, steps=steps, every=1, overrides=over)


def _data(path: Path, prompts: dict[str, str]) -> Path:
    path.write_text(
        "".join(json.dumps({"id": k, "prompt": p, "answer": "a"}) + "\n" for k, p in prompts.items())
    )
    return path


def test_the_limit_counts_the_templated_prompt_and_keeps_a_prompt_of_exactly_the_limit(
    tmp_path, tiny_model, tokenizer
):
    cfg = _cfg(tmp_path, tiny_model, tmp_path / "unused.jsonl")
    template = len(prompt_ids(tokenizer, ""))  # the chat template's own tokens (bos, roles, eos)
    assert template > 0
    fits, over = "x" * (LIMIT - template), "x" * (LIMIT - template + 1)
    assert len(prompt_ids(tokenizer, fits)) == LIMIT  # the ids the trainer encodes, template included
    records = [{"id": "fits", "prompt": fits}, {"id": "over", "prompt": over}, {"id": "short", "prompt": "x"}]
    fit = fit_prompts(cfg, tokenizer, records, where="d.jsonl")
    assert [r["id"] for r in fit.kept] == ["fits", "short"]  # <= the limit is kept, as verl
    assert fit.dropped == [{"id": "over", "row": 2, "tokens": LIMIT + 1}]
    assert "dropped 1 of 3 prompts longer than sampling.max_prompt_tokens=24 tokens" in fit.summary()
    # dataset.prompt_template counts too: the same prompt no longer fits once it is wrapped
    wrapped = cfg.model_copy(
        update={"dataset": cfg.dataset.model_copy(update={"prompt_template": "Q: {prompt}"})}
    )
    assert [r["id"] for r in fit_prompts(wrapped, tokenizer, records, where="d.jsonl").kept] == ["short"]
    # without the chat template the raw text is counted (base models)
    raw = cfg.model_copy(update={"model": cfg.model.model_copy(update={"chat_template": False})})
    assert len(fit_prompts(raw, tokenizer, records, where="d.jsonl").kept) == 3


def test_an_overlong_prompt_is_dropped_not_a_mid_run_crash_and_a_resume_agrees(tmp_path, tiny_model, caplog):
    # 1 too-long prompt among 4: two steps of 4 prompts draw every record of the dataset, so the long one
    # would be drawn (today: ValueError "prompt 0 has 204 tokens, above sampling.max_prompt_tokens" at step 1 or 2)
    data = _data(
        tmp_path / "data.jsonl", {"s1": "1+1=", "long": LONG, "s2": "2+2=", "s3": "3+3=", "s4": "4+4="}
    )
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    with caplog.at_level(logging.WARNING, logger="aggbench.train.prompt_fit"):
        train(_cfg(tmp_path, tiny_model, data), whole)
    assert f"{data}: dropped 1 of 5 prompts longer than sampling.max_prompt_tokens=24 tokens" in caplog.text
    assert "long" in caplog.text
    report = json.loads((whole / "prompt_filter.json").read_text())
    assert report["rows"] == 5 and report["kept"] == 4 and report["dropped"] == 1
    assert report["dropped_rows"] == [{"id": "long", "row": 2, "tokens": len(LONG) + 4}]
    assert report["max_prompt_tokens"] == LIMIT and (whole / report["data"]).resolve() == data.resolve()
    assert [r["step"] for r in metrics_rows(whole)] == [1, 2]
    saved = [
        json.loads(x)
        for f in sorted((whole / "rollouts").glob("*.jsonl"))
        for x in f.read_text().splitlines()
    ]
    assert saved and not any(LONG in json.dumps(row) for row in saved)
    # a segment, then a resume: the same kept records, the same draws, the same run
    train(_cfg(tmp_path, tiny_model, data), parts, until_step=1)
    train(_cfg(tmp_path, tiny_model, data), parts)
    assert [stable(r) for r in metrics_rows(parts)] == [stable(r) for r in metrics_rows(whole)]
    assert json.loads((parts / "prompt_filter.json").read_text()) == report


def test_a_dataset_with_no_prompt_that_fits_is_refused_naming_the_field_and_the_fix(tmp_path, tiny_model):
    data = _data(tmp_path / "long.jsonl", {"a": LONG, "b": LONG + "8"})
    with pytest.raises(DataError) as err:
        train(_cfg(tmp_path, tiny_model, data), tmp_path / "run")
    msg = str(err.value)
    assert msg.startswith(f"{data}: every one of its 2 prompts is longer than sampling.max_prompt_tokens=24")
    assert f"(the shortest has {len(LONG) + 4})" in msg
    assert (
        "models.<model>.training.sampling.max_prompt_tokens" in msg
        and "raise sampling.max_prompt_tokens" in msg
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---------------------------------------------------------------- prepare-data --fit-to


def _prepare(spec: str, *args: str, env: dict | None = None):
    from aggbench.cli import main

    return CliRunner().invoke(main, ["prepare-data", spec, *args], env=env, catch_exceptions=False)


def _cell_with_limit(tmp_path: Path, model: Path, limit: int) -> Path:
    cell = write_cell(tmp_path / "cell.yaml", model, tmp_path / "unused.jsonl")
    cell.write_text(
        cell.read_text().replace("max_new_tokens: 40", f"max_new_tokens: 40\n  max_prompt_tokens: {limit}")
    )
    assert load_train_config(cell).sampling.max_prompt_tokens == limit
    return cell


def test_prepare_data_fit_to_drops_the_rows_over_the_cells_limit_and_lists_them(
    tmp_path, tiny_model, tokenizer
):
    # ten problems of 1..10 characters; the spec's instruction template adds "\nA:" (3 characters),
    # the tiny model's chat template 4 tokens: row k is k + 7 token ids long as the trainer encodes it
    (tmp_path / "mix.jsonl").write_text(
        "".join(json.dumps({"id": f"r{k}", "q": "x" * k, "a": "1"}) + "\n" for k in range(1, 11))
    )
    spec = tmp_path / "mix.yaml"
    spec.write_text(
        "name: mix\nversion: 1\noffline_file: mix.jsonl\nfields: {id: id, prompt: q, answer: a}\n"
        'instruction_template: "{prompt}\\nA:"\nuse_chat_template: true\ngrader: {name: tiny}\n'
    )
    assert len(prompt_ids(tokenizer, "x" * 6 + "\nA:")) == 13
    cell = _cell_with_limit(tmp_path, tiny_model, 13)  # rows 1..6 fit (13 <= 13), rows 7..10 do not
    out = tmp_path / "prepared" / "mix.jsonl"
    res = _prepare(
        str(spec), "--out", str(out), "--fit-to", str(cell), env={"AGGBENCH_DATA_DIR": str(tmp_path)}
    )
    assert res.exit_code == 0, res.output
    report_file = tmp_path / "prepared" / "mix.filter.json"
    assert (
        "mix: dropped 4 of 10 prompts longer than sampling.max_prompt_tokens=13 tokens "
        f"(chat template applied): r7, r8, r9, r10 (listed in {report_file})" in res.output
    )
    assert f"mix: 6 records -> {out}" in res.output
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == [f"r{k}" for k in range(1, 7)]
    report = json.loads(report_file.read_text())
    assert report["dropped_rows"] == [{"id": f"r{k}", "row": k, "tokens": k + 7} for k in range(7, 11)]
    assert (report["rows"], report["kept"], report["dropped"]) == (10, 6, 4)
    assert report["tokenizer"] == str(tiny_model) and report["fit_to"] == str(cell)


def test_prepare_data_fit_to_refuses_when_no_row_fits(tmp_path, tiny_model):
    cell = _cell_with_limit(tmp_path, tiny_model, 3)
    out = tmp_path / "tiny.jsonl"
    res = _prepare("tiny", "--out", str(out), "--limit", "5", "--fit-to", str(cell))
    assert res.exit_code == 1
    assert "every one of its 5 prompts is longer than sampling.max_prompt_tokens=3" in res.output
    assert "raise sampling.max_prompt_tokens" in res.output and "Traceback" not in res.output
    assert not out.exists()
