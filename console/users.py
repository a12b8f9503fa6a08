"""Console users and their roles: who may look, who may act, who may manage users.

Roles (docs/operations.md, Users and roles; the one place the rule lives):

- ``superuser``: everything an operator does, plus the Users page (add, change role, deactivate);
- ``operator`` (group ``operators``): acts and approves;
- ``viewer`` (group ``viewers``, or any signed-in user in neither group): sees every page with the
  action buttons disabled and gets 403 on every side-effect POST.

Changes go through one ``do_*`` each (the style of ``agent.actions``): it writes the audit row
(actor, ``add_user``/``set_role``/``deactivate_user``/``activate_user``, target ``user:<name>``,
never a password), announces ``users-changed`` after commit and updates the user's open sockets
(a new role is pushed to them; a deactivated user's sockets are closed). The ``adduser``,
``setrole``, ``deactivateuser``, ``activateuser`` and ``listusers`` commands and the Users page
call these.
"""

import unicodedata

from django.contrib.auth.models import Group, User
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import transaction

from console.broadcast import send_to_user
from fleet.audit import do_audit
from fleet.events import emit
from fleet.skeleton import skeleton

#: the roles a user can be given (superusers are made with ``createsuperuser``)
ROLES = ("operator", "viewer")
#: the group that carries each role
GROUPS = {"operator": "operators", "viewer": "viewers"}
#: the longest password accepted (hashing cost is bounded before any work)
PASSWORD_CAP = 1024


class UserError(ValueError):
    """A user change that cannot be made; the message names the field and what to do."""


def normalise_username(username: str) -> str:
    """``username`` as it is stored: surrounding spaces stripped, Unicode NFKC (full-width
    ``ｏｐｅｒａｔｏｒ`` is ``operator``; Django's own ``normalize_username`` does the same at save)."""
    return unicodedata.normalize("NFKC", (username or "").strip())


def username_key(username: str) -> str:
    """What two usernames must not share: the UTS #39 confusable skeleton of the NFKC form, case
    folded (``fleet.skeleton.skeleton``). ``operator``, ``OPERATOR``, ``оperator`` (a Cyrillic о) and
    ``0perator`` have one key, so only the first of them can exist."""
    return skeleton(normalise_username(username).casefold()).casefold()


def clashing_user(username: str) -> User | None:
    """The existing user whose name :func:`username_key` cannot tell from ``username`` (None when none)."""
    key = username_key(username)
    for user in User.objects.only("pk", "username").order_by("pk"):
        if username_key(user.username) == key:
            return user
    return None


def role_of(user) -> str:
    """``"superuser"``, ``"operator"`` or ``"viewer"`` for a signed-in user (``""`` for anonymous).

    Cached on the user object for the request (templates ask several times)."""
    if not getattr(user, "is_authenticated", False):
        return ""
    cached = getattr(user, "_warden_role", None)
    if cached is None:
        if user.is_superuser:
            cached = "superuser"
        elif user.groups.filter(name=GROUPS["operator"]).exists():
            cached = "operator"
        else:
            cached = "viewer"
        user._warden_role = cached
    return cached


def can_act(user) -> bool:
    """True for operators and superusers: side-effect POSTs are allowed."""
    return role_of(user) in ("operator", "superuser")


def can_manage_users(user) -> bool:
    """True for superusers: the Users page and its actions."""
    return role_of(user) == "superuser"


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise UserError(f"role must be one of {', '.join(ROLES)} (got {role!r})")


def _set_groups(user: User, role: str) -> None:
    for name in GROUPS.values():
        Group.objects.get_or_create(name=name)
    user.groups.remove(*Group.objects.filter(name__in=GROUPS.values()))
    user.groups.add(Group.objects.get(name=GROUPS[role]))
    user.__dict__.pop("_warden_role", None)


def _after_commit(user_id: int, event: dict) -> None:
    transaction.on_commit(lambda: send_to_user(user_id, event))


@transaction.atomic
def do_add_user(username: str, role: str, password: str, *, actor: str, reason: str = "") -> User:
    """Create ``username`` with ``role`` and ``password`` (Django's password validators apply).

    The name is normalised first (:func:`normalise_username`, NFKC) and refused when an existing
    name has the same :func:`username_key` (case, width and UTS #39 confusables ignored).
    Raises :class:`UserError` for a bad, taken or look-alike name, an unknown role or a weak password; nothing
    is written then. Audited as ``add_user`` with the role (never the password)."""
    typed = (username or "").strip()
    username = normalise_username(typed)
    if not username or len(username) > 150:
        raise UserError("username: 1 to 150 characters (letters, digits and @/./+/-/_)")
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError:
        raise UserError(f"username {typed!r}: use letters, digits and @/./+/-/_ only") from None
    _check_role(role)
    if (other := clashing_user(username)) is not None:
        same = other.username == username
        raise UserError(f"username {typed!r} is taken; change that user's role instead" if same else
                        f"username {typed!r} looks like the existing user {other.username!r} (the same letters up to case, "
                        "width or look-alike characters from other scripts); choose a name that differs in its letters")
    if not password or len(password) > PASSWORD_CAP:
        raise UserError(f"password: 1 to {PASSWORD_CAP} characters")
    candidate = User(username=username)
    try:
        validate_password(password, candidate)
    except ValidationError as exc:
        raise UserError("password: " + " ".join(exc.messages)) from None
    user = User.objects.create_user(username, password=password)
    _set_groups(user, role)
    do_audit(actor, "add_user", f"user:{username}", reason, None, {"role": role, "active": True})
    emit("users-changed")
    return user


@transaction.atomic
def do_set_role(user: User, role: str, *, actor: str, reason: str = "") -> User:
    """Give ``user`` the ``role`` (operator or viewer). Superusers keep theirs (:class:`UserError`).

    Audited as ``set_role`` with the role before and after; the user's open consoles get the new
    role at once (their socket's topics follow it)."""
    _check_role(role)
    user = User.objects.select_for_update().get(pk=user.pk)
    if user.is_superuser:
        raise UserError(f"{user.username} is a superuser; superusers are managed with createsuperuser and the admin")
    before = role_of(user)
    _set_groups(user, role)
    do_audit(actor, "set_role", f"user:{user.username}", reason, {"role": before}, {"role": role})
    emit("users-changed")
    _after_commit(user.pk, {"type": "console.set_role", "role": role})
    return user


@transaction.atomic
def do_set_active(user: User, active: bool, *, actor: str, reason: str = "", acting_user: User | None = None) -> User:
    """Deactivate (``active=False``) or reactivate ``user``. A deactivated user cannot sign in, their
    session stops working at the next request and their open sockets are closed.

    Refused (:class:`UserError`): deactivating yourself, or the last active superuser."""
    user = User.objects.select_for_update().get(pk=user.pk)
    if not active:
        if acting_user is not None and acting_user.pk == user.pk:
            raise UserError("you cannot deactivate yourself; ask another superuser")
        if user.is_superuser and not User.objects.filter(is_superuser=True, is_active=True).exclude(pk=user.pk).exists():
            raise UserError(f"{user.username} is the last active superuser; keep one")
    if user.is_active == active:
        return user
    user.is_active = active
    user.save(update_fields=["is_active"])
    do_audit(actor, "activate_user" if active else "deactivate_user", f"user:{user.username}", reason,
             {"active": not active}, {"active": active})
    emit("users-changed")
    if not active:
        _after_commit(user.pk, {"type": "console.force_close"})
    return user


def users_table() -> list[dict]:
    """Every user, by name: ``{"user", "role", "active", "last_login", "date_joined"}`` (two queries)."""
    operators = set(User.objects.filter(groups__name=GROUPS["operator"]).values_list("pk", flat=True))
    rows = []
    for user in User.objects.order_by("username"):
        role = "superuser" if user.is_superuser else "operator" if user.pk in operators else "viewer"
        rows.append({"user": user, "role": role, "active": user.is_active, "last_login": user.last_login,
                     "date_joined": user.date_joined})
    return rows
