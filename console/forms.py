"""Operator input on the console: target proofs/hr, chat messages, demo queue size.

Every input has a length cap (:data:`CAPS`, characters), checked by the form before any work
(redaction, parsing, a database write); a longer value gets a form error (400) that names the
field and its cap. The JSON API and the GET filters use the same caps.
"""

from django import forms
from django.core.exceptions import ValidationError

from agent.actions.alerts import SILENCE_CHOICES
from fleet.numbers import NumberError, parse_number

#: the longest value each operator input may have, in characters (docs/safety.md, Input caps and secrets)
CAPS = {
    "message": 4000,  # a chat message to the agent (agent.actions.runs.do_post_message checks it too)
    "reason": 500,  # why: actions, cordon, settings, observe-only, reset, target
    "override_reason": 500,  # why a guard is overridden
    "comment": 2000,  # approval / rejection / alert acknowledgement comment
    "request_key": 64,  # an action form's one-time token
    "setting": 100,  # one limit on the settings page (and any typed number)
    "target": 32,  # target proofs/hr as typed
    "filter": 200,  # a ?actor= / ?verb= / ?target= filter on the Actions tab
    "next": 2000,  # a ?next= URL to return to (a longer one is ignored: the default page is used)
    "json_body": 16_384,  # the JSON API's request body, in bytes
}


def too_long(field: str, cap_key: str | None = None) -> dict:
    """``error_messages`` for a capped field: ``"<field> is too long: at most N characters (…)"``."""
    cap = CAPS[cap_key or field]
    return {"max_length": f"{field} is too long: at most {cap:,} characters (this one has %(show_value)d)"}


def too_long_error(field: str, value: str, cap_key: str | None = None) -> str | None:
    """The error for ``value`` of ``field`` when it is over its cap (``None`` when it fits)."""
    cap = CAPS[cap_key or field]
    if len(value) > cap:
        return f"{field} is too long: at most {cap:,} characters (this one has {len(value):,})"
    return None


TARGET_MAX = 1_000_000


def parse_target(text: str) -> float:
    """The target proofs/hr written as ``text``: a plain decimal number between 0 and 1,000,000
    with ASCII digits and at most two decimals (``"120"``, ``"7.5"``), read by the one
    operator-number rule (``fleet.numbers.parse_number``). Returns a float >= 0. Raises
    ``forms.ValidationError`` naming what was wrong and what to write instead."""
    text = (text or "").strip()
    if not text:
        raise forms.ValidationError("enter a target, e.g. 120")
    try:
        return float(parse_number(text, "target proofs/hr", low=0, high=TARGET_MAX, places=2, example="120"))
    except NumberError as exc:
        raise forms.ValidationError(str(exc)) from None


class OperatorNumberField(forms.Field):
    """A form field for a number an operator types, read by ``fleet.numbers.parse_number``
    (plain ASCII decimals in ``[low, high]``; ``whole`` for counts). Cleans to an int or a float."""

    def __init__(self, *, low, high, whole=False, example=None, cap_key="setting", **kwargs):
        self.low, self.high, self.whole, self.example, self.cap_key = low, high, whole, example, cap_key
        super().__init__(**kwargs)

    def to_python(self, value):
        """Parse the submitted text strictly; raises ``ValidationError`` naming the field."""
        text = str(value or "").strip()
        if not text:
            return None
        if error := too_long_error(str(self.label), text, self.cap_key):
            raise ValidationError(error, code="max_length")
        try:
            return parse_number(text, str(self.label), low=self.low, high=self.high, whole=self.whole,
                                example=self.example)
        except NumberError as exc:
            raise ValidationError(str(exc), code="invalid") from None


class TargetField(forms.Field):
    """A form field for the target proofs/hr; cleans to a float via :func:`parse_target`."""

    def to_python(self, value):
        """Parse the submitted text strictly; raises ``ValidationError`` (see :func:`parse_target`)."""
        text = str(value or "").strip()
        if not text:
            return None
        if error := too_long_error(str(self.label), text, "target"):
            raise ValidationError(error, code="max_length")
        return parse_target(text)


class TargetForm(forms.Form):
    """The target rate of proofs per hour (stored on the session-state anchor)."""

    target = TargetField(label="target proofs/hr", error_messages={"required": "enter a target, e.g. 120"})
    reason = forms.CharField(label="why", required=False, max_length=CAPS["reason"], error_messages=too_long("reason"))


class MessageForm(forms.Form):
    """One chat message to the agent (starts a run)."""

    text = forms.CharField(
        label="message",
        max_length=CAPS["message"],
        strip=True,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "Tell the agent what to do…"}),
        error_messages={"required": "the message is empty; type what the agent should do", **too_long("message")},
    )


class EnqueueForm(forms.Form):
    """How many demo proving tasks to add to the local queue."""

    n = OperatorNumberField(label="the number of tasks", low=1, high=10_000, whole=True, example="5", initial=5,
                            error_messages={"required": "the number of tasks must be a whole number, e.g. 5"})


class DecisionForm(forms.Form):
    """An operator's answer to a parked call: approve, or reject with a comment saying why."""

    decision = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")],
                                 error_messages={"required": "choose approve or reject",
                                                 "invalid_choice": "choose approve or reject"})
    comment = forms.CharField(required=False, max_length=CAPS["comment"], strip=True, error_messages=too_long("comment"))

    def clean(self):
        data = super().clean()
        if data.get("decision") == "reject" and not data.get("comment"):
            self.add_error("comment", "a rejection needs a comment saying why (the agent reads it)")
        return data


class AckForm(forms.Form):
    """Acknowledge a firing alert: the comment tells other operators who is on it."""

    comment = forms.CharField(max_length=CAPS["comment"], strip=True,
                              error_messages={"required": "say what you are doing about it", **too_long("comment")})


class InstanceActionForm(forms.Form):
    """An operator's action on one instance. ``request_key`` is the form's one-time token: a
    replayed POST of the same form is refused as ``duplicate``."""

    ACTIONS = ["stop", "destroy", "reboot", "resume", "cordon", "uncordon"]
    action = forms.ChoiceField(choices=[(a, a) for a in ACTIONS],
                               error_messages={"required": "choose an action (there is no default: each one changes the instance)",
                                               "invalid_choice": "unknown action %(value)s"})
    reason = forms.CharField(max_length=CAPS["reason"], strip=True,
                             error_messages={"required": "say why (the reason goes to the audit log)", **too_long("reason")})
    override_reason = forms.CharField(required=False, max_length=CAPS["override_reason"], strip=True,
                                      error_messages=too_long("override_reason"))
    request_key = forms.CharField(required=False, max_length=CAPS["request_key"], error_messages=too_long("request_key"))


class ObserveOnlyForm(forms.Form):
    """The observe-only switch: ``on`` true stops every side effect (the agent still proposes)."""

    on = forms.BooleanField(required=False)
    reason = forms.CharField(required=False, max_length=CAPS["reason"], strip=True, error_messages=too_long("reason"))


class ResetForm(forms.Form):
    """Reset session: a new conversation epoch (runs stay visible, the anchor keeps counting).
    Without ``confirm=yes`` the view only asks (the confirmation step, no JavaScript needed)."""

    reason = forms.CharField(required=False, max_length=CAPS["reason"], strip=True, error_messages=too_long("reason"))
    confirm = forms.CharField(required=False, max_length=8)

    def confirmed(self) -> bool:
        return self.cleaned_data.get("confirm") == "yes"


POLICY_CHOICES = [("auto", "auto"), ("approval", "approval"), ("forbidden", "forbidden")]


class SettingsForm(forms.Form):
    """The settings page: one select per policy key, one input per limit, and why.

    Fields are ``policy__<key>`` and ``limits__<key>``; per-priority launch keys may be left
    empty ("same as launch_instance"). Ranges are checked by ``agent.actions.settings.validate_overrides``
    (the one place), whose errors the view attaches to the field they name.
    """

    reason = forms.CharField(max_length=CAPS["reason"], strip=True,
                             error_messages={"required": "say why (every settings change is audited)", **too_long("reason")})

    def __init__(self, *args, policy: dict, limits: dict, inherit_keys=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.policy_fields, self.limit_fields = [], []
        for key, value in policy.items():
            name = "policy__" + key.replace(":", "__")
            choices = ([("", "same as launch_instance")] if key in inherit_keys else []) + POLICY_CHOICES
            self.fields[name] = forms.ChoiceField(label=key, choices=choices, required=key not in inherit_keys,
                                                  initial=value)
            self.policy_fields.append((key, name))
        for key, value in limits.items():
            name = "limits__" + key
            initial = ", ".join(str(v) for v in value) if isinstance(value, list | tuple) else value
            self.fields[name] = forms.CharField(label=key, initial=initial, max_length=CAPS["setting"], strip=True,
                                                error_messages={"required": f"{key} needs a value",
                                                                **too_long(key, "setting")})
            self.limit_fields.append((key, name))

    def overrides(self) -> tuple[dict, dict]:
        """The submitted values as ``(policy, limits)`` for ``do_update_overrides`` (lists split)."""
        policy = {key: (self.cleaned_data[name] or None) for key, name in self.policy_fields}
        limits = {}
        for key, name in self.limit_fields:
            # the text as typed: ``agent.actions.settings.validate_overrides`` reads numbers and lists by the one
            # rule (``fleet.numbers``), so "[[6, 600]]" or "1e-320" are refused there, not reshaped here
            limits[key] = self.cleaned_data[name]
        return policy, limits

    def field_name(self, dotted: str) -> str | None:
        """The form field of an ``OverrideError.field`` (``limits.max_dph`` → ``limits__max_dph``)."""
        part, _, key = dotted.partition(".")
        name = f"{part}__{key.replace(':', '__')}"
        return name if name in self.fields else None


ROLE_CHOICES = [("operator", "operator: acts and approves"), ("viewer", "viewer: sees, cannot act")]


class AddUserForm(forms.Form):
    """The Users page's add form (superusers): name, role, password twice, why."""

    username = forms.CharField(max_length=150, strip=True, error_messages={
        "required": "enter a username", "max_length": "username is too long: at most 150 characters"})
    role = forms.ChoiceField(choices=ROLE_CHOICES, error_messages={"invalid_choice": "role must be operator or viewer"})
    password1 = forms.CharField(label="password", max_length=1024, strip=False, widget=forms.PasswordInput,
                                error_messages={"required": "enter a password",
                                                "max_length": "password is too long: at most 1,024 characters"})
    password2 = forms.CharField(label="password again", max_length=1024, strip=False, widget=forms.PasswordInput,
                                error_messages={"required": "enter the password again",
                                                "max_length": "password is too long: at most 1,024 characters"})
    reason = forms.CharField(required=False, max_length=CAPS["reason"], strip=True, error_messages=too_long("reason"))

    def clean(self):
        data = super().clean()
        if data.get("password1") and data.get("password2") and data["password1"] != data["password2"]:
            self.add_error("password2", "the two passwords differ; type the same one twice")
        return data


class RoleForm(forms.Form):
    """Change one user's role (superusers)."""

    role = forms.ChoiceField(choices=ROLE_CHOICES, error_messages={"invalid_choice": "role must be operator or viewer",
                                                                   "required": "choose operator or viewer"})
    reason = forms.CharField(required=False, max_length=CAPS["reason"], strip=True, error_messages=too_long("reason"))


class ActiveForm(forms.Form):
    """Deactivate (``active`` absent or false) or reactivate one user (superusers)."""

    active = forms.BooleanField(required=False)
    reason = forms.CharField(required=False, max_length=CAPS["reason"], strip=True, error_messages=too_long("reason"))


class SilenceForm(forms.Form):
    """Silence an alert for one of ``agent.actions.alerts.SILENCE_CHOICES`` minutes, saying why (optional)."""

    minutes = forms.TypedChoiceField(coerce=int, choices=[], error_messages={
        "required": "choose how long to silence it", "invalid_choice": "choose one of the offered durations"})
    comment = forms.CharField(required=False, max_length=CAPS["comment"], strip=True, error_messages=too_long("comment"))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["minutes"].choices = [(m, m) for m in SILENCE_CHOICES]
