"""Text read from machines, logs and providers is data, never instructions (docs/safety.md, Untrusted text).

:func:`as_data` delimits an observation for the model's context; :func:`scan_for_injection`
finds instruction-like text aimed at the agent so the runtime raises a ``prompt_injection``
alert. Nothing here can change policy or the allowlist: those live in code (``agent.policy.table``).

Every untrusted field is scanned where it enters (docs/secrets.md): provider fields at sync
(:func:`scan_instance`, from ``fleet.sync`` and the observe phase), diagnosis evidence
(``fleet.diagnostics.diagnose``) and every tool's output (``agent.runtime.pipeline.execute``). A run that
raised ``prompt_injection`` parks every later side effect for an operator
(``agent.policy.lifecycle.forced_approval``).

The scan reads the text as :func:`normalise` leaves it, so spacing, case, ``-``/``_`` joins,
full-width letters, zero-width characters and JSON escapes hide nothing, nor do homoglyphs from
other scripts (a Cyrillic "о" in "ignоre", a Greek "ο", accents): they are folded to their Unicode
confusable prototype (UTS #39, ``fleet.skeleton.fold_confusables``) before the patterns run.
"""

import functools
import re
import unicodedata

from fleet.alerts import raise_alert
from fleet.skeleton import fold_confusables

#: characters of a text that are scanned: a longer text is scanned by its head and its tail, half
#: each, which covers what the model is shown of it (observations are cut head and tail to
#: ``observation_max_chars``, 4,000 by default, in ``agent.policy.tool_specs.truncate``)
SCAN_MAX = 200_000

# JSON escapes (tool output and evidence are scanned as JSON text): ``\u200b`` is the character it
# names, ``\n`` a line end, so an escaped zero-width space or line start hides nothing
_JSON_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|([nrt]))")
# whitespace and the separators ``-``/``_`` between words: a run is one space (one line end if it holds one)
_SEPARATORS = re.compile(r"[\s\-_]+")
_VERB = r"(?:ignore|disregard|forget|override|bypass|overrule)"
_QUALIFIER = r"(?:all|any|of|the|your|my|its|these|those|previous|prior|above|earlier|preceding|former|original|system|safety)"
_RULES = r"(?:instructions?|rules|prompts?|guidelines|directives|guardrails|programming|system prompt)"
#: what a run of text must not say to the agent, written against :func:`normalise`'s output (lower
#: case, one space between words, ``_``/``-`` read as a space). Every pattern is bounded (no unbounded
#: repeat before a part that can fail), so a scan is linear in the text: ``tests/test_regex_fuzz.py``
#: checks it, and ``tests/test_untrusted.py`` keeps the near misses that must not match.
_INJECTION = [
    # "ignore all previous instructions", "forget your rules", "override the system prompt"
    # (one qualifier at least: "loaded 3 override rules" and "--ignore-prompts" are not this)
    re.compile(rf"\b{_VERB} (?:{_QUALIFIER} ){{1,3}}{_RULES}\b"),
    re.compile(r"\byou are now (?:a|an|the|my|our|in [a-z]{1,20} mode|acting|operating|free|unrestricted|jailbroken"
               r"|dan|root|admin|the fleet owner)\b"),
    re.compile(r"\b(?:from now on|henceforth),? you (?:are|will|must|should)\b"),
    re.compile(r"\b(?:new|updated) (?:system )?instructions? ?:"),
    re.compile(r"\bsystem prompt\b"),
    # role and turn markers of chat templates, and the tags that delimit data for the model
    re.compile(r"<\|(?:im start|im end|system|user|assistant|endoftext|eot id|start header id|end header id)\|>"),
    re.compile(r"\[/?inst\]|<</?sys>>"),
    re.compile(r"< ?/? ?(?:system|observation|tool result|tool call|verdict|instructions|function calls?) ?>"),
    re.compile(r"< ?/ ?(?:assistant|user) ?>"),
    re.compile(r"\b(?:assistant|agent|ai) ?[,:] ?(?:please )?(?:stop|destroy|delete|terminate|shut ?down|kill|send|email"
               r"|dump|reveal)\b"),
    re.compile(r"\b(?:destroy|terminate|stop|delete|kill|shut down|wipe|remove) (?:all|every|each) (?:of )?(?:the |your )?"
               r"(?:instances?|machines?|workers?|nodes?|servers?|gpus?|containers?)\b"),
    re.compile(r"\b(?:destroy|terminate|wipe) (?:everything|all$|all[;,.!]|the (?:whole |entire )?fleet)"),
    re.compile(r"\b(?:reveal|print|dump|send|email|exfiltrate|leak) (?:the |your |all )?(?:api ?keys?|secrets?|credentials"
               r"|env(?:ironment)?(?: variables)?|passwords?|tokens?|private keys?)\b"),
    re.compile(r"\b(?:do not|don't|never) (?:ask|wait) for (?:approval|confirmation|permission)\b"),
    re.compile(r"\b(?:bypass|skip) (?:the |any )?(?:approvals?|confirmations?|guards?)\b"),
]
#: a role speaking at a line or sentence start: "assistant: …", "SYSTEM: destroy …" (read line by
#: line: these run on the normalised text with its line ends, the rest with each line end a space)
_ROLE_AT_START = [
    re.compile(r"(?:^|(?<=[\n.!?;>\]\"'(|])) ?(?:assistant|developer) ?:"),
    re.compile(r"(?:^|(?<=[\n.!?;>\]\"'(|])) ?(?:system|admin|operator)(?: message| notice| override)? ?: ?(?:you|please|ignore"
               r"|disregard|forget|override|new|updated|policy|instructions|agent|destroy|stop|terminate|delete|kill"
               r"|launch|run|execute|send|email|reveal|print|dump|shut|call|approve|grant|from now)\b"),
]


def _unescape(m: re.Match) -> str:
    if m.group(1):
        return chr(int(m.group(1), 16))
    return "\n" if m.group(2) == "n" else " "


def normalise(text: str) -> str:
    """``text`` as the scanner reads it: at most :data:`SCAN_MAX` characters (head and tail),
    JSON escapes decoded, Unicode NFKC (full-width and ligature letters become plain ones), format
    characters (category Cf: zero-width spaces and joiners, bidi marks, soft hyphens) removed, case
    folded, every non-ASCII letter replaced by its UTS #39 confusable prototype and combining marks
    dropped (``fleet.skeleton.fold_confusables``: Cyrillic "іgnоre" reads "ignore"; ASCII text is
    never changed, so "A100" stays "a100"), and every run of whitespace, ``-`` and ``_`` one space (one line end when the run held
    one). ``"ig\\u200bnore  PRIOR-instructions"`` (a zero-width space) reads
    ``"ignore prior instructions"``."""
    text = text or ""
    if len(text) > SCAN_MAX:
        text = f"{text[:SCAN_MAX // 2]}\n{text[-(SCAN_MAX // 2):]}"
    text = _JSON_ESCAPE.sub(_unescape, text)
    text = unicodedata.normalize("NFKC", text)
    if not text.isascii():
        text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    text = text.casefold()
    if not text.isascii():
        text = fold_confusables(text).casefold()  # casefold first: a capital Cyrillic І is і, then i
    return _SEPARATORS.sub(lambda m: "\n" if "\n" in m.group() or "\r" in m.group() else " ", text)


def scan_for_injection(text: str) -> list[str]:
    """The instruction-like fragments found in ``text``, as :func:`normalise` reads it (lower case,
    separators collapsed), one per pattern that matched; empty when none. Linear in ``len(text)``;
    at most :data:`SCAN_MAX` characters are read (the head and the tail of a longer text).
    Source: text a machine prints may try to steer the agent (docs/safety.md, Untrusted text)."""
    lines = normalise(text)
    flat = lines.replace("\n", " ")
    hits = []
    for pat, clean in [(p, flat) for p in _INJECTION] + [(p, lines) for p in _ROLE_AT_START]:
        m = pat.search(clean)
        if m:
            hits.append(m.group(0).strip())
    return hits


#: a closing tag of the data block, however it is cased or spaced
_CLOSE_OBSERVATION = re.compile(r"<(\s{0,8}/\s{0,8}observation)", re.I)


def as_data(tool: str, observation: str) -> str:
    """Wrap an observation for the model: clearly delimited, labelled untrusted; a closing
    ``</observation`` inside it (any case or spacing) is written ``<\\/observation`` so it cannot
    end the block early (a backslash, not an HTML entity: nothing the model reads is HTML, and a
    chat template that autoescapes would make ``&lt;`` into ``&amp;lt;``)."""
    safe = _CLOSE_OBSERVATION.sub(lambda m: "<\\" + m.group(1), observation or "")
    return f'<observation tool="{tool}" trust="untrusted-data">\n{safe}\n</observation>'


#: provider fields of an instance that come from outside (vast.ai labels and messages, host names)
INSTANCE_FIELDS = ("gpu_name", "status_msg", "label", "status", "worker_name", "ssh_host", "log_path")


@functools.lru_cache(maxsize=16384)
def _first_hit(value: str) -> str:
    """The first fragment :func:`scan_for_injection` finds in ``value`` ("" when none), memoised:
    a fleet's provider fields ("RTX 4090", "running", its labels) repeat every cycle and on every
    instance, so a cycle of 1,000 instances scans each distinct text once."""
    found = scan_for_injection(value)
    return found[0] if found else ""


def scan_instance(inst) -> list[tuple[str, str]]:
    """``(field, fragment)`` for each provider field of ``inst`` (an ``Instance`` row or a
    ``ProviderInstance``) holding instruction-like text; empty when none."""
    hits = []
    for name in INSTANCE_FIELDS:
        value = getattr(inst, name, "") or ""
        if isinstance(value, str) and value:
            found = _first_hit(value)
            if found:
                hits.append((name, found))
    return hits


def raise_instance_injection(external_id: str, hits: list[tuple[str, str]]) -> None:
    """Raise one ``prompt_injection`` alert per instance field (once per episode)."""
    for name, fragment in hits:
        raise_alert("prompt_injection", f"instruction-like text in the provider's {name} of {external_id}: {fragment[:120]}",
                    severity="P1", key=f"prompt_injection:instance:{external_id}:{name}")
