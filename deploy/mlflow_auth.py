"""Authentication on the stack's MLflow server: MLflow's basic-auth app, its config file, and the task user.

The server runs ``mlflow server --app-name basic-auth`` with ``MLFLOW_AUTH_CONFIG_PATH`` naming a 0600
config file (``config_text``): users and permissions in a SQLite DB under <home>/mlflow, and user
``admin`` created with the generated password on the first start (afterwards MLflow ignores that line).
Every request but ``/health`` and the static files needs a user; an anonymous one is answered 401.

``ensure_user`` then creates user ``tasks`` through MLflow's REST API as admin, or resets its password,
and makes sure it is not an admin. The Airflow workers get that user only (as ``MLFLOW_TRACKING_USERNAME``
and ``MLFLOW_TRACKING_PASSWORD``, which MLflow's client reads): tasks create experiments, runs and
registered models (MLflow gives their creator MANAGE on them) and write to the others (the default
permission, EDIT: experiments logged before authentication was on stay writable), but cannot delete
what they did not create, change permissions or manage users.

Standard library only: ``deploy`` drives MLflow through its CLI and REST API, never imports it.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

ADMIN, TASKS = "admin", "tasks"
APP = "basic-auth"
DEFAULT_PERMISSION = "EDIT"
# A password check hashes (scrypt, ~0.15 s of CPU): without a cache every metric a task logs pays it. The server
# runs one worker, so a password changed through the API takes effect at once; one changed in the DB, in 5 min.
AUTH_CACHE_SECONDS = 300
USERS = "/api/2.0/mlflow/users"


class MlflowAuthError(RuntimeError):
    """MLflow's user API refused a request: the message has the request, the status and the fix."""


def config_text(database: Path, admin_password: str) -> str:
    """The basic-auth app's config file (an INI file read by configparser: ``%`` is doubled)."""
    return (
        "[mlflow]\n"
        f"default_permission = {DEFAULT_PERMISSION}\n"
        f"database_uri = sqlite:///{database}\n"
        f"admin_username = {ADMIN}\n"
        f"admin_password = {admin_password.replace('%', '%%')}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        f"auth_cache_ttl_seconds = {AUTH_CACHE_SECONDS}\n"
    )


def basic_auth(username: str, password: str) -> str:
    """The ``Authorization`` header of HTTP basic authentication."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def _call(base_url: str, method: str, path: str, admin_password: str, body: dict | None = None) -> dict | None:
    """One request as admin; None when the user asked about does not exist (404)."""
    request = urllib.request.Request(
        base_url.rstrip("/") + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": basic_auth(ADMIN, admin_password)},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # each check hashes a password: ~1 s
            raw = response.read()
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        detail = err.read().decode(errors="replace")[:300]
        fix = (
            " (MLflow keeps the admin password its user store was created with: restore the mlflow-admin.password "
            "it had, or delete the auth DB, i.e. its users and permissions, and restart the MLflow server)"
            if err.code == 401
            else ""
        )
        raise MlflowAuthError(f"{method} {path}: HTTP {err.code} {detail}{fix}") from err
    return json.loads(raw) if raw else {}


def ensure_user(base_url: str, admin_password: str, username: str, password: str) -> None:
    """Make ``username`` a non-admin MLflow user with ``password``: created, or its password reset."""
    found = _call(base_url, "GET", f"{USERS}/get?username={quote(username)}", admin_password)
    if found is None:
        _call(base_url, "POST", f"{USERS}/create", admin_password, {"username": username, "password": password})
        return
    _call(base_url, "PATCH", f"{USERS}/update-password", admin_password, {"username": username, "password": password})
    if found["user"]["is_admin"]:
        _call(base_url, "PATCH", f"{USERS}/update-admin", admin_password, {"username": username, "is_admin": False})
