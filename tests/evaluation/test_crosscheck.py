"""`aggbench crosscheck`: lm-eval and our harness produce the same greedy generation per item on the
tiny model offline; the comparison lists every difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from aggbench.cli import main


def test_crosscheck_tiny_model_offline_identical_generations(tiny_model, shared_data, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(shared_data))
    out = tmp_path / "xc"
    args = ["--checkpoint", str(tiny_model), "--benchmarks", "math500", "--limit", "3", "--max-tokens", "24"]
    result = CliRunner().invoke(main, ["crosscheck", *args, "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output  # --strict (default): exit 1 if any generation differed
    report = json.loads((out / "crosscheck.json").read_text())
    b = report["benchmarks"]["math500"]
    assert b["n_items"] == 3
    assert b["identical_prompts"] == 3 and b["prompt_diffs"] == []
    assert b["identical_generations"] == 3 and b["generation_diffs"] == []
    assert b["verdict_agreement"] + len(b["verdict_diffs"]) == 3
    assert b["context_overflow"] == []  # short prompts: lm-eval cut none of them
    assert report["ok"] is True

    # lm-eval's own logged samples: what it generated, for which prompt, with greedy settings
    samples = [json.loads(line) for line in (out / "lmeval_samples_math500.jsonl").read_text().splitlines()]
    assert len(samples) == 3
    for s in samples:
        context, gen_kwargs = s["arguments"][0]
        assert context == s["doc"]["prompt_text"] and context.startswith("<|bos|><|user|>")
        assert context.endswith("<|eos|><|assistant|>")  # the chat template applied once, by us
        assert gen_kwargs == {"until": [], "do_sample": False, "temperature": 0.0, "max_gen_toks": 24}
        assert s["resps"][0][0]  # a non-empty generation
    # the untrained model never stops early, so our generations ran to max_gen_toks = 24 tokens, and
    # lm-eval's are the same text: it respected max_gen_toks although the model's generation config
    # says max_new_tokens = 64 (the crosscheck hands lm-eval a directory without that key)
    assert b["finished"] == 0 and b["max_gen_toks"] == 24
    assert any("max_new_tokens=64" in note for note in report["notes"])

    # the task YAML reads the canonical records through an absolute path
    task = yaml.safe_load((out / "lmeval_tasks" / "aggbench_xc_math500.yaml").read_text())
    data_file = Path(task["dataset_kwargs"]["data_files"]["test"])
    assert data_file.is_absolute() and data_file.is_file()
    assert task["output_type"] == "generate_until" and task["doc_to_text"] == "prompt_text"


def lm_sample(doc_id: str, prompt: str, response: str, exact: float, extracted: str) -> dict:
    return {
        "doc": {"id": doc_id, "prompt_text": prompt, "target": "x"},
        "arguments": [[prompt, {"until": []}]],
        "resps": [[response]],
        "filtered_resps": [extracted],
        "exact_match": exact,
    }


def test_compare_lists_every_difference():
    from aggbench.evaluation.crosscheck import compare

    records = [{"id": "a", "answer": "1/2"}, {"id": "b", "answer": "3"}, {"id": "c", "answer": "4"}]
    texts = ["P(a)", "P(b)", "P(c)"]
    ours = [r"\boxed{\frac12}", r"\boxed{3}", r"\boxed{5}"]
    verdicts = [
        {"correct": True, "extracted": r"\frac12", "reason": "equivalent"},
        {"correct": True, "extracted": "3", "reason": "exact_match"},
        {"correct": False, "extracted": "5", "reason": "not_equivalent"},
    ]
    lm = [  # lm-eval's samples come in its own order
        lm_sample("c", "P(c)", r"\boxed{4}", 1.0, "4"),  # another generation
        lm_sample("a", "P(a)", r"\boxed{\frac12}", 0.0, r"\frac12"),  # exact match says no
        lm_sample("b", "P(b) ", r"\boxed{3}", 1.0, "3"),  # another prompt
    ]
    out = compare(records, texts, ours, verdicts, lm)
    assert out["identical_generations"] == 2
    assert out["generation_diffs"] == [
        {"id": "c", "first_difference_at": 7, "ours": r"\boxed{5}", "lmeval": r"\boxed{4}"}
    ]
    assert out["identical_prompts"] == 2 and out["prompt_diffs"] == ["b"]
    assert out["verdict_agreement"] == 1
    assert [
        (d["id"], d["ours_correct"], d["lmeval_correct"], d["same_generation"]) for d in out["verdict_diffs"]
    ] == [
        ("a", True, False, True),
        ("c", False, True, False),
    ]
    assert out["accuracy"] == {"ours": pytest.approx(2 / 3), "lmeval_exact_match": pytest.approx(2 / 3)}


def test_compare_refuses_missing_items():
    from aggbench.evaluation.crosscheck import compare

    with pytest.raises(ValueError, match="no sample for items"):
        compare([{"id": "a", "answer": "1"}], ["P"], ["r"], [{"correct": False}], [])


def test_shadow_model_dir_drops_max_new_tokens(tmp_path):
    from aggbench.evaluation.crosscheck import lmeval_model_dir

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "max_new_tokens": 64}))
    path, note = lmeval_model_dir(ckpt, tmp_path / "scratch")
    assert path != ckpt and "max_new_tokens=64" in note
    assert json.loads((path / "generation_config.json").read_text()) == {"eos_token_id": 2}
    assert (path / "config.json").resolve() == (ckpt / "config.json").resolve()
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert lmeval_model_dir(ckpt, tmp_path / "scratch2") == (ckpt, None)


def test_crosscheck_refuses_a_code_benchmark(model_cli):
    result = model_cli("crosscheck", "livecodebench")
    assert result.exit_code == 1 and "math benchmarks" in result.output
