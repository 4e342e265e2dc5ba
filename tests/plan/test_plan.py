"""`aggbench plan` checked against measurement, not against its own formulas.

- Job counts: against the real `snakemake -n` of the paper grid (per rule, and SLURM vs local).
- Parameter counts of the built-in paper models: against the published totals.
- Memory: a real model on CPU, measured. Parameter, gradient and AdamW-state bytes after one real
  optimizer step, and the bytes saved for backward by one micro-batch forward (collected with
  torch.autograd.graph.saved_tensors_hooks, each storage once), must be within 10% of
  aggbench.plan.costmodel's estimate, for Llama (the tiny model), Qwen2 (q/k/v biases, untied
  embeddings) and Qwen3 (q/k norms) architectures, bf16 autocast and fp32, with and without
  activation checkpointing.
- benchmarks/gpu_check.py: runs with --allow-cpu and prints its numbers; refuses without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from aggbench.cli import main
from aggbench.plan.costmodel import BUILTIN_SHAPES, ModelShape, train_memory
from aggbench.plan.jobs import LOCAL_RULES

REPO = Path(__file__).resolve().parents[2]
PAPER, SMOKE = REPO / "configs" / "paper.yaml", REPO / "configs" / "smoke.yaml"


def plan_json(config: Path) -> dict:
    result = CliRunner().invoke(main, ["plan", str(config), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def dry_run(config: Path, results: Path) -> str:
    exe = Path(sys.executable).with_name("snakemake")
    cmd = [str(exe) if exe.exists() else shutil.which("snakemake"), "-n", "--configfile", str(config)]
    proc = subprocess.run(
        [*cmd, "--config", f"results_dir={results}"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def job_stats(text: str) -> dict[str, int]:
    """Snakemake's 'Job stats' table as {rule: count}."""
    lines = text.splitlines()
    start = lines.index("Job stats:")
    counts = {}
    for line in lines[start + 3 :]:
        m = re.fullmatch(r"\s*(\w+)\s+(\d+)\s*", line)
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def job_blocks(text: str) -> list[dict]:
    """{rule, wildcards, resources} of every job block of a dry run."""
    out = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", text):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if not m:
            continue
        job = {"rule": m.group(1)}
        for key in ("wildcards", "resources"):
            found = re.search(rf"^\s+{key}: (.*)$", block, re.M)
            job[key] = dict(p.split("=", 1) for p in found.group(1).split(", ") if "=" in p) if found else {}
        out.append(job)
    return out


def declared_local_rules() -> set[str]:
    """Rule names under every `localrules:` directive of the workflow's rule files."""
    names: set[str] = set()
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        for block in re.findall(r"^localrules:\s*\n((?:[ \t]+\w+,?\s*\n)+)", smk.read_text(), re.M):
            names |= set(re.findall(r"\w+", block))
    assert names, "no localrules: directive found"
    return names


def test_paper_plan_jobs_equal_the_dry_run_dag(tmp_path):
    plan = plan_json(PAPER)
    text = dry_run(PAPER, tmp_path / "results")
    stats = job_stats(text)
    total = stats.pop("total")
    assert plan["jobs"]["rules"] == stats
    assert plan["jobs"]["total"] == total == 1096
    blocks = job_blocks(text)
    assert len(blocks) == total
    # SLURM gets every job but the workflow's local rules and the target rule `all` (no action)
    local = declared_local_rules() | {"all"}
    assert set(LOCAL_RULES) == local
    assert plan["jobs"]["slurm"] == sum(1 for j in blocks if j["rule"] not in local) == 1077
    assert plan["jobs"]["local"] == sum(1 for j in blocks if j["rule"] in local)
    # the plan's GPUs and walltime per model are the ones the jobs request
    train = {j["wildcards"]["cell"].split("__")[0]: j["resources"] for j in blocks if j["rule"] == "train"}
    assert set(train) == set(plan["models"])
    for model, mp in plan["models"].items():
        assert int(train[model]["gpu"]) == mp["train_gpus"]
        assert float(train[model]["runtime"]) / 60 == mp["segment_runtime_limit_hours"]
    # the readable table says the same
    table = CliRunner().invoke(main, ["plan", str(PAPER)])
    assert table.exit_code == 0, table.output
    assert "SLURM jobs: 1077" in table.output and "snakemake -n lists 1096" in table.output
    for cell in plan["cells"]:
        assert cell["cell"] in table.output


def test_paper_plan_numbers_hold_together():
    plan = plan_json(PAPER)
    assert len(plan["cells"]) == 12
    t = plan["totals"]
    assert t["complete"] and t["gpu_hours"] > 0
    assert t["gpu_hours"] == pytest.approx(
        sum(c["gpu_hours"] for c in plan["cells"]) + sum(plan["base_eval_gpu_hours"].values())
    )
    # requested = jobs x GPUs x walltime, from the config: 48 train jobs (6 cells x 8 segments) x 8
    # GPUs x 24 h (the 7B at its recipe's 10k tokens) + 48 x 4 x 12, plus 98 generate jobs x 1 GPU x 4 h
    assert t["requested_gpu_hours"] == 48 * 8 * 24 + 48 * 4 * 12 + 98 * 4
    # every default the plan used is named with its source
    assert {"gpu", "mfu.update", "mfu.generate"} <= set(plan["assumed"])
    for mp in plan["models"].values():
        assert mp["throughput"]["update_source"].startswith("assumed")
        mem = mp["memory"]
        update = mem["update"]["no_checkpointing"]
        assert update["peak"] == sum(v for k, v in update.items() if k != "peak")
        assert mem["update"]["checkpointing"]["activations"] < update["activations"]


def test_generate_jobs_on_several_gpus_are_planned_tensor_parallel(tmp_path):
    """`aggbench generate` spans a generate job's GPUs with vLLM tensor parallelism: per GPU, the
    weights halve on 2 GPUs and the KV heads split (Qwen2.5-Math-7B has 4), so more sequences fit."""
    cfg = yaml.safe_load(PAPER.read_text())
    cfg["models"]["qwen2.5-math-7b"]["resources"]["generate"]["gpus"] = 2
    path = tmp_path / "paper2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    one = plan_json(PAPER)["models"]["qwen2.5-math-7b"]["memory"]["generate_job"]
    two = plan_json(path)["models"]["qwen2.5-math-7b"]["memory"]["generate_job"]
    assert (one["tensor_parallel_size"], two["tensor_parallel_size"]) == (1, 2)
    assert one["weights_per_gpu"] == one["weights"] == 2 * two["weights_per_gpu"]
    # budget per GPU grows by half the weights and each sequence's KV per GPU halves: > 2x the room
    assert two["max_length_sequences_in_kv"] > 2 * one["max_length_sequences_in_kv"]
    table = CliRunner().invoke(main, ["plan", str(path)])
    assert "generate job (2 GPU, vLLM tensor-parallel 2)" in table.output


@pytest.mark.parametrize(
    "hub_id, total, non_embedding, digits",
    [
        # Qwen2.5-7B model card: 7.61B parameters, 6.53B non-embedding (Qwen2.5-Math-7B: same shape)
        ("Qwen/Qwen2.5-Math-7B", 7.61, 6.53, 2),
        # Qwen3-1.7B model card: 1.7B parameters, 1.4B non-embedding
        ("Qwen/Qwen3-1.7B", 1.7, 1.4, 1),
    ],
)
def test_builtin_shapes_reproduce_the_published_parameter_counts(hub_id, total, non_embedding, digits):
    """Within one unit of the last digit the model card prints (billions)."""
    shape, source = BUILTIN_SHAPES[hub_id]
    assert abs(shape.n_params() / 1e9 - total) <= 10**-digits
    assert abs(shape.n_non_embedding() / 1e9 - non_embedding) <= 10**-digits
    # ... and tying flips the total by a whole embedding matrix, far outside that
    assert shape.embedding_params() / 1e9 > 2 * 10**-digits
    assert "config.json" in source


def test_smoke_plan_is_a_cpu_plan_with_the_dag_counts():
    plan = plan_json(SMOKE)
    # by hand, as tests/workflow/test_dryrun.py: 3 cells x 3 segments, each evaluated on one benchmark
    assert plan["jobs"]["rules"] == {
        "prepare_model": 1, "prepare_data": 1, "fetch_benchmarks": 1, "experiment_config": 1, "cell_config": 3, "train": 9,
        "generate": 9, "grade": 9, "generate_base": 1, "grade_base": 1, "report": 1, "all": 1,
    }  # fmt: skip
    tiny = plan["models"]["tiny"]
    assert tiny["train_gpus"] == 0 and plan["totals"]["gpu_hours"] == 0
    assert tiny["memory"]["capacity_of"] == "resources.train.mem_mb"
    assert tiny["memory"]["peak"] < tiny["memory"]["capacity"] and not tiny["warnings"]
    assert "not estimated on CPU" in tiny["throughput"]["update_source"]


def _write_config(tmp_path: Path, over: dict) -> Path:
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["results_dir"] = str(tmp_path / "results")  # never the checkout's results/ (a smoke run's models)
    for key, value in over.items():
        cfg[key] = value
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_plan_block_inputs_and_errors(tmp_path):
    qwen3 = tmp_path / "qwen3" / "config.json"
    qwen3.parent.mkdir()
    qwen3.write_text(json.dumps({"model_type": "qwen3", "hidden_size": 2048, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144,
        "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": True}))  # fmt: skip
    cfg = _write_config(
        tmp_path,
        {
            "models": {"tiny": {"source": "someorg/unknown-model"}},
            "resources": {"train": {"gpus": 2, "runtime": 60}, "generate": {"gpus": 1}},
            "plan": {
                "models": {
                    "tiny": {"config": str(qwen3.parent), "throughput": {"generate": 1000.0, "update": 500.0}}
                }
            },
        },
    )
    plan = plan_json(cfg)
    mp = plan["models"]["tiny"]
    assert mp["params"] == BUILTIN_SHAPES["Qwen/Qwen3-1.7B"][0].n_params()
    assert mp["throughput"]["update"] == 500.0 and mp["throughput"]["update_source"] == "configured"
    # 8 prompts x 8 samples x 64 tokens / 1000 tok/s + 64 x (256 + 64) / 500, per step, 12 steps
    assert mp["step_gpu_seconds"] == pytest.approx(64 * 64 / 1000 + 64 * 320 / 500)
    assert mp["train_gpu_hours_per_cell"] == pytest.approx(mp["step_gpu_seconds"] * 12 / 3600)

    runner = CliRunner()
    bad = _write_config(tmp_path, {"models": {"tiny": {"source": "someorg/unknown-model"}}})
    out = runner.invoke(main, ["plan", str(bad)])
    assert out.exit_code != 0 and "plan.models.tiny.config" in out.output
    bad = _write_config(tmp_path, {"plan": {"models": {"qwen": {"mean_prompt_tokens": 10}}}})
    out = runner.invoke(main, ["plan", str(bad)])
    assert out.exit_code != 0 and "'qwen' not in models" in out.output and "allowed: tiny" in out.output
    bad = _write_config(tmp_path, {"plan": {"mfu": {"updat": 0.3}}})
    out = runner.invoke(main, ["plan", str(bad)])
    assert out.exit_code != 0 and "plan.mfu" in out.output and "'updat'" in out.output
    # a config that is not a decoder's config.json (generation_config.json), or a torn one: one line
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_p": 0.95}))
    (tmp_path / "torn.json").write_text('{"hidden_size": 20')
    (tmp_path / "list.json").write_text("[1, 2]")
    sizes = {"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 16}
    (tmp_path / "4k.json").write_text(json.dumps({"hidden_size": "4k", **sizes}))
    (tmp_path / "latin1.json").write_bytes('{"model_type": "qwen2", "name": "modèle"}'.encode("latin-1"))
    for name, message in (
        ("generation_config.json", "missing hidden_size"),
        ("torn.json", "is not valid JSON"),
        ("list.json", "expected a JSON object, got list"),
        ("4k.json", "not a decoder's sizes (ValueError: invalid literal for int()"),
        ("latin1.json", "not UTF-8 text (byte 0xe8 at byte "),
        ("nowhere", "nowhere does not exist (expected a model's config.json); point it at a model's"),
    ):
        given = {"models": {"tiny": {"source": "someorg/unknown-model"}}}
        bad = _write_config(
            tmp_path, {**given, "plan": {"models": {"tiny": {"config": str(tmp_path / name)}}}}
        )
        out = runner.invoke(main, ["plan", str(bad)])
        assert out.exit_code == 1 and not isinstance(out.exception, ValueError), out.output
        assert "plan.models.tiny.config: " in out.output and message in out.output, out.output
    # a prepared model whose config.json is torn: the file, and how to mend it
    prepared = tmp_path / "results" / "models" / "tiny"
    prepared.mkdir(parents=True)
    (prepared / "config.json").write_text('{"hidden_size": 20')
    out = runner.invoke(
        main, ["plan", str(_write_config(tmp_path, {"models": {"tiny": {"source": "someorg/x"}}}))]
    )
    assert out.exit_code == 1 and f"models.tiny: {prepared / 'config.json'} is not valid JSON" in out.output
    assert "aggbench prepare-model ... --force) or set plan.models.tiny.config" in out.output, out.output


# --------------------------------------------------------------------------- measured on CPU
B, L, T = 3, 50, 20  # micro-batch rows, tokens per row, response tokens per row


def _models(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    from helpers.tiny_models import tiny_model_for_tests

    small = dict(vocab_size=300, hidden_size=192, intermediate_size=448, num_hidden_layers=3,
                 num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    yield "tiny-llama", tiny_model_for_tests(tmp_path)  # the built-in tiny model, untrained
    for name, cfg in (
        ("qwen2", Qwen2Config(**small, tie_word_embeddings=False)),
        ("qwen3", Qwen3Config(**small, head_dim=40, tie_word_embeddings=True)),
    ):
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / name)
        yield name, tmp_path / name


def _is_param_cast(t: torch.Tensor) -> bool:
    """A bf16 copy of a parameter that autocast made (its graph leads straight to AccumulateGrad)."""
    fn = t.grad_fn
    for _ in range(4):
        if fn is None:
            return False
        if type(fn).__name__ == "AccumulateGrad":
            return True
        if type(fn).__name__ not in ("ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0"):
            return False
        fn = fn.next_functions[0][0]
    return False


def _measure(model_dir: Path, precision: str, checkpointing: bool) -> dict[str, int]:
    """Bytes of params, grads, AdamW state (after one real step) and of what one micro-batch forward
    saves for backward (activations; bf16 parameter casts apart), each storage counted once."""
    from transformers import AutoModelForCausalLM

    from aggbench.train.logprobs import response_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.config.vocab_size, (B, L), generator=gen)
    # no padding: SDPA then takes its flash kernel on CPU as on a GPU (with a padding mask the CPU
    # falls back to the math kernel, which keeps the L x L probabilities; CUDA's memory-efficient
    # kernel does not)
    attn = torch.ones(B, L, dtype=torch.long)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, tuple[int, bool]] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params and key not in saved:
            saved[key] = (t.untyped_storage().nbytes(), _is_param_cast(t))
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        logp, ent = response_logprobs(model, ids, attn, T, with_entropy=True)
    (-(logp.sum()) - 0.01 * ent.sum()).backward()
    opt.step()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    ps = list(model.parameters())
    return {
        "params": sum(p.numel() * p.element_size() for p in ps),
        "grads": sum(p.grad.numel() * p.grad.element_size() for p in ps),
        "optimizer": sum(t.numel() * t.element_size() for t in state),
        "activations": sum(n for n, cast in saved.values() if not cast),
        "weights16": sum(n for n, cast in saved.values() if cast),
    }


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")
@pytest.mark.parametrize("precision, checkpointing", [("bf16", False), ("fp32", False), ("bf16", True)])
def test_memory_estimate_within_10_percent_of_measured_bytes(tmp_path, precision, checkpointing):
    torch.set_num_threads(1)
    for name, model_dir in _models(tmp_path):
        if checkpointing and name != "tiny-llama":
            continue  # the checkpointed layer is the same decoder layer for all three
        measured = _measure(model_dir, precision, checkpointing)
        shape = ModelShape.from_file(model_dir)  # what `aggbench plan` reads
        est = train_memory(
            shape, shards=1, micro_batch=B, seq_len=L, response_len=T, checkpointing=checkpointing,
            precision=precision,
        )  # fmt: skip
        keys = ["params", "grads", "optimizer", "activations"]
        # checkpointing casts weights again inside each recomputed layer: only the unchecked path
        # keeps every cast, so only there is weights16 the whole story
        keys += ["weights16"] if precision == "bf16" and not checkpointing else []
        for key in keys:
            assert est[key] == pytest.approx(measured[key], rel=0.10), (name, key, est[key], measured[key])
        if precision == "fp32":
            assert measured["weights16"] == 0 == est["weights16"]
        print(name, precision, "ckpt" if checkpointing else "", {k: (measured[k], est[k]) for k in keys})


# --------------------------------------------------------------------------- benchmarks/gpu_check.py
GPU_CHECK = [sys.executable, str(REPO / "benchmarks" / "gpu_check.py")]
SMALL = ["--steps", "2", "--prompts", "2", "--group", "4", "--max-new-tokens", "16", "--micro-batch", "8"]


def test_gpu_check_runs_on_cpu_with_allow_cpu(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [*GPU_CHECK, "--allow-cpu", *SMALL, "--workdir", str(tmp_path / "w"), "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"generation: [\d,]+ tokens/s", proc.stdout), proc.stdout
    assert re.search(r"update: +[\d,]+ tokens/s", proc.stdout), proc.stdout
    assert "aggbench plan estimate" in proc.stdout and "README: |" in proc.stdout
    result = json.loads(out.read_text())
    assert [s["step"] for s in result["steps"]] == [1, 2]
    for s in result["steps"]:  # 2 prompts x 4 samples of 1..16 tokens
        assert s["sequences"] == 8 and 8 <= s["generated_tokens"] <= 8 * 16
        assert s["update_tokens"] > s["generated_tokens"]
    assert result["generate_tokens_per_s"] > 0 and result["update_tokens_per_s"] > 0
    assert result["peak_memory_bytes"] is None  # not measurable on CPU
    assert result["plan_estimate"]["peak"] > 0


def test_gpu_check_refuses_cpu_without_allow_cpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([*GPU_CHECK, *SMALL], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    assert "no CUDA GPU" in proc.stderr and "--allow-cpu" in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_peak_memory_is_near_the_plan_on_a_gpu(tmp_path):
    """On a GPU, the measured peak (torch.cuda.max_memory_allocated over the whole run) against the
    plan's estimate for the same settings. The plan counts tensors, not allocator workspaces
    (cuBLAS) or optimizer temporaries, hence a factor-1.5 band. Not yet run on a GPU: the band is
    a first guess to be tightened with the first measurement."""
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [*GPU_CHECK, "--steps", "3", "--workdir", str(tmp_path / "w"), "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    ratio = result["peak_memory_bytes"] / result["plan_estimate"]["peak"]
    print(proc.stdout)
    assert 1 / 1.5 <= ratio <= 1.5, ratio


def test_the_greedy_row_adds_one_decode_per_problem_to_the_evaluation_bill(tmp_path):
    """evaluation.greedy (issue 28, item 4(b)) decodes each problem once more in the same generate job:
    with n = 4 samples on every benchmark, a checkpoint's evaluation tokens are 5/4 of those without."""
    cfg = yaml.safe_load(PAPER.read_text())
    cfg["evaluation"]["n"] = 4
    plans = {}
    for greedy in (True, False):
        cfg["evaluation"]["greedy"] = greedy
        path = tmp_path / f"greedy-{greedy}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        plans[greedy] = plan_json(path)
    assert {w["greedy"] for w in plans[True]["benchmarks"]} == {1}
    assert {w["greedy"] for w in plans[False]["benchmarks"]} == {0}
    for name, on in plans[True]["models"].items():
        off = plans[False]["models"][name]
        assert on["eval_tokens_per_checkpoint"] == pytest.approx(1.25 * off["eval_tokens_per_checkpoint"])
        assert on["eval_gpu_hours_per_checkpoint"] > off["eval_gpu_hours_per_checkpoint"]
