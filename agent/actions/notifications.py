"""An operator's notification settings: email, webhook reference, kinds (docs/notifications.md).

Each ``do_*`` writes its audit row and announces change topics after commit (``agent.actions``).
"""


from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction

from agent.actions.text import check_text
from agent.models import NotificationSettings
from agent.notify.notifications import KINDS, check_webhook_ref
from fleet.audit import do_audit


@transaction.atomic
def do_save_notification_settings(user, *, email: str, webhook_ref: str, kinds: list[str], actor: str):
    """Store ``user``'s notification settings: an email address (or empty), a webhook reference
    (``env:NAME`` / ``file:/path``, or empty; never a URL: ``agent.notify.notifications.check_webhook_ref``)
    and the kinds wanted (``agent.notify.notifications.KINDS``). Raises ValueError naming the field.
    Audited as ``notification_settings`` (the reference's name only). Returns the settings row."""
    email = check_text("email", email, limit=254)
    if email:
        try:
            validate_email(email)
        except ValidationError:
            raise ValueError(f"email: {email!r} is not an email address") from None
    webhook_ref = check_webhook_ref(check_text("webhook", webhook_ref, limit=500))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"kinds: unknown kind {unknown[0]!r}; known: {', '.join(KINDS)}")
    prefs, _ = NotificationSettings.objects.select_for_update().get_or_create(user=user)
    before = {"email": prefs.email, "webhook_ref": prefs.webhook_ref, "kinds": prefs.kinds}
    prefs.email, prefs.webhook_ref, prefs.kinds = email, webhook_ref, [k for k in KINDS if k in kinds]
    prefs.save()
    do_audit(actor, "notification_settings", f"user:{user.get_username()}", "", before,
             {"email": prefs.email, "webhook_ref": prefs.webhook_ref, "kinds": prefs.kinds})
    return prefs
