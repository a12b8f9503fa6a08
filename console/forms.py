"""Operator input on the console: target proofs/hr, chat messages, demo queue size."""

from django import forms


class TargetForm(forms.Form):
    """The target rate of proofs per hour (stored on the session-state anchor)."""

    target = forms.FloatField(
        label="target proofs/hr",
        min_value=0,
        max_value=1_000_000,
        error_messages={"invalid": "target proofs/hr must be a number, e.g. 120", "required": "enter a target"},
    )
    reason = forms.CharField(label="why", required=False, max_length=500)


class MessageForm(forms.Form):
    """One chat message to the agent (starts a run)."""

    text = forms.CharField(
        label="message",
        max_length=4000,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "Tell the agent what to do…"}),
        error_messages={"required": "the message is empty; type what the agent should do"},
    )


class EnqueueForm(forms.Form):
    """How many demo proving tasks to add to the local queue."""

    n = forms.IntegerField(
        label="tasks",
        min_value=1,
        max_value=10_000,
        initial=5,
        error_messages={"invalid": "the number of tasks must be a whole number, e.g. 5"},
    )
