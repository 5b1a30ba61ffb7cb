"""Tolerances for the learner-equality tests: two computations of the same sums in different orders.

N learners against one, chunked against one-shot, recomputed against saved activations: the same terms are summed
in another order (per learner or chunk, then across; another kernel's blocking on another CPU). Float addition is
not associative, so the results differ by rounding. Each of the n - 1 additions of a sum rounds by at most
eps / 2 of its partial sum; taken as independent, these errors add like a random walk, to about
eps * sqrt(n) of the terms' magnitude.

What these tests compare is what stays exact up to that rounding: the gradients, or a step that is elementwise in
them. Not the weights after an Adam step: Adam divides each gradient by its own magnitude, so a gradient of the
order of Adam's eps that differs by rounding alone moves its weight by a different fraction of lr.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from gagpo_rllib.columns import Columns

# Over the random-walk estimate: the forward and backward chain several reductions (matmuls over the hidden size,
# softmaxes over the vocabulary and the sequence) ahead of the gradient's sum over tokens, each adding rounding of
# the same order. Measured on the toy learners (2,500-6,200 token positions): 1.6e-7 to 6.6e-7 relative, against
# bounds of 1.2e-5 to 1.9e-5 with this factor.
SAFETY = 2.0


def reduction_tolerance(dtype: torch.dtype, n_terms: int, *, safety: float = SAFETY) -> float:
    """The relative difference two orders of summing ``n_terms`` terms in ``dtype`` can leave:
    ``safety * eps(dtype) * sqrt(n_terms)``. An elementwise result (``n_terms=1``) gets a few eps."""
    return safety * torch.finfo(dtype).eps * math.sqrt(max(int(n_terms), 1))


def relative_error(got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> float:
    """``||got - expected|| / ||expected||`` over all tensors together (the same names on both sides)."""
    assert got.keys() == expected.keys(), sorted(got.keys() ^ expected.keys())[:5]
    a = torch.cat([got[k].detach().double().flatten() for k in expected])
    b = torch.cat([expected[k].detach().double().flatten() for k in expected])
    return float((a - b).norm() / b.norm())


def assert_equal_sums(
    got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], n_terms: int
) -> None:
    """``got`` is ``expected`` (gradients, by name) up to the rounding of summing ``n_terms`` terms in another
    order, in the dtype of ``expected``: relative error below ``reduction_tolerance``."""
    (dtype,) = {t.dtype for t in expected.values()}
    error, tol = relative_error(got, expected), reduction_tolerance(dtype, n_terms)
    assert error < tol, f"relative error {error:.3g}, over the {tol:.3g} of {n_terms} terms in {dtype}"


def token_positions(*batches: Mapping) -> int:
    """The terms of a weight gradient's sum over the batch: every row's prompt and action tokens (learner
    connector batches)."""
    return sum(
        int(torch.as_tensor(b[Columns.PROMPT_LEN]).sum() + torch.as_tensor(b[Columns.ACTION_LEN]).sum())
        for b in batches
    )
