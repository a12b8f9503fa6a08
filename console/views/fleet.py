"""The fleet page: every instance with its status, worker and heartbeat."""

import uuid

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from console.views.common import HtmxHttpRequest, _is_region, _page_context
from fleet.models import Instance


def fleet_context(show_killed: bool) -> dict:
    """Instances (killed ones hidden unless ``show_killed``) and how many are hidden."""
    qs = Instance.objects.order_by("-created_at")
    hidden = 0
    if not show_killed:
        hidden = Instance.objects.filter(killed_at__isnull=False).count()
        qs = qs.filter(killed_at__isnull=True)
    return {"instances": list(qs), "hidden_count": hidden, "show_killed": show_killed}


@login_required
@require_GET
@never_cache
def fleet_page(request: HtmxHttpRequest) -> HttpResponse:
    """Every instance; ``?killed=1`` shows killed ones too. htmx GET: the table only."""
    ctx = _page_context(request, request_key=uuid.uuid4().hex, **fleet_context(request.GET.get("killed") == "1"))
    if _is_region(request):
        return render(request, "console/partials/fleet.html", ctx)
    return render(request, "console/fleet.html", ctx)
