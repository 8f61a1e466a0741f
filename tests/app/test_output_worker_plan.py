"""The output worker (`OutputWorker.type_text`) hands a dictation with voice commands (an
output.steps.Plan) to the chain's `perform`, and plain text to `deliver`, as before."""

from __future__ import annotations

from dictation.app.workers import OutputWorker
from dictation.output.steps import Keys, Plan, Undo
from tests.app.controller_fakes import FakeChain


def test_a_plan_is_performed_and_text_is_delivered():
    chain = FakeChain()
    worker = OutputWorker(lambda options: chain)
    worker.configure(None)
    results = []
    worker.delivered.connect(lambda key, result: results.append((key, result.message)))

    worker.type_text(1, Plan((Undo(), "Hello", Keys("enter"))))
    worker.type_text(2, "plain text ")

    assert chain.delivered == [(Undo(), "Hello", Keys("enter")), "plain text "]
    assert results == [(1, "performed"), (2, "pasted")]
