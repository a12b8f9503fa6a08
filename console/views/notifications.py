"""The Notifications page: each operator's email address, webhook reference and the kinds they want.

Anyone signed in sees their own settings and the last notifications sent to them; operators save
(``do_save_notification_settings``, audited). The webhook is a reference (``env:NAME`` or
``file:/path``): the page shows the reference and whether it resolves now, never the URL.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from agent.actions.notifications import do_save_notification_settings
from agent.models import Notification, NotificationSettings
from agent.notify.notifications import KINDS, check_webhook_ref, reference_status
from agent.notify.notifications import send_test as queue_test
from console.templatetags.console_extras import can_act
from console.views.common import HtmxHttpRequest, _page_context, actor_of, operator_required

RECENT = 20


@login_required
@require_http_methods(["GET", "POST"])
@never_cache
def notifications_page(request: HtmxHttpRequest) -> HttpResponse:
    """GET: the signed-in user's settings and their last :data:`RECENT` notifications. POST
    (operators): ``email``, ``webhook_ref``, ``kind`` (repeated); bad input is named and nothing
    is saved (400); saved: a redirect back."""
    prefs = NotificationSettings.objects.filter(user=request.user).first() or NotificationSettings(user=request.user)
    form = {"email": prefs.email, "webhook_ref": prefs.webhook_ref, "kinds": list(prefs.kinds or [])}
    error, status = "", 200
    if request.method == "POST":
        if not can_act(request.user):
            return HttpResponseForbidden("viewers cannot act")
        form = {"email": request.POST.get("email", ""), "webhook_ref": request.POST.get("webhook_ref", ""),
                "kinds": request.POST.getlist("kind")}
        try:
            do_save_notification_settings(request.user, email=form["email"], webhook_ref=form["webhook_ref"],
                                          kinds=form["kinds"], actor=actor_of(request))
        except ValueError as exc:
            error, status = str(exc), 400
            try:
                check_webhook_ref(form["webhook_ref"])
            except ValueError:
                form["webhook_ref"] = ""  # not a reference: it may be the URL with its token, never echoed back
        else:
            messages.success(request, "notification settings saved")
            return redirect("notification_settings")
    ctx = _page_context(
        request, form=form, error=error, kinds=KINDS.items(),
        webhook_status=reference_status(prefs.webhook_ref) if prefs.webhook_ref else "",
        recent=Notification.objects.filter(user=request.user).order_by("-created_at", "-pk")[:RECENT],
    )
    return render(request, "console/notifications.html", ctx, status=status)


@operator_required
def send_test(request: HtmxHttpRequest) -> HttpResponse:
    """"Send a test": one message on each channel the operator configured
    (``agent.notify.notifications.send_test``); none configured: 400 saying what to set first."""
    try:
        rows = queue_test(request.user, actor_of(request))
    except ValueError as exc:
        messages.error(request, str(exc))
        return redirect("notification_settings")
    messages.success(request, f"test queued on {', '.join(r.channel for r in rows)}; its status is below")
    return redirect("notification_settings")
