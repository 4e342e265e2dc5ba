"""The train rule launches torchrun, one process per GPU, when a cell's train job asks for more than one
GPU, and the plain `aggbench train` otherwise (checked on the dry run's shell commands)."""

from __future__ import annotations

import re


def _train_commands(text: str) -> dict[str, str]:
    """{model name: shell command} of the train jobs in `snakemake -n -p` output."""
    out = {}
    for block in text.split("rule train:")[1:]:
        cell = re.search(r"wildcards: cell=([^,\s]+)", block).group(1)
        out[cell.split("__")[0]] = re.search(r"Shell command: (.*)", block).group(1)
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
    cmds = _train_commands(proc.stdout)
    assert set(cmds) == {"qwen2.5-math-7b", "qwen3-1.7b"}
    big = cmds["qwen2.5-math-7b"]
    # 16 local cores cap the job's 32 CPUs: 2 threads for each of the 8 processes
    assert "OMP_NUM_THREADS=2 torchrun --standalone --nproc_per_node 8 -m aggbench.cli train --config" in big
    small = cmds["qwen3-1.7b"]
    assert "torchrun" not in small and "; aggbench train --config" in small
