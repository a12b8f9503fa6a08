"""The Users page (superusers only): every user with their role; add a user with a role, change a
role, deactivate or reactivate. Each POST calls one ``console.users.do_*`` (audited), then
redirects to the page; bad input re-renders the page with the error (400). Operators and viewers
get 403, anonymous users the login page."""

import functools

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from console.forms import ActiveForm, AddUserForm, RoleForm
from console.users import ROLES, UserError, can_manage_users, do_add_user, do_set_active, do_set_role, users_table


def _actor(request) -> str:
    return f"user:{request.user.get_username()}"


def superuser_required(view):
    """Signed in and a superuser; others get 403 ``only superusers manage users``."""

    @functools.wraps(view)
    @login_required
    def wrapped(request, *args, **kwargs):
        if not can_manage_users(request.user):
            return HttpResponseForbidden("only superusers manage users")
        return view(request, *args, **kwargs)

    return wrapped


def _page(request, status: int = 200, add_form=None, error: str = ""):
    ctx = {"rows": users_table(), "roles": ROLES, "add_form": add_form or AddUserForm(), "error": error}
    return render(request, "console/users.html", ctx, status=status)


@require_GET
@never_cache
@superuser_required
def users_page(request):
    """GET ``/users/``: the users and the add form; an htmx region GET (on ``users-changed``): the table."""
    if request.htmx and not request.htmx.boosted:
        return render(request, "console/partials/users.html", {"rows": users_table(), "roles": ROLES})
    return _page(request)


def _errors(form) -> str:
    return "; ".join(e for errs in form.errors.values() for e in errs)


@require_POST
@superuser_required
def add_user(request):
    """POST ``/users/add/``: ``username``, ``role``, ``password1``, ``password2``, ``reason``."""
    form = AddUserForm(request.POST)
    if form.is_valid():
        d = form.cleaned_data
        try:
            user = do_add_user(d["username"], d["role"], d["password1"], actor=_actor(request), reason=d["reason"])
        except UserError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"added {user.username} as {d['role']}")
            return redirect("users")
    return _page(request, status=400, add_form=form)


@require_POST
@superuser_required
def set_role(request, pk: int):
    """POST ``/users/<pk>/role/``: ``role`` (operator or viewer), ``reason``."""
    user = get_object_or_404(User, pk=pk)
    form = RoleForm(request.POST)
    if not form.is_valid():
        return _page(request, status=400, error=f"{user.username}: {_errors(form)}")
    try:
        do_set_role(user, form.cleaned_data["role"], actor=_actor(request), reason=form.cleaned_data["reason"])
    except UserError as exc:
        return _page(request, status=400, error=str(exc))
    messages.success(request, f"{user.username} is now {form.cleaned_data['role']}")
    return redirect("users")


@require_POST
@superuser_required
def set_active(request, pk: int):
    """POST ``/users/<pk>/active/``: ``active`` (on to reactivate, absent to deactivate), ``reason``."""
    user = get_object_or_404(User, pk=pk)
    form = ActiveForm(request.POST)
    if not form.is_valid():
        return _page(request, status=400, error=f"{user.username}: {_errors(form)}")
    active = form.cleaned_data["active"]
    try:
        do_set_active(user, active, actor=_actor(request), reason=form.cleaned_data["reason"], acting_user=request.user)
    except UserError as exc:
        return _page(request, status=400, error=str(exc))
    messages.success(request, f"{user.username} {'reactivated' if active else 'deactivated'}")
    return redirect("users")
