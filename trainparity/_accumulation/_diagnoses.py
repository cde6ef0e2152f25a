"""The accumulation check's diagnoses: hypotheses tested in order against what was observed.

Each table is a sequence of rows walked by one loop (`diagnose`): a row tests one hypothesis on
the evidence and returns (cause, explanation) when it fits; the first fitting row names the
cause. Hypotheses are tested with a fixed loose tolerance (`DIAGNOSIS_RTOL`, normwise): a cause
names the first observed divergence, the verdict itself is the declared comparison's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from trainparity._results._violation import format_number

#: relative (normwise) tolerance for testing a diagnosis against what was observed; never the verdict
DIAGNOSIS_RTOL = 1e-4
#: normwise relative difference below which a divergence is described as floating-point rounding
ROUNDING_LEVEL = 1e-5
NO_CAUSE = "No known cause fits; this is the first observed divergence, not a root cause."
LOST_OR_DUPLICATED = ("The split or the per-micro-batch accounting lost or duplicated part of the batch; this is the "
                      "first observed divergence, not a root cause.")

Finding = tuple[str | None, str]
E = TypeVar("E")


def diagnose(table: Sequence[Callable[[E], Finding | None]], evidence: E, default: str = NO_CAUSE) -> Finding:
    """The first row of `table` that fits `evidence`, or no cause (explained by `default`)."""
    for row in table:
        found = row(evidence)
        if found is not None:
            return found
    return None, default


# -- numerics ------------------------------------------------------------------------------------


def norm(x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x)) if x.numel() else 0.0


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Normwise agreement within DIAGNOSIS_RTOL (for testing a hypothesis, never for the verdict)."""
    scale = max(norm(a), norm(b))
    return norm(a - b) <= DIAGNOSIS_RTOL * scale if scale else True


def near(value: float, target: float) -> bool:
    return abs(value - target) <= 1e-2 * abs(target)


def relative(expected: torch.Tensor, actual: torch.Tensor) -> float:
    scale = norm(expected)
    return norm(expected - actual) / scale if scale else float("inf")


def fit_weights(reference: torch.Tensor, contributions: list[torch.Tensor]) -> torch.Tensor | None:
    """Weights w with reference = sum_j w_j * contribution_j, when they are unique and reproduce it."""
    matrix = torch.stack(contributions, dim=1)
    if matrix.shape[0] < matrix.shape[1]:
        return None
    solution = torch.linalg.lstsq(matrix, reference.unsqueeze(1), driver="gelsd")
    if int(solution.rank) < matrix.shape[1]:
        return None
    weights = solution.solution.squeeze(1)
    return weights if close(matrix @ weights, reference) else None


def batch_dependent_explanation(modules: Sequence[str]) -> str:
    verb, pronoun = ("normalizes", "it sees") if len(modules) == 1 else ("normalize", "they see")
    return (f"Diagnosis (batch_dependent_layer): {', '.join(modules)} {verb} by the statistics of the batch {pronoun} "
            "in training mode, and a micro-batch has other statistics than the full batch: accumulated training "
            "really differs from one full-batch step. If that is accepted, pass batch_dependent='eval' to run those "
            "layers in eval mode (running statistics) and judge the accumulation loop alone.")


# -- gradients at the step -----------------------------------------------------------------------


@dataclasses.dataclass
class GradientEvidence:
    """What the gradient diagnoses look at: samples of the gradients, flattened over the parameters."""

    k: int
    #: the reference's and the candidate's gradients at the step, as they were before any clip
    reference: torch.Tensor
    candidate: torch.Tensor
    #: the normwise relative difference of the gradients the optimizers took
    difference: float
    #: the gradient each candidate call of the window back-propagated, up to the step
    contributions: list[torch.Tensor]
    #: the candidate's gradients at its previous step (None in the first window)
    previous: torch.Tensor | None
    #: per candidate call, how many clips it made in calls where no optimizer stepped, and by which functions
    early_clips: list[int]
    clip_functions: list[str]
    sizes: list[int] | None
    batch_dependent: list[str]
    precision: str

    @property
    def total(self) -> torch.Tensor:
        return torch.stack(self.contributions).sum(0)


def _batch_dependent(e: GradientEvidence) -> Finding | None:
    return ("batch_dependent_layer", batch_dependent_explanation(e.batch_dependent)) if e.batch_dependent else None


def _not_reset(e: GradientEvidence) -> Finding | None:
    if close(e.candidate, e.total) or e.previous is None or not bool(e.previous.abs().sum() > 0):
        return None
    if not close(e.candidate - e.total, e.previous):
        return None
    return "grads_not_reset", (
        "Diagnosis (grads_not_reset): the candidate's gradients at the step are this window's micro-batch gradients "
        "plus the gradients of the previous step: they were not reset after the optimizer step (call "
        "optimizer.zero_grad() after stepping).")


def _indices(values: Sequence[int]) -> str:
    return ", ".join(str(i) for i, v in enumerate(values) if v)


def _clip_per_microbatch(e: GradientEvidence) -> Finding | None:
    if close(e.candidate, e.total) or not any(e.early_clips):
        return None
    return "clip_per_microbatch", (
        f"Diagnosis (clip_per_microbatch): the candidate called {', '.join(e.clip_functions)}() at micro-batches "
        f"{_indices(e.early_clips)}, before the window's gradients were complete; clip once per optimizer step, "
        "after the last micro-batch's backward.")


def _only_last(e: GradientEvidence) -> Finding | None:
    if close(e.candidate, e.total) or len(e.contributions) < 2 or not close(e.candidate, e.contributions[-1]):
        return None
    return None, (
        "No diagnosis code fits. Observed: the gradients at the step hold only the last micro-batch's gradient: they "
        "were reset between micro-batches, e.g. by a zero_grad() before each backward.")


def _not_the_sum(e: GradientEvidence) -> Finding | None:
    if close(e.candidate, e.total):
        return None
    return None, (
        "No known cause fits: the gradients at the step are not the sum of the gradients back-propagated in this "
        "window's micro-batches; this is the first observed divergence, not a root cause.")


def _same_weighting(e: GradientEvidence) -> Finding | None:
    if not close(e.reference, e.total):
        return None
    if e.difference > ROUNDING_LEVEL:
        return None, NO_CAUSE
    advice = ("declare a tolerance" if e.precision == "float64"
              else "judge it with precision='float64' (the default) or declare a tolerance")
    return None, (
        f"{NO_CAUSE} The difference is at the level of floating-point rounding (normwise relative difference "
        f"{format_number(e.difference, 2)}): accumulating micro-batch gradients adds the same numbers in another "
        f"order; to accept that, {advice} (see docs/api.md, Accumulation equivalence).")


def _k_times(e: GradientEvidence) -> Finding | None:
    if not close(e.reference * e.k, e.total):
        return None
    return "loss_not_scaled", (
        f"Diagnosis (loss_not_scaled): the candidate's gradients are {e.k}x the reference's: each micro-batch loss was "
        f"back-propagated without dividing by the number of micro-batches ({e.k}).")


def _one_kth(e: GradientEvidence) -> Finding | None:
    if not close(e.reference, e.total * e.k):
        return None
    return "loss_scaled_twice", (
        f"Diagnosis (loss_scaled_twice): the candidate's gradients are 1/{e.k} of the reference's: the loss was "
        "divided by the number of micro-batches twice.")


def _weights(e: GradientEvidence) -> Finding | None:
    """How the reference's gradient is made of the candidate's per-micro-batch gradients."""
    weights = fit_weights(e.reference, e.contributions)
    if weights is None:
        return None
    k, mean = e.k, float(weights.mean())
    shown = "[" + ", ".join(format_number(w, 3) for w in weights.tolist()) + "]"
    of = f" ({', '.join(map(str, e.sizes))} samples)" if e.sizes else ""
    fit = f"the reference's gradient equals the gradients of the micro-batches{of} weighted by {shown}"
    if near(mean, 1 / k):
        return "loss_not_scaled", (
            f"Diagnosis (loss_not_scaled): {fit}, adding up to 1 instead of {k}: the micro-batch losses were summed "
            f"without dividing by the number of micro-batches ({k}).")
    if near(mean, 1.0):
        return "mean_of_means", (
            f"Diagnosis (mean_of_means): {fit} instead of all 1: each micro-batch was normalized by its own count and "
            "the results averaged, where the full batch is normalized by the whole window's count.")
    if near(mean, k):
        return "loss_scaled_twice", (
            f"Diagnosis (loss_scaled_twice): {fit}, adding up to {k * k} instead of {k}: the loss was divided by the "
            "number of micro-batches twice.")
    return None, f"No known cause fits: {fit} instead of all 1; this is the first observed divergence."


GRADIENT_DIAGNOSES: tuple[Callable[[GradientEvidence], Finding | None], ...] = (
    _batch_dependent, _not_reset, _clip_per_microbatch, _only_last, _not_the_sum,
    _same_weighting, _k_times, _one_kth, _weights,
)


# -- the declared loss accounting ----------------------------------------------------------------


@dataclasses.dataclass
class LossEvidence:
    """The reference's and the candidate's tp.LossAccounting of one window."""

    k: int
    #: the full batch's value, numerator and denominator
    value: float
    numerator: float | None
    denominator: float | None
    #: per candidate call
    values: list[float]
    numerators: list[float | None]
    denominators: list[float | None]
    batch_dependent: list[str]

    @property
    def counts(self) -> list[float] | None:
        """Each micro-batch's own count: its denominator, or its denominator / k when the denominators add up to
        k times the window's (each micro-batch divided by its own count times k)."""
        if self.denominator is None or any(d is None for d in self.denominators):
            return None
        declared = [float(d) for d in self.denominators if d is not None]
        if near(sum(declared), self.k * self.denominator):
            return [d / self.k for d in declared]
        return declared


def _denominators_k_times(e: LossEvidence) -> Finding | None:
    if e.denominator is None or any(d is None for d in e.denominators):
        return None
    if not near(sum(d for d in e.denominators if d is not None), e.k * e.denominator):
        return None
    return "mean_of_means", (
        f"Diagnosis (mean_of_means): the micro-batches' denominators add up to {e.k}x the full batch's: each "
        f"micro-batch was normalized by its own count times {e.k}, a mean of means, where the full batch is normalized "
        "by the whole window's count.")


DENOMINATOR_DIAGNOSES: tuple[Callable[[LossEvidence], Finding | None], ...] = (_denominators_k_times,)


def _loss_batch_dependent(e: LossEvidence) -> Finding | None:
    return ("batch_dependent_layer", batch_dependent_explanation(e.batch_dependent)) if e.batch_dependent else None


def _values_are(e: LossEvidence, expected: list[float]) -> bool:
    return close(torch.tensor(e.values, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64))


def _per_microbatch_normalization(e: LossEvidence) -> Finding | None:
    counts = e.counts
    if counts is None or not all(counts) or e.denominator is None or any(n is None for n in e.numerators):
        return None
    numerators = [float(n) for n in e.numerators if n is not None]
    k, window = e.k, float(e.denominator)
    hypotheses = [
        ("loss_not_scaled", [n / c for n, c in zip(numerators, counts, strict=True)],
         "each micro-batch's loss is its own mean (numerator / its own count), never divided by the number of "
         f"micro-batches ({k})"),
        ("mean_of_means", [n / (k * c) for n, c in zip(numerators, counts, strict=True)],
         f"each micro-batch's loss is its own mean divided by {k}: a mean of means, where the full batch is "
         f"normalized by the whole window's denominator ({format_number(window)})"),
        ("loss_scaled_twice", [n / (k * window) for n in numerators],
         f"each micro-batch's loss is normalized by the whole window and divided by {k} again"),
    ]
    for cause, expected, explanation in hypotheses:
        if _values_are(e, expected):
            return cause, f"Diagnosis ({cause}): {explanation}."
    return None


def _sum_ratio(e: LossEvidence) -> Finding | None:
    if not e.value:
        return None
    ratio = sum(e.values) / e.value
    if near(ratio, e.k):
        return "loss_not_scaled", (f"Diagnosis (loss_not_scaled): the values add up to {e.k}x the full batch's loss: "
                                   "each micro-batch's loss was not divided by the number of micro-batches.")
    if near(ratio, 1 / e.k):
        return "loss_scaled_twice", (f"Diagnosis (loss_scaled_twice): the values add up to 1/{e.k} of the full "
                                     "batch's loss: the loss was divided by the number of micro-batches twice.")
    return None


VALUE_DIAGNOSES: tuple[Callable[[LossEvidence], Finding | None], ...] = (
    _loss_batch_dependent, _per_microbatch_normalization, _sum_ratio,
)
