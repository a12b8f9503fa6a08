"""An instance's timeline: launches, diagnoses, actions, the agent's calls, alerts and proof rates
on one line of time (``agent.runtime.timeline``). A section of the instance page, loaded as a partial;
``?kind=`` (repeatable) narrows it to some kinds."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agent.runtime.timeline import KINDS, instance_timeline
from console.views.common import HtmxHttpRequest, _is_region, _page_context
from console.views.instances import _instance


@login_required
@require_GET
@never_cache
def timeline_page(request: HtmxHttpRequest, external_id: str) -> HttpResponse:
    """The timeline of ``external_id``, newest first. htmx GET: the partial (the instance page's
    Timeline section); otherwise a page of its own. 404 for an unknown instance."""
    inst = _instance(external_id)
    kinds = tuple(k for k in request.GET.getlist("kind") if k in KINDS) or KINDS
    ctx = _page_context(request, inst=inst, events=instance_timeline(inst, kinds), kinds=KINDS, chosen=kinds)
    if _is_region(request):
        return render(request, "console/partials/instance_timeline.html", ctx)
    return render(request, "console/instance_timeline.html", ctx)
