"""batching.split_groups: mini-batches of whole prompt groups, every row once. With full groups a
cut by equal row slices lands on group boundaries too, so the invariance tests alone would not tell
it from a cut that splits a group; dynamic sampling leaves group counts that are not a multiple of
the mini-batch count (3 groups into 2), where a group-scoped rule (balanced, token_group) would
compute k/G on half a group."""

from __future__ import annotations

import pytest
import torch

from aggbench.train.batching import split_groups


@pytest.mark.parametrize(
    ("group_ids", "n_parts"),
    [
        ([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], 2),  # 3 groups into 2
        ([5, 5, 7, 7, 9, 9, 11, 11, 13, 13], 2),  # 5 groups into 2, ids not 0..n
        ([2, 0, 1, 2, 0, 1, 2, 0, 1], 2),  # rows of a group not adjacent
        ([0, 0, 0, 1, 1, 1, 1, 1, 2], 3),  # unequal group sizes
        ([4, 4, 4, 4], 1),
    ],
)
def test_every_part_holds_whole_groups_and_every_row_once(group_ids, n_parts):
    gids = torch.tensor(group_ids)
    parts = split_groups(gids, n_parts)
    assert len(parts) == n_parts
    rows = torch.cat(parts).tolist()
    assert sorted(rows) == list(range(len(group_ids)))  # every row once
    for part in parts:
        for g in gids[part].unique().tolist():
            assert set(part.tolist()) >= set(torch.nonzero(gids == g).flatten().tolist()), (g, part)
    assert all(len(p) > 0 for p in parts)  # as many parts as asked, none empty here


def test_a_loss_mask_with_holes_is_refused_before_the_weights_are_rebuilt_from_counts():
    """update() rebuilds the whole batch's mask from each row's token count (gather_minibatch), so
    it refuses a mask whose scored tokens are not a prefix (the weights would land elsewhere)."""
    from aggbench.train.parallel import Ranks
    from aggbench.train.update import _check_prefix

    _check_prefix(torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]]), Ranks())  # prefixes, an empty row too
    with pytest.raises(RuntimeError, match=r"the loss mask of rows \[1\] has holes"):
        _check_prefix(torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]]), Ranks())

    class OtherRankHoled(Ranks):  # the all-reduce as another rank with a holed mask would answer it
        def max_over_ranks(self, value: int) -> int:
            seen.append(value)
            return max(value, 1)

    seen: list[int] = []
    with pytest.raises(RuntimeError, match=r"another rank's loss mask has holes"):
        _check_prefix(torch.tensor([[1, 1, 0], [1, 0, 0]]), OtherRankHoled())  # clean here: refuses too
    assert seen == [0]  # this rank reported its own mask clean
