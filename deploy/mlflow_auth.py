"""Authentication on the stack's MLflow server: MLflow's basic-auth app, its config file, and the task user.

The server runs ``mlflow server --app-name basic-auth`` with ``MLFLOW_AUTH_CONFIG_PATH`` naming a 0600
config file (``config_text``): users and permissions in a SQLite DB under <home>/mlflow, and user
``admin`` created with the generated password on the first start (afterwards MLflow ignores that line).
Every request but ``/health`` and the static files needs a user; an anonymous one is answered 401.

``ensure_user`` then creates users ``tasks`` and ``registrar`` through MLflow's REST API as admin, or resets
their passwords, and makes sure neither is an admin. The Airflow workers get one of them (as
``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, which MLflow's client reads): the register
worker ``registrar``, every other worker ``tasks``. What a user may do is READ (the default permission) plus
its grants (``grants``, applied by ``ensure_grants``): both may write to every experiment (``*``: runs,
metrics, artifacts, logged models; experiments logged before authentication was on stay writable), and an
experiment or registered model a user creates is its own (MLflow gives its creator MANAGE); only
``registrar`` may change the stack's registered model, whose versions and ``champion`` alias MLflow guards
with the same EDIT, and ``tasks`` may only read it. ``ensure_registered_model`` creates that model as admin,
so that no task is its creator. (MLflow treats the default as a floor under every grant: with EDIT as the
default, ``tasks``'s READ would read as EDIT.) No user but admin may change permissions or manage users.

Standard library only: ``deploy`` drives MLflow through its CLI and REST API, never imports it.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

ADMIN, TASKS, REGISTRAR = "admin", "tasks", "registrar"
APP = "basic-auth"
DEFAULT_PERMISSION = "READ"
# A password check hashes (scrypt, ~0.15 s of CPU): without a cache every metric a task logs pays it. The server
# runs one worker, so a password changed through the API takes effect at once; one changed in the DB, in 5 min.
AUTH_CACHE_SECONDS = 300
USERS = "/api/2.0/mlflow/users"
GRANTS = "/api/3.0/mlflow/users/permissions"  # per user: list, grant, revoke
MODELS = "/api/2.0/mlflow/registered-models"


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


def grants(model: str) -> dict[str, dict[tuple[str, str], str]]:
    """Each user's grants beyond the default READ, by (resource type, name or ``*``): both write to every
    experiment; registered model ``model`` is changed by ``registrar`` only."""
    return {
        TASKS: {("experiment", "*"): "EDIT", ("registered_model", model): "READ"},
        REGISTRAR: {("experiment", "*"): "EDIT", ("registered_model", model): "EDIT"},
    }


def ensure_registered_model(base_url: str, admin_password: str, model: str) -> None:
    """Create registered model ``model`` as admin when missing (no task becomes its creator)."""
    if _call(base_url, "GET", f"{MODELS}/get?name={quote(model)}", admin_password) is None:
        description = f"Distilled ads-relevance students; versions and aliases by MLflow user {REGISTRAR} only"
        _call(base_url, "POST", f"{MODELS}/create", admin_password, {"name": model, "description": description})


def ensure_grants(base_url: str, admin_password: str, username: str, wanted: dict[tuple[str, str], str]) -> None:
    """Give ``username`` exactly the permission of ``wanted`` on each of its resources, whatever it held
    (its creator's MANAGE, say): a grant that differs is revoked, then granted."""
    listed = _call(base_url, "GET", f"{GRANTS}/list?username={quote(username)}", admin_password) or {}
    held = {(g["resource_type"], g["resource_pattern"]): g["permission"] for g in listed.get("permissions", [])}
    for (resource_type, resource), permission in wanted.items():
        if held.get((resource_type, resource)) == permission:
            continue
        grant = {"username": username, "resource_type": resource_type, "resource_id": resource}
        if (resource_type, resource) in held:
            _call(base_url, "POST", f"{GRANTS}/revoke", admin_password, grant)
        _call(base_url, "POST", f"{GRANTS}/grant", admin_password, {**grant, "permission": permission})
