"""``aggbench audit``: hand-worked weights, the named equivalents, the layout check, configs, the CLI.

The library-gradient checks are in test_audit_trl.py (TRL, core leg), test_audit_verl.py and
test_audit_sources.py (verl, OpenRLHF, SkyRL: the verl leg).
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import torch
from click.testing import CliRunner

from aggbench.aggregation.explain import make_batch
from aggbench.audit import audit, get_mode, modes, register_mode
from aggbench.audit.configs import read_config
from aggbench.cli import main
from aggbench.registry import RegistryError

# lengths 2, 3 | 1, 6 in micro-batches of 2: 5 and 7 tokens, 12 in all; width 6
LENGTHS, REWARDS, GROUPS = [2, 3, 1, 6], [1, 0, 1, 0], [0, 0, 1, 1]
F = Fraction
HAND = {  # (library, mode, settings) -> weight per token of each response, micro-batches of 2
    ("trl", "grpo", ()): [F(1, 2 * 2 * 2), F(1, 2 * 3 * 2), F(1, 2 * 1 * 2), F(1, 2 * 6 * 2)],
    ("trl", "bnpo", ()): [F(1, 5 * 2), F(1, 5 * 2), F(1, 7 * 2), F(1, 7 * 2)],
    ("trl", "dr_grpo", (("max_completion_length", 8),)): [F(1, 2 * 8 * 2)] * 4,
    ("trl", "dapo", ()): [F(1, 12)] * 4,
    ("trl", "cispo", ()): [F(1, 5) / 12] * 4,  # min(1, epsilon_high = epsilon = 0.2)
    ("trl", "luspo", ()): [F(1, 2 * 2)] * 4,
    ("verl", "token-sum", ()): [F(1)] * 4,
    ("verl", "seq-mean-token-sum", ()): [F(1, 4)] * 4,
    ("verl", "seq-mean-token-sum-norm", ()): [F(1, 4 * 6)] * 4,
    ("verl", "seq-mean-token-sum-norm", (("loss_scale_factor", 10),)): [F(1, 40)] * 4,
    ("verl", "seq-mean-token-mean", ()): [F(1, 8), F(1, 12), F(1, 4), F(1, 24)],
    ("skyrl", "token_mean_legacy", ()): [F(1, 5 * 2), F(1, 5 * 2), F(1, 7 * 2), F(1, 7 * 2)],
    ("skyrl", "prompt_mean", ()): [F(1, 2 * 5), F(1, 2 * 5), F(1, 2 * 7), F(1, 2 * 7)],
}


@pytest.mark.parametrize(("key", "expected"), list(HAND.items()), ids=[f"{k[0]}-{k[1]}" for k in HAND])
def test_hand_worked_weights(key, expected):
    library, name, settings = key
    batch = make_batch(LENGTHS, REWARDS, GROUPS)
    r = audit(batch, get_mode(library, name), micro_batch_size=2, settings=dict(settings))
    assert [len(w) for w in r.weights] == LENGTHS
    for got, want in zip(r.weights, expected, strict=True):
        assert got == pytest.approx([float(want)] * len(got), rel=1e-12)


EQUIVALENT = {  # (library, mode, micro-batch size, settings) -> (aggbench instance, scale)
    ("trl", "dapo", 2, ()): ("token", 1.0),
    ("trl", "vespo", 2, ()): ("token", 1.0),
    ("trl", "cispo", 2, ()): ("token", 0.2),
    ("trl", "cispo", 2, (("epsilon_high", 5.0),)): ("token", 1.0),
    ("trl", "grpo", 2, ()): ("sequence", 1.0),
    ("trl", "sapo", 2, ()): ("sequence", 1.0),
    ("trl", "luspo", 2, ()): ("seq_sum", 1.0),
    ("trl", "dr_grpo", 2, (("max_completion_length", 64),)): ("constant(max_length=64)", 1.0),
    ("trl", "bnpo", None, ()): ("token", 1.0),  # one micro-batch: the token mean
    ("trl", "bnpo", 2, ()): ("none", None),
    ("verl", "token-mean", 2, ()): ("token", 1.0),
    ("verl", "token-sum", 2, ()): ("none", None),
    ("verl", "seq-mean-token-sum", 2, ()): ("seq_sum", 1.0),
    ("verl", "seq-mean-token-sum-norm", 2, ()): ("constant", 1.0),
    ("verl", "seq-mean-token-mean", 2, ()): ("sequence", 1.0),
    ("openrlhf", "token-mean", 2, ()): ("token", 1.0),
    ("openrlhf", "seq-mean-token-mean", 2, ()): ("sequence", 1.0),
    ("skyrl", "token_mean", 2, ()): ("token", 1.0),
    ("skyrl", "token_mean_legacy", 2, ()): ("none", None),
    ("skyrl", "sequence_mean", 2, ()): ("sequence", 1.0),
    ("skyrl", "seq_mean_token_sum_norm", 2, ()): ("constant", 1.0),
    ("skyrl", "prompt_mean", 2, ()): ("token_group", 1.0),
}


@pytest.mark.parametrize(
    ("key", "expected"), list(EQUIVALENT.items()), ids=[f"{k[0]}-{k[1]}-{k[2]}" for k in EQUIVALENT]
)
def test_the_named_equivalent(key, expected):
    library, name, mb, settings = key
    batch = make_batch([10, 500, 20, 30, 7, 80], [1, 0, 1, 0, 1, 1], [0, 0, 1, 1, 2, 2])
    r = audit(batch, get_mode(library, name), micro_batch_size=mb, settings=dict(settings))
    assert r.equivalent == expected[0]
    if expected[1] is not None:
        assert r.equivalents[0].scale == pytest.approx(expected[1], rel=1e-9)


def test_the_docs_table_is_what_audit_answers():
    """docs/integrations.md's table of every mode, row by row: its "depends on the layout" and
    "equals" columns (with the scale where one is written, else 1) are what audit answers on the
    table's batch, micro-batches of 2, library defaults."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    rows = re.findall(
        r"^\| (trl|verl|openrlhf|skyrl) [\d.]+ \| `([^`]+)` \| [^|]+ \| ([^|]+) \| ([^|]+) \|$", text, re.M
    )
    assert len(rows) == 20, rows
    batch = make_batch([10, 500, 20, 30, 7, 80], [1, 0, 1, 0, 1, 1], [0, 0, 1, 1, 2, 2])
    for library, name, layout, equals in rows:
        r = audit(batch, get_mode(library, name), micro_batch_size=2)
        assert r.layout == layout.strip(), (library, name, r.layout)
        m = re.fullmatch(r"`([^`]+)`(?: x ([\d.]+))?(?: \(.*\))?", equals.strip())
        want, scale = (m.group(1), float(m.group(2) or 1)) if m else (equals.strip(), None)
        assert r.equivalent == want, (library, name, r.equivalent)
        if scale is not None:
            assert r.equivalents[0].scale == pytest.approx(scale, rel=1e-6), (library, name)


def test_token_sum_is_token_times_a_factor_that_follows_the_batch():
    batch = make_batch([10, 500, 20, 30], [1, 0, 1, 0])
    r = audit(batch, get_mode("verl", "token-sum"))
    assert r.equivalent == "none"
    assert r.proportional[0].name == "token" and r.proportional[0].scale == pytest.approx(560)


@pytest.mark.parametrize(
    ("library", "name", "answer"),
    [
        ("trl", "bnpo", "yes"),
        ("skyrl", "token_mean_legacy", "yes"),
        ("trl", "grpo", "unequal micro-batches only"),
        ("trl", "dapo", "no"),
        ("verl", "seq-mean-token-mean", "no"),
    ],
)
def test_layout_dependence(library, name, answer):
    batch = make_batch(LENGTHS, REWARDS, GROUPS)
    assert audit(batch, get_mode(library, name), micro_batch_size=2).layout == answer


def test_the_equivalence_check_can_fail(monkeypatch):
    """A mode that is dapo except one response's weights off by 0.1% is no rule."""
    registry = modes._REGISTRIES["trl"]
    monkeypatch.setattr(registry, "_entries", dict(registry._entries))  # the test's mode goes away after

    @register_mode("trl", "test-almost-dapo", source="test", normaliser="test")
    def almost(mask, micro, settings):
        w = mask / mask.sum()
        w[0] *= 1.001
        return w

    batch = make_batch(LENGTHS, REWARDS, GROUPS)
    r = audit(batch, get_mode("trl", "test-almost-dapo"))
    assert r.equivalent == "none" and r.proportional == []


def test_per_sign_totals_and_push_are_sums_of_weight_times_advantage():
    batch = make_batch(LENGTHS, REWARDS, GROUPS)
    r = audit(batch, get_mode("trl", "dapo"))
    adv = batch.advantages
    push = [sum(abs(w * adv[i]) for w in ws) for i, ws in enumerate(r.weights)]
    assert r.push == pytest.approx(push)
    assert r.weight_pos == pytest.approx(sum(p for p, a in zip(push, adv, strict=True) if a > 0))
    assert r.weight_neg == pytest.approx(sum(p for p, a in zip(push, adv, strict=True) if a < 0))
    # dapo (token mean) pushes the 6-token wrong answer 6x as hard as the 1-token right one
    assert r.push[3] / r.push[2] == pytest.approx(6.0)


def test_unknown_mode_and_setting_errors_name_the_valid_ones():
    with pytest.raises(RegistryError, match=r"Did you mean 'dr_grpo'\?.*Valid names: bnpo, cispo"):
        get_mode("trl", "drgrpo")
    with pytest.raises(ValueError, match="reads no such setting; it reads: max_completion_length"):
        audit(make_batch([1], [1]), get_mode("trl", "dr_grpo"), settings={"epsilon_high": 1.0})


# ----------------------------------------------------------------------------- config files


def test_trl_config_yaml_and_json(tmp_path):
    (tmp_path / "grpo.yaml").write_text(
        "output_dir: out\nloss_type: dr_grpo\nmax_completion_length: 1024\nper_device_train_batch_size: 4\n"
    )
    s = read_config(tmp_path / "grpo.yaml")
    assert (s.library, s.mode, s.settings, s.micro_batch_size) == (
        "trl",
        "dr_grpo",
        {"max_completion_length": 1024},
        4,
    )
    (tmp_path / "grpo.json").write_text(json.dumps({"num_generations": 8}))
    assert read_config(tmp_path / "grpo.json").mode == "dapo"  # TRL 1.16's default loss_type


def test_verl_yaml_and_override_list(tmp_path):
    (tmp_path / "ppo.yaml").write_text(
        "actor_rollout_ref:\n  actor:\n    loss_agg_mode: seq-mean-token-sum-norm\n    loss_scale_factor: 4096\n"
    )
    s = read_config(tmp_path / "ppo.yaml")
    assert (s.library, s.mode, s.settings) == ("verl", "seq-mean-token-sum-norm", {"loss_scale_factor": 4096})
    (tmp_path / "run.sh").write_text(
        "python3 -m verl.trainer.main_ppo \\\n    algorithm.adv_estimator=grpo \\\n"
        "    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean \\\n"
        "    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 $@\n"
    )
    s = read_config(tmp_path / "run.sh")
    assert (s.library, s.mode, s.micro_batch_size) == ("verl", "seq-mean-token-mean", 8)
    (tmp_path / "defaults.txt").write_text("data.train_batch_size=32\n")
    assert read_config(tmp_path / "defaults.txt").mode == "token-mean"  # verl's default


def test_a_config_naming_neither_trainer_is_refused(tmp_path):
    (tmp_path / "x.yaml").write_text("lr: 1e-6\n")
    with pytest.raises(ValueError, match="names no TRL or verl loss setting"):
        read_config(tmp_path / "x.yaml")


def test_a_launch_scripts_shell_variables_and_broken_files_are_named_not_tracebacks(tmp_path):
    """What users' files hold: `key=$VAR` (a string to the parser), a YAML with a tab and an
    apostrophe (neither YAML nor an override list). Each is an error naming the key or the problem."""
    cases = [
        (
            "run.sh",
            "MICRO_BS=4\npython3 -m verl.trainer.main_ppo \\\n"
            "    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean \\\n"
            "    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO_BS\n",
            r"micro-batch-size is '\$MICRO_BS', not an integer .*--micro-batch-size N",
        ),
        (
            "scale.sh",
            "python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm "
            "actor_rollout_ref.actor.loss_scale_factor=$L\n",
            r"loss_scale_factor is '\$L', not an integer .*--loss-scale-factor N",
        ),
        (
            "trl.yaml",
            "loss_type: dr_grpo\nmax_completion_length: 1024\n\tbeta: 0.0\nrun_name: qwen's run\n",
            r"not valid YAML, and not a key=value override list either \(as YAML: .*line 3.*; as overrides: No "
            "closing quotation",
        ),
        (
            "tab.yaml",
            "loss_type: dr_grpo\n\tbeta: 0.0\n",
            r"names no TRL or verl loss setting \(as YAML: .*line 2",
        ),
    ]
    for name, text, message in cases:
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=message):
            read_config(tmp_path / name)
    (tmp_path / "utf16.yaml").write_text("loss_type: dr_grpo\n", encoding="utf-16")
    with pytest.raises(
        ValueError,
        match=r"utf16.yaml: not UTF-8 text \(byte 0xff at byte 1 of the file; it looks like UTF-16",
    ):
        read_config(tmp_path / "utf16.yaml")
    batch = ["--lengths", "2,3,1,6", "--rewards", "1,0,1,0"]
    out = CliRunner().invoke(main, ["audit", "--config", str(tmp_path / "run.sh"), *batch])
    assert out.exit_code != 0 and "Traceback" not in out.output and "$MICRO_BS" in out.output, out.output
    # the fix the message names: the command line gives the value, which replaces the file's
    for name, flag in (("run.sh", "--micro-batch-size"), ("scale.sh", "--loss-scale-factor")):
        out = CliRunner().invoke(main, ["audit", "--config", str(tmp_path / name), flag, "2", *batch])
        assert out.exit_code == 0, out.output
    assert (
        "micro-batch size: 2"
        in CliRunner()
        .invoke(main, ["audit", "--config", str(tmp_path / "run.sh"), "--micro-batch-size", "2", *batch])
        .output
    )


# ----------------------------------------------------------------------------- the command


def test_cli_json_gives_weights_per_token_and_the_equivalent():
    out = CliRunner().invoke(
        main,
        ["audit", "--trl-loss-type", "dapo", "--verl-loss-agg-mode", "seq-mean-token-mean"]
        + ["--lengths", "2,3,1,6", "--rewards", "1,0,1,0", "--group-size", "2", "--format", "json"],
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    trl, verl = data["audits"]
    assert [len(w) for w in trl["weights"]] == LENGTHS
    assert trl["weights"][0] == pytest.approx([1 / 12, 1 / 12])
    assert (trl["equivalent"], verl["equivalent"]) == ("token", "sequence")
    assert verl["weights"][3] == pytest.approx([1 / 24] * 6)


def test_cli_table_and_config(tmp_path):
    (tmp_path / "grpo.yaml").write_text("loss_type: bnpo\nper_device_train_batch_size: 2\n")
    out = CliRunner().invoke(
        main,
        ["audit", "--config", str(tmp_path / "grpo.yaml"), "--lengths", "2,3,1,6", "--rewards", "1,0,1,0"],
    )
    assert out.exit_code == 0, out.output
    assert "trl loss_type=bnpo" in out.output
    assert "micro-batch size: 2" in out.output
    assert "depends on the micro-batch layout: yes" in out.output
    assert "equals aggbench rule: none" in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trl-loss-type", "grpoo"], "Did you mean 'grpo'"),
        (
            ["--verl-loss-agg-mode", "token-mean", "--epsilon-high", "2"],
            "no chosen loss mode reads this setting",
        ),
        ([], "give a loss setting"),
        (["--trl-loss-type", "dapo", "--micro-batch-size", "0"], "must be at least 1"),
    ],
)
def test_cli_errors_are_one_line_naming_the_option(args, message):
    out = CliRunner().invoke(main, ["audit", *args, "--lengths", "2,3", "--rewards", "1,0"])
    assert out.exit_code == 2, out.output
    assert message in out.output
    assert "Traceback" not in out.output


def test_rollouts_file_is_read_like_explain(tmp_path):
    rows = [{"group": "p1", "length": n, "reward": r} for n, r in zip(LENGTHS, REWARDS, strict=True)]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = CliRunner().invoke(
        main,
        [
            "audit",
            "--skyrl-loss-reduction",
            "sequence_mean",
            "--rollouts",
            str(tmp_path / "r.jsonl"),
            "--format",
            "json",
        ],
    )
    assert out.exit_code == 0, out.output
    w = json.loads(out.output)["audits"][0]["weights"]
    assert [x[0] for x in w] == pytest.approx([1 / (4 * n) for n in LENGTHS])
    assert torch.tensor(w[3]).unique().numel() == 1


def test_the_documented_audit_commands_run():
    """README's and docs/integrations.md's `aggbench audit` lines that need no file run as written."""
    import re
    import shlex
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    text = (repo / "README.md").read_text() + (repo / "docs" / "integrations.md").read_text()
    text = re.sub(r"\\\n\s*", " ", text)  # shell line continuations
    lines = [
        ln.strip()
        for ln in re.findall(r"^ *aggbench audit [^\n]*", text, re.M)
        if "--lengths" in ln and "..." not in ln
    ]
    assert len(lines) >= 2
    for line in lines:
        args = shlex.split(line.split("#")[0])[1:]
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 0, (line, out.output)
        assert "equals aggbench rule:" in out.output
