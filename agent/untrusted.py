"""Text read from machines, logs and providers is data, never instructions (seed 001 "Injection").

:func:`as_data` delimits an observation for the model's context; :func:`scan_for_injection`
finds instruction-like text aimed at the agent so the runtime raises a ``prompt_injection``
alert. Nothing here can change policy or the allowlist: those live in code (``agent.policy``).

Every untrusted field is scanned where it enters (issue 11 §1.7): provider fields at sync
(:func:`scan_instance`, from ``fleet.sync`` and the observe phase), diagnosis evidence
(``fleet.diagnostics.diagnose``) and every tool's output (``agent.pipeline.execute``). A run that
raised ``prompt_injection`` parks every later side effect for an operator
(``agent.lifecycle.forced_approval``).
"""

import re

#: every pattern is bounded (no unbounded repeat before a part that can fail), so a scan is linear
#: in the text: ``tests/test_regex_fuzz.py`` checks it
_INJECTION = [
    re.compile(r"ignore (all |any )?(the )?(previous|prior|above|earlier) (instructions|rules|prompts?)", re.I),
    re.compile(r"disregard (all |any )?(the )?(previous|prior|above|your) (instructions|rules|guidelines)", re.I),
    re.compile(r"\byou are now\b", re.I),
    re.compile(r"\b(new|updated) (system )?instructions?\s{0,8}:", re.I),
    re.compile(r"\bsystem prompt\b", re.I),
    re.compile(r"\b(assistant|agent|ai)\s{0,8}[,:]\s{0,8}(please\s{1,8})?(stop|destroy|delete|terminate|shut ?down|kill|send|email|dump|reveal)\b", re.I),
    re.compile(r"\b(destroy|terminate|stop|delete) (all|every) (instances?|machines?|workers?|nodes?)\b", re.I),
    re.compile(r"\b(reveal|print|dump|send|email|exfiltrate) (the |your )?(api[_ ]?keys?|secrets?|credentials|env(ironment)?( variables)?|passwords?)\b", re.I),
    re.compile(r"<\s{0,8}/?\s{0,8}(system|tool_result|verdict)\s{0,8}>", re.I),
]


def scan_for_injection(text: str) -> list[str]:
    """The instruction-like fragments found in ``text`` (empty when none)."""
    hits = []
    for pat in _INJECTION:
        m = pat.search(text or "")
        if m:
            hits.append(m.group(0))
    return hits


def as_data(tool: str, observation: str) -> str:
    """Wrap an observation for the model: clearly delimited, labelled untrusted."""
    safe = (observation or "").replace("</observation", "&lt;/observation")
    return f'<observation tool="{tool}" trust="untrusted-data">\n{safe}\n</observation>'


#: provider fields of an instance that come from outside (vast.ai labels and messages, host names)
INSTANCE_FIELDS = ("gpu_name", "status_msg", "label", "status", "worker_name", "ssh_host", "log_path")


def scan_instance(inst) -> list[tuple[str, str]]:
    """``(field, fragment)`` for each provider field of ``inst`` (an ``Instance`` row or a
    ``ProviderInstance``) holding instruction-like text; empty when none."""
    hits = []
    for name in INSTANCE_FIELDS:
        value = getattr(inst, name, "") or ""
        if isinstance(value, str) and value:
            found = scan_for_injection(value)
            if found:
                hits.append((name, found[0]))
    return hits


def raise_instance_injection(external_id: str, hits: list[tuple[str, str]]) -> None:
    """Raise one ``prompt_injection`` alert per instance field (once per episode)."""
    from fleet.alerts import raise_alert

    for name, fragment in hits:
        raise_alert("prompt_injection", f"instruction-like text in the provider's {name} of {external_id}: {fragment[:120]}",
                    severity="P1", key=f"prompt_injection:instance:{external_id}:{name}")
