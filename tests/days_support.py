"""The shipped days of ``tests/days/`` and a window of one, for the short tests."""

import copy
import json
import math
from datetime import datetime, timedelta
from pathlib import Path

DAYS = Path(__file__).parent / "days"


def day(name: str) -> dict:
    """The day file ``tests/days/NAME.json`` as a dict."""
    return json.loads((DAYS / f"{name}.json").read_text())


def window(raw: dict, from_h: float) -> dict:
    """The day ``raw`` seen from ``from_h`` hours after its start: ``start`` later by that much,
    every timed entry earlier by it (those before the window are dropped), hourly profiles without
    their first whole hours. The starting fleet stays as the file gives it."""
    d = copy.deepcopy(raw)
    start = datetime.fromisoformat(d.get("start", "2026-06-09T00:00:00+00:00").replace("Z", "+00:00"))
    d["start"] = (start + timedelta(hours=from_h)).isoformat()
    horizon = d.get("horizon_h", 24)
    d["horizon_h"] = max(0.1, horizon - from_h)
    skip = math.floor(from_h)

    def shift(entries, key="at_h"):
        out = []
        for e in entries or []:
            e[key] -= from_h if key == "at_h" else from_h * 3600
            if e[key] >= 0:
                out.append(e)
        return out

    m, w, o = d.get("market", {}), d.get("work", {}), d.get("operator", {})
    for key in ("price_changes", "worker_deaths"):
        if key in m:
            m[key] = shift(m[key])
    arr = w.get("arrivals", {})
    if "bursts" in arr:
        arr["bursts"] = shift(arr["bursts"])
    if "tasks" in arr:
        arr["tasks"] = shift(arr["tasks"], "at_s")
    for prof in (arr, w.get("sealing") or {}):
        if prof.get("hourly"):
            full = [prof["hourly"][h % len(prof["hourly"])] for h in range(math.ceil(horizon))]
            prof["hourly"] = full[skip:] or [0]
    if "target_changes" in o:
        o["target_changes"] = shift(o["target_changes"])
    if "away" in o:
        o["away"] = [{"from_h": max(0, a["from_h"] - from_h), "to_h": a["to_h"] - from_h}
                     for a in o["away"] if a["to_h"] - from_h > 0]
    return d
