"""The train rule launches torchrun, one process per GPU, when a cell's train job asks for more than one
GPU, and the plain `aggbench train` otherwise; a vLLM generate job spans its GPUs with tensor
parallelism (checked on the dry run's shell commands)."""

from __future__ import annotations

import re


def _commands(text: str, rule: str = "train", wildcard: str = "cell") -> dict[str, str]:
    """{model name: shell command} of the `rule` jobs in `snakemake -n -p` output."""
    out = {}
    for block in text.split(f"rule {rule}:")[1:]:
        value = re.search(rf"wildcards: {wildcard}=([^,\s]+)", block).group(1)
        out[value.split("__")[0]] = re.search(r"Shell command: (.*)", block).group(1)
    return out


def test_multi_gpu_train_jobs_use_torchrun(wf, tmp_path):
    # the paper grid: 8 GPUs for Qwen2.5-Math-7B; Qwen3-1.7B set to one GPU here
    cfg = wf.write_config(
        tmp_path / "paper.yaml",
        {
            "results_dir": str(tmp_path / "results"),
            "models": {"qwen3-1.7b": {"resources": {"train": {"gpus": 1}}}},
        },
        base=wf.PAPER,
    )
    proc = wf.run(["-n", "-p", "--cores", "16", "--configfile", str(cfg)])
    cmds = _commands(proc.stdout)
    assert set(cmds) == {"qwen2.5-math-7b", "qwen3-1.7b"}
    big = cmds["qwen2.5-math-7b"]
    # 16 local cores cap the job's 32 CPUs: 2 threads for each of the 8 processes
    assert "OMP_NUM_THREADS=2 torchrun --standalone --nproc_per_node 8 -m aggbench.cli train --config" in big
    small = cmds["qwen3-1.7b"]
    assert "torchrun" not in small and "; aggbench train --config" in small


def test_vllm_generate_jobs_span_their_gpus_with_tensor_parallelism(wf, tmp_path):
    # the paper grid evaluates with vLLM; Qwen2.5-Math-7B's generate jobs get 2 GPUs here
    cfg = wf.write_config(
        tmp_path / "paper.yaml",
        {
            "results_dir": str(tmp_path / "results"),
            "models": {"qwen2.5-math-7b": {"resources": {"generate": {"gpus": 2}}}},
        },
        base=wf.PAPER,
    )
    proc = wf.run(["-n", "-p", "--configfile", str(cfg)])
    for rule, wildcard in (("generate", "cell"), ("generate_base", "model")):
        cmds = _commands(proc.stdout, rule, wildcard)
        assert set(cmds) == {"qwen2.5-math-7b", "qwen3-1.7b"}, rule
        assert "--engine vllm" in cmds["qwen2.5-math-7b"]
        assert "--tensor-parallel-size 2" in cmds["qwen2.5-math-7b"], cmds["qwen2.5-math-7b"]
        assert "--tensor-parallel-size" not in cmds["qwen3-1.7b"]  # one GPU: vLLM's default
