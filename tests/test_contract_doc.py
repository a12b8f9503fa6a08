"""docs/contract.md states the decision contract; these checks keep it equal to what the code and
docs/replay.md say, so the two documents cannot drift apart unnoticed."""

import re
from pathlib import Path

from agent.replay.file_format import ALERT_KINDS, REASON_CODES
from agent.runtime.tools import PUBLIC_TOOLS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _order(path: Path) -> list[str]:
    """The codes between the refusal-order marks of ``path``, in order."""
    block = path.read_text().split("<!-- refusal-order -->", 1)[1].split("<!-- /refusal-order -->", 1)[0]
    return re.findall(r"`([a-z_]+)`", block)


def test_the_refusal_order_is_the_same_in_the_contract_and_the_replay_format():
    contract = _order(DOCS / "contract.md")
    assert contract == _order(DOCS / "replay.md")
    assert contract[0] == "forged_observation" and contract[-1] == "approval_required"


def test_every_reason_code_alert_kind_and_tool_of_the_code_is_in_the_contract():
    text = (DOCS / "contract.md").read_text()
    named = set(re.findall(r"`([a-z_]+)`", text))
    assert set(REASON_CODES) - named == set()
    assert set(ALERT_KINDS) - named == set()
    assert set(PUBLIC_TOOLS) - named == set()


def test_the_contract_has_the_anchors_other_documents_link_to():
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
                for h in re.findall(r"^##+ (.+)$", (DOCS / "contract.md").read_text(), re.M)}
    for anchor in ("tools", "the-cycle", "policy", "reason-codes", "refusal-order", "terminal", "blind-mode",
                   "forced-approval", "starvation", "alert-kinds", "side-effects-and-claims", "replay-expectations"):
        assert anchor in headings, anchor
