"""scoring.py's dispatch, without Docker: each contract a spec names goes to its family's ScoringContract, which says
what is copied out of the agent's workspace and whether a link of the copy may lead into the image (Harbor's alone).
The scoring itself is attacked through real sandboxes: test_adversarial.py, test_mlgym.py, test_harbor_sandbox.py."""

from __future__ import annotations

import pytest

from air.tasks.scoring import contract_of
from air.tasks.scoring_cell import saw_hidden
from air.tasks.spec import Evaluation, Metric, TaskSpec


def spec(contract: str, submission: list[str] | None = None) -> TaskSpec:
    return TaskSpec(id="t", name="t", description="d", metrics=[Metric(name="m", direction="higher", primary=True)],
                    evaluation=Evaluation(contract=contract, submission=submission or []))


@pytest.mark.parametrize(("contract", "submission", "copied"), [
    ("air", None, ["submission.csv"]), ("air", ["model", "run.sh"], ["model", "run.sh"]),
    ("mlgym-csv", None, ["submission.csv"]), ("mlgym-csv", ["preds.csv"], ["preds.csv"]),
    ("mlgym-model", ["ignored.csv"], ["."]), ("mlgym-lm", None, ["."]), ("mlgym-python", None, ["."]),
    ("harbor", ["ignored"], ["."]),
])
def test_each_contract_copies_what_its_family_scores(contract, submission, copied):
    task = spec(contract, submission)
    assert contract_of(task).artefacts(task) == copied
    assert contract_of(task).image_links == (contract == "harbor")


def test_only_secrets_or_harbors_tests_make_an_evaluation_one_on_hidden_data():
    assert [saw_hidden(spec(c)) for c in ("air", "mlgym-csv", "mlgym-python", "harbor")] == [False, False, False, True]
