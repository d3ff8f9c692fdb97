"""What a study's stored trials say, for the integration tests."""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from tuner.stored_trial import counted as counts


def counted(trials: Sequence[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The trials that count toward ``study.n_trials``: all but the configs the precheck refused
    before launch (not launched, no GPU leased), which are free up to ``study.max_rejected``."""
    return [t for t in trials if counts(t)]
