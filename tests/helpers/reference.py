"""The reference study: one whole study through the CLI (``python -m tuner``) on the simulator,
run once per session (the ``reference_study`` fixture of ``tests/integration/conftest.py``) and
read by the tests of what a study records, confirms, exports and keeps secret. A test that changes
it works on a :meth:`Reference.copy`."""

from __future__ import annotations

import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from helpers.cli import FAST

STUDY = "chat-qwen3-8b-sim"
HF_TOKEN = "hf_SECRETtoken123456"
API_KEY = "sk-SECRETkey987654"
ENV = {"HF_TOKEN": HF_TOKEN}
# four trials, and the confirm stage with every default pick, two rounds of two seeds; the server
# gets an API key (the replay must authenticate) and HF_TOKEN, and the job logs at DEBUG
# (``hydra.verbose=tuner``): neither secret may reach a file
ARGS = (
    "+workload=chat",
    "engine=sim",
    "study.n_trials=4",
    *FAST,
    "confirm.rounds=2",
    "confirm.seeds=[1,2]",
    f"engine.extra_args=[--api-key,{API_KEY}]",
    "hydra.verbose=tuner",
)


@dataclass(frozen=True)
class Reference:
    """The folder the reference study ran in (its cwd: ``outputs/``, ``mlflow.db``, ``mlruns/``)
    and what the CLI printed."""

    cwd: Path
    stdout: str
    stderr: str

    @property
    def run_dir(self) -> Path:
        """The run folder of the study (the one with its exports)."""
        (run_dir,) = [
            d for d in (self.cwd / "outputs" / "runs").iterdir() if (d / "pareto.json").exists()
        ]
        return run_dir

    def copy(self, dest: Path) -> Path:
        """The study copied to ``dest`` as if it had run there: the absolute paths the Optuna
        storage and the MLflow store hold (trial folders, artifact locations) point into the copy,
        so nothing done to it reaches the reference."""
        shutil.copytree(self.cwd, dest)
        for db in (dest / "mlflow.db", dest / "outputs" / "state" / "optuna.db"):
            relocate(db, f"{self.cwd}/", f"{dest}/")
        return dest


def relocate(db: Path, old: str, new: str) -> None:
    """Replace ``old`` with ``new`` in every text value of the SQLite database ``db``."""
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for col in con.execute(f'PRAGMA table_info("{table}")').fetchall():
                name, kind = col[1], str(col[2]).upper()
                if "CHAR" in kind or "TEXT" in kind or "CLOB" in kind or kind == "":
                    con.execute(
                        f'UPDATE "{table}" SET "{name}" = REPLACE("{name}", ?, ?) '
                        f'WHERE "{name}" LIKE ?',
                        (old, new, f"%{old}%"),
                    )
        con.commit()
    finally:
        con.close()
