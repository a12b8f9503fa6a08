"""Rehearsing a day: the product's own code over a simulated day on the virtual clock (docs/rehearse.md).

``agent.rehearse.day`` is the day file's schema; ``agent.rehearse.sim`` runs it (:func:`run_day`).
"""
