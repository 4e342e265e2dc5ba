"""`aggbench explain` and `aggbench rules`, through the real CLI (click runner and one real process)."""

from __future__ import annotations

import json
import math
import re
import shlex
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from aggbench.aggregation import builtin_instances, rule_names
from aggbench.aggregation.contract import RULES
from aggbench.cli import main
from helpers.support import REPO_ROOT

BUILTIN = list(builtin_instances())
SQRT2 = math.sqrt(2.0)


def run(*args: str, ok: bool = True):
    result = CliRunner().invoke(main, list(args))
    if ok:
        assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def explain_json(*args: str) -> dict:
    return json.loads(run("explain", *args, "--format", "json").stdout)


# ----------------------------------------------------------------------------- table and JSON


def test_table_names_every_rule_and_marks_zero_advantage():
    out = run(
        "explain", "--lengths", "10,500,20,30,7,7", "--rewards", "1,0,1,0,1,1", "--group-size", "2"
    ).stdout
    for name in BUILTIN:
        assert f"== {name}: " in out, name
        assert re.search(rf"^  {re.escape(name)}\s+\S+\s+\S+\s+\S+$", out, re.M), (
            f"{name} missing from summary"
        )
    assert "6 sequences in 3 groups" in out
    # the last group is all-correct: zero advantage, so its per-token weight prints as '-'
    row = next(line for line in out.splitlines() if re.match(r"^\s+5\s+2\s+7\s+1\s", line))
    assert row.split()[5] == "-"


def test_json_hand_worked_two_sequences():
    """lengths 2,4, rewards 1,0, one group of G=2, grpo with Bessel std:
    mean 0.5, deviations +-0.5, variance (0.25 + 0.25) / (G - 1) = 0.5, std 1/sqrt(2),
    so A = +-0.5 / (1/sqrt(2) + 1e-6) ~= +-1/sqrt(2). N = 2, total tokens 6, padded width 4.
      token:    c = 1/6 for both; totals + 2 * A/6 = A/3, - 4 * A/6 = 2A/3 (ratio 1/2)
      sequence: c_i = 1/(N |o_i|) = 1/4, 1/8; totals A/2 each
      seq_sum:  c = 1/N = 1/2; totals A, 2A
      constant: c = 1/(N * L_max) with L_max = width 4: 1/8; totals A/4, A/2
      balanced (every variant and scope: one sequence per sign subset, one group):
                c = (sequence share 1/2) * (1 / subset tokens) = 1/4, 1/8; totals A/2 each
    """
    data = explain_json("--lengths", "2,4", "--rewards", "1,0")
    assert set(data) == {"batch", *BUILTIN}
    a = 1 / SQRT2
    assert data["batch"]["lengths"] == [2, 4]
    assert data["batch"]["groups"] == [0, 0]
    assert data["batch"]["advantages"] == pytest.approx([a, -a], rel=1e-5)
    assert data["batch"]["advantage"] == {"estimator": "grpo", "std": "bessel"}
    expected_c = {
        "token": (1 / 6, 1 / 6),
        "sequence": (1 / 4, 1 / 8),
        "seq_sum": (1 / 2, 1 / 2),
        "constant": (1 / 8, 1 / 8),
        "balanced": (1 / 4, 1 / 8),
        "balanced_batch": (1 / 4, 1 / 8),
        "balanced_mass": (1 / 4, 1 / 8),
    }
    for name, (c0, c1) in expected_c.items():
        r = data[name]
        assert r["weight_per_token"] == pytest.approx([c0, c1], rel=1e-12), name
        assert r["eff_adv_per_token"] == pytest.approx([c0 * a, -c1 * a], rel=1e-5), name
        assert r["seq_weight"] == pytest.approx([2 * c0 * a, 4 * c1 * a], rel=1e-5), name
        assert r["weight_pos"] == pytest.approx(2 * c0 * a, rel=1e-5), name
        assert r["weight_neg"] == pytest.approx(4 * c1 * a, rel=1e-5), name
        assert r["uniform_within_sequence"] == [True, True]
    assert data["token"]["pos_neg_ratio"] == pytest.approx(0.5, rel=1e-12)
    assert data["balanced_batch"]["params"] == {
        "scope": "batch",
        "variant": "proportional",
        "include_zero_groups": True,
    }
    assert data["balanced"]["params"]["variant"] == "proportional"
    assert data["balanced_mass"]["params"]["variant"] == "mass"
    assert data["constant"]["params"]["max_length"] is None


def test_sign_totals_equal_for_sequence_and_balanced_not_token():
    data = explain_json("--lengths", "10,500,20,30", "--rewards", "1,0,1,0", "--group-size", "2")
    for name in ("sequence", "balanced", "balanced_batch", "balanced_mass"):
        assert data[name]["weight_pos"] == pytest.approx(data[name]["weight_neg"], rel=1e-12), name
    # token-mean: each sign's weight is its token count times |A| / total: (10 + 20) vs (500 + 30)
    assert data["token"]["pos_neg_ratio"] == pytest.approx(30 / 530, rel=1e-12)
    # equal lengths: token is balanced too
    data = explain_json("--lengths", "8,8,8,8", "--rewards", "1,0,0,0")
    assert data["token"]["weight_pos"] == pytest.approx(data["token"]["weight_neg"], rel=1e-12)


@pytest.mark.parametrize("std,scale", [("population", 1.0), ("bessel", math.sqrt(3 / 4))])
def test_sign_balance_is_sqrt_k_g_minus_k_over_g(std, scale):
    """G = 4, k = 1 positive: population std gives each sign sqrt(1 * 3) / 4 under sequence and
    balanced; Bessel std both signs the same, scaled by sqrt((G-1)/G)."""
    data = explain_json("--lengths", "3,50,7,1", "--rewards", "1,0,0,0", "--std", std)
    expected = math.sqrt(3) / 4 * scale
    for name in ("sequence", "balanced", "balanced_mass"):
        assert data[name]["weight_pos"] == pytest.approx(expected, rel=1e-5), name
        assert data[name]["weight_neg"] == pytest.approx(expected, rel=1e-5), name


def test_drgrpo_advantage_and_rules_subset():
    # Dr. GRPO: A = r - mean = +-0.5, no std; token's per-token weight stays 1/(2 + 4)
    data = explain_json(
        "--lengths", "2,4", "--rewards", "1,0", "--advantage", "drgrpo", "--rules", "balanced,token"
    )
    assert list(data) == ["batch", "balanced", "token"]
    assert data["batch"]["advantages"] == [0.5, -0.5]
    assert data["token"]["eff_adv_per_token"] == pytest.approx([0.5 / 6, -0.5 / 6], rel=1e-12)


def test_max_length_is_constants_l_max():
    data = explain_json("--lengths", "2,4", "--rewards", "1,0", "--max-length", "100", "--rules", "constant")
    assert data["batch"]["width"] == 100
    assert data["constant"]["weight_per_token"] == pytest.approx([1 / 200, 1 / 200], rel=1e-12)


def test_rollouts_jsonl_matches_the_same_batch_on_the_command_line(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    rows = [("p1", 10, 1), ("p1", 500, 0), ("p2", 20, 1), ("p2", 30, 0.0)]
    path.write_text(
        "\n".join(json.dumps({"group": g, "length": n, "reward": r, "text": "..."}) for g, n, r in rows)
        + "\n\n"
    )
    from_file = explain_json("--rollouts", str(path))
    inline = explain_json("--lengths", "10,500,20,30", "--rewards", "1,0,1,0", "--groups", "p1,p1,p2,p2")
    assert from_file["batch"]["groups"] == ["p1", "p1", "p2", "p2"]
    assert from_file == inline
    # and the groups really split the batch: balanced at group scope differs from one group of 4
    one_group = explain_json("--lengths", "10,500,20,30", "--rewards", "1,0,1,0")
    assert one_group["balanced"]["weight_per_token"] != pytest.approx(
        from_file["balanced"]["weight_per_token"]
    )


def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "explain.png"
    result = run("explain", "--lengths", "10,500,20,30", "--rewards", "1,0,1,0", "--plot", str(out))
    assert "== balanced:" in result.stdout
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert width >= 600 and height >= 600
    assert len(data) > 20_000


# ----------------------------------------------------------------------------- errors


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "r.jsonl"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--lengths", "2,4", "--rewards", "1,0,1"], ["'--rewards'", "got 3 rewards for 2 lengths"]),
        (
            ["--lengths", "10,-3,4", "--rewards", "1,0,1"],
            ["'--lengths'", "value -3 at position 2 is negative"],
        ),
        (
            ["--lengths", "10,x", "--rewards", "1,0"],
            ["'--lengths'", "value 'x' at position 2 is not an integer"],
        ),
        (
            ["--lengths", "2,4", "--rewards", "1,yes"],
            ["'--rewards'", "value 'yes' at position 2 is not a number"],
        ),
        (["--lengths", "2,4", "--rewards", "1,nan"], ["'--rewards'", "position 2 is not a finite number"]),
        (
            ["--lengths", "2,4", "--rewards", "1,0", "--rules", "token,balancd"],
            [
                "'--rules'",
                "unknown rule instance 'balancd'",
                "Did you mean 'balanced'?",
                "Valid names:",
                *BUILTIN,
            ],
        ),
        (
            ["--lengths", "2,4,6", "--rewards", "1,0,1", "--group-size", "2"],
            ["'--group-size'", "3 sequences do not split into groups of 2"],
        ),
        (
            ["--lengths", "2,4", "--rewards", "1,0", "--groups", "0,0,1"],
            ["'--groups'", "3 group labels for 2"],
        ),
        (
            ["--lengths", "2,4", "--rewards", "1,0", "--advantage", "ppo"],
            ["'--advantage'", "unknown advantage estimator 'ppo'", "grpo"],
        ),
        (
            ["--lengths", "2,4", "--rewards", "1,0", "--advantage", "drgrpo", "--std", "population"],
            ["'--std'", "'drgrpo' takes no std option"],
        ),
        (
            ["--lengths", "2,40", "--rewards", "1,0", "--max-length", "10"],
            ["'--max-length'", "below the longest"],
        ),
        (["--rewards", "1,0"], ["missing --lengths"]),
        (
            ["--lengths", "2,4", "--rewards", "1,0", "--plugin", "no_such_rules_module"],
            ["'--plugin'", "'no_such_rules_module' was not found"],
        ),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_option(args, needles):
    result = run("explain", *args, ok=False)
    assert result.exit_code == 2, result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)


@pytest.mark.parametrize(
    "text,needles",
    [
        (
            '{"group": 0, "length": 3, "reward": 1}\n{"group": 0, "reward": 0}\n',
            [":2: missing field 'length'"],
        ),
        (
            '{"group": 0, "length": 3, "reward": 1}\n\n{"length": 3, "reward": 0}\n',
            [":3: missing field 'group'"],
        ),
        ('{"group": 0, "length": 3}\n', [":1: missing field 'reward'"]),
        ('{"group": 0, "length": -1, "reward": 1}\n', [":1: field 'length' must be an integer >= 0"]),
        ('{"group": 0, "length": 3, "reward": "1"}\n', [":1: field 'reward' must be a finite number"]),
        ('{"group": 0, "length": 3, "reward": 1}\nnot json\n', [":2: not valid JSON"]),
        ("\n\n", ["no rollouts"]),
    ],
)
def test_bad_rollouts_file_names_file_line_and_field(tmp_path, text, needles):
    path = _write(tmp_path, text)
    result = run("explain", "--rollouts", path, ok=False)
    assert result.exit_code == 2, result.output
    assert "'--rollouts'" in result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)
    if ":" in needles[0]:
        assert f"{path}{needles[0].split(' ')[0]}" in result.output  # file:line


def test_a_utf16_rollouts_file_says_so_and_to_save_it_as_utf8(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"group": 0, "length": 3, "reward": 1}\n', encoding="utf-16")  # PowerShell's `>`
    result = run("explain", "--rollouts", str(path), ok=False)
    assert result.exit_code == 2 and "'--rollouts'" in result.output, result.output
    assert (
        "not UTF-8 text (byte 0xff at byte 1 of the file; it looks like UTF-16, which Windows PowerShell's `>` writes)"
        in result.output
        and "save it as UTF-8" in result.output
    )


def test_rollouts_excludes_inline_batch(tmp_path):
    path = _write(tmp_path, '{"group": 0, "length": 3, "reward": 1}\n')
    result = run("explain", "--rollouts", path, "--lengths", "3", ok=False)
    assert result.exit_code == 2 and "drop --lengths" in result.output


# ----------------------------------------------------------------------------- rules


def test_rules_lists_every_registered_rule_and_instance():
    out = run("rules").stdout
    for name in rule_names():
        assert re.search(rf"^  {name}  v\d", out, re.M), name
    for name in BUILTIN:
        assert re.search(rf"^  {name}\s+= ", out, re.M), name
    assert "balanced_batch  = balanced(scope='batch')" in out
    assert "balanced_mass   = balanced(variant='mass')" in out
    info = json.loads(run("rules", "--format", "json").stdout)
    assert set(info["rules"]) == set(rule_names())
    assert info["rules"]["balanced"]["sign_balanced"] is True
    assert info["rules"]["token"]["sign_balanced"] is False
    assert info["rules"]["balanced"]["params"]["variant"] == "proportional"
    assert info["rules"]["balanced"]["version"] == "2"
    assert info["instances"]["balanced_mass"]["non_default"] == {"variant": "mass"}


# ----------------------------------------------------------------------------- docs example, real process


def _doc_blocks() -> dict[str, str]:
    text = (REPO_ROOT / "docs" / "adding_an_aggregation.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return {b.splitlines()[0].lstrip("# ").strip(): b for b in blocks}


def test_docs_example_rule_through_a_real_aggbench_process(tmp_path):
    """The worked example of docs/adding_an_aggregation.md, loaded as a plugin by the installed
    `aggbench` script: c_i = 1 / (N sqrt(|o_i|)) on lengths 4, 9 (N = 2, G = 2, population std so
    A = +-1): weights 1/(2*2) = 1/4 and 1/(2*3) = 1/6; token's weight stays 1/(4 + 9)."""
    blocks = _doc_blocks()
    (tmp_path / "my_rules.py").write_text(blocks["my_rules.py"])
    exe = Path(sys.executable).parent / "aggbench"
    proc = subprocess.run(
        [str(exe), "explain", "--plugin", "my_rules", "--lengths", "4,9", "--rewards", "1,0", "--std", "population",
         "--format", "json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"batch", *BUILTIN, "sqrt_length"}
    assert data["batch"]["advantages"] == pytest.approx([1.0, -1.0], rel=1e-5)
    assert data["sqrt_length"]["weight_per_token"] == pytest.approx([1 / 4, 1 / 6], rel=1e-12)
    assert data["sqrt_length"]["seq_weight"] == pytest.approx([4 / 4, 9 / 6], rel=1e-5)
    assert data["token"]["weight_per_token"] == pytest.approx([1 / 13, 1 / 13], rel=1e-12)
    assert "sqrt_length" not in RULES, "the plugin must not leak into this process"


def test_docs_example_test_passes_against_the_docs_rule():
    blocks = _doc_blocks()
    module = types.ModuleType("my_rules")
    sys.modules["my_rules"] = module
    try:
        exec(compile(blocks["my_rules.py"], "my_rules.py", "exec"), module.__dict__)  # noqa: S102
        namespace: dict = {}
        exec(compile(blocks["test_my_rules.py"], "test_my_rules.py", "exec"), namespace)  # noqa: S102
        namespace["test_sqrt_length_by_hand"]()
        assert "sqrt_length" in RULES
    finally:
        RULES.remove("sqrt_length")
        sys.modules.pop("my_rules", None)


def test_a_rule_that_weights_tokens_unequally_is_reported_as_a_mean():
    """A (temporary) rule giving token t of a sequence the weight (t + 1) / 10: lengths 2 and 3
    get per-token weights 0.1, 0.2 (mean 0.15) and 0.1, 0.2, 0.3 (mean 0.2)."""
    from aggbench.aggregation import RuleInstance, register_rule
    from aggbench.aggregation.explain import explain, make_batch
    from aggbench.report.explain_render import format_table

    @register_rule("tmp_position_weighted")
    def tmp_position_weighted(mask, advantages, group_ids):
        """Test rule: weight (t + 1) / 10 on token t."""
        pos = torch.arange(mask.shape[1], dtype=advantages.dtype)[None, :] + 1
        return advantages[:, None] * pos / 10 * mask

    try:
        batch = make_batch([2, 3], [1, 0], std="population")  # A = +1, -1
        reports = explain(batch, {"pw": RuleInstance("pw", "tmp_position_weighted")})
        r = reports["pw"]
        assert r.uniform == [False, False]
        assert r.weight_per_token == pytest.approx([0.15, 0.2], rel=1e-5)
        assert r.seq_weight == pytest.approx([0.3, 0.6], rel=1e-5)
        text = format_table(batch, reports)
        assert "0.15*" in text and "weights this sequence's tokens unequally" in text
    finally:
        RULES.remove("tmp_position_weighted")


def test_docs_example_output_is_what_explain_prints():
    """docs/aggregations.md pastes a real `aggbench explain` run: it must still be the output."""
    text = (REPO_ROOT / "docs" / "aggregations.md").read_text()
    block = re.search(r"```console\n\$ (aggbench explain .*?)```", text, re.S).group(1)
    lines = block.splitlines()
    n_cmd = next(i for i, line in enumerate(lines) if not line.endswith("\\")) + 1
    argv = shlex.split(" ".join(line.rstrip("\\") for line in lines[:n_cmd]))
    assert argv[:2] == ["aggbench", "explain"] and "|" not in argv
    expected = "\n".join(lines[n_cmd:]) + "\n"
    assert run(*argv[1:]).stdout == expected
