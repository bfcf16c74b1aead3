"""Authentication on the stack's MLflow server: MLflow's basic-auth app, its config file, and the task user.

The server runs ``mlflow server --app-name basic-auth`` with ``MLFLOW_AUTH_CONFIG_PATH`` naming a 0600
config file (``config_text``): users and permissions in a SQLite DB under <home>/mlflow, and user
``admin`` created with the generated password on the first start (afterwards MLflow ignores that line).
Every request but ``/health`` and the static files needs a user; an anonymous one is answered 401.

``ensure_user`` then creates users ``tasks`` and ``registrar`` through MLflow's REST API as admin, or resets
their passwords, and makes sure neither is an admin. The Airflow workers get one of them (as
``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, which MLflow's client reads): the register
worker ``registrar``, every other worker ``tasks``. What a user may do is READ (the default permission) plus
its grants (``grants``, applied by ``ensure_grants``; MLflow takes the highest grant that matches): ``registrar``
may write to every experiment (``*``: runs, metrics, artifacts, logged models) and change the stack's registered
models (``registered_models``: the students' and their teacher's), whose versions and aliases (``champion``,
``current``) MLflow guards with the same EDIT; ``tasks`` writes to the
experiments it creates (MLflow gives a creator MANAGE) and to every other experiment but the registry
experiments (``ensure_experiment_access`` grants EDIT on each, so experiments logged before this stay writable),
and only reads the registered models and the registry experiments. A registered version's files are a
LoggedModel of a registry experiment (``<experiment>-registry``, created by admin at ``up``), so a task can
neither upload to nor delete them (403), whatever it may do in the runs' experiment.
``ensure_registered_model`` creates the registered models as admin, so that no task is their creator. (MLflow
treats the default as a floor under every grant: with EDIT as the default, ``tasks``'s READ would read as
EDIT.) No user but admin may change permissions or manage users.

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
EXPERIMENTS = "/api/2.0/mlflow/experiments"
REGISTRY_SUFFIX = "-registry"  # pipelines.tracking.registry_experiment_name: <experiment>-registry
# pipelines.ads.serving.teacher_registry.teacher_model_name: the register step registers the teacher as <model>-teacher
TEACHER_SUFFIX = "-teacher"


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


def registered_models(model: str) -> dict[str, str]:
    """The registered models of a stack whose students are ``model``, each with its description: the students'
    and their teacher's (``<model>-teacher``: the register step registers a teacher that passed its gates)."""
    return {
        model: f"Distilled ads-relevance students; versions and aliases by MLflow user {REGISTRAR} only",
        model + TEACHER_SUFFIX: f"Ads-relevance LLM teachers that passed their gates; by MLflow user {REGISTRAR} only",
    }


def grants(model: str) -> dict[str, dict[tuple[str, str], str]]:
    """Each user's grants beyond the default READ, by (resource type, name or ``*``): ``registrar`` writes to
    every experiment and changes the registered models of ``model`` (``registered_models``); ``tasks`` only reads
    them, and writes to the experiments it creates (MLflow makes a creator MANAGE) and to those
    ``ensure_experiment_access`` grants it, never to a registry experiment. (MLflow takes the highest matching
    grant: a wildcard EDIT for ``tasks`` would outrank any narrower grant, so it has none.)"""
    models = registered_models(model)
    return {
        TASKS: {("registered_model", name): "READ" for name in models},
        REGISTRAR: {("experiment", "*"): "EDIT", **{("registered_model", name): "EDIT" for name in models}},
    }


def ensure_experiment_access(base_url: str, admin_password: str, registry_experiments: tuple[str, ...]) -> None:
    """The registry experiments (where the register step logs the registered versions' files:
    pipelines.tracking.registry_experiment_name) created as admin when missing; ``tasks`` holds no grant on any
    experiment whose name ends with ``REGISTRY_SUFFIX`` (revoked, e.g. a creator's MANAGE), so it only reads
    them, and EDIT on every other experiment it has no grant on (those made before it lost its wildcard)."""
    for name in registry_experiments:
        if _call(base_url, "GET", f"{EXPERIMENTS}/get-by-name?experiment_name={quote(name)}", admin_password) is None:
            _call(base_url, "POST", f"{EXPERIMENTS}/create", admin_password, {"name": name})
    listed = _call(base_url, "GET", f"{GRANTS}/list?username={TASKS}", admin_password) or {}
    held = {(g["resource_type"], g["resource_pattern"]) for g in listed.get("permissions", [])}
    for experiment in _experiments(base_url, admin_password):
        grant = {"username": TASKS, "resource_type": "experiment", "resource_id": experiment["experiment_id"]}
        if experiment["name"].endswith(REGISTRY_SUFFIX):
            if ("experiment", experiment["experiment_id"]) in held:
                _call(base_url, "POST", f"{GRANTS}/revoke", admin_password, grant)
        elif ("experiment", experiment["experiment_id"]) not in held:
            _call(base_url, "POST", f"{GRANTS}/grant", admin_password, {**grant, "permission": "EDIT"})


def _experiments(base_url: str, admin_password: str) -> list[dict]:
    """Every experiment of the server, page by page."""
    experiments, token = [], None
    while True:
        body = {"max_results": 1000, **({"page_token": token} if token else {})}
        page = _call(base_url, "POST", f"{EXPERIMENTS}/search", admin_password, body) or {}
        experiments += page.get("experiments", [])
        token = page.get("next_page_token")
        if not token:
            return experiments


def ensure_registered_model(base_url: str, admin_password: str, model: str) -> None:
    """Create the registered models of ``model`` (``registered_models``) as admin when missing (no task becomes
    their creator)."""
    for name, description in registered_models(model).items():
        if _call(base_url, "GET", f"{MODELS}/get?name={quote(name)}", admin_password) is None:
            _call(base_url, "POST", f"{MODELS}/create", admin_password, {"name": name, "description": description})


def ensure_grants(base_url: str, admin_password: str, username: str, wanted: dict[tuple[str, str], str]) -> None:
    """Give ``username`` exactly the permission of ``wanted`` on each of its resources, whatever it held
    (its creator's MANAGE, say): a grant that differs is revoked, then granted."""
    listed = _call(base_url, "GET", f"{GRANTS}/list?username={quote(username)}", admin_password) or {}
    held = {(g["resource_type"], g["resource_pattern"]): g["permission"] for g in listed.get("permissions", [])}
    for resource_type, resource in held:  # a wildcard it no longer gets (tasks' experiment EDIT of older stacks)
        if resource == "*" and (resource_type, resource) not in wanted:
            grant = {"username": username, "resource_type": resource_type, "resource_id": resource}
            _call(base_url, "POST", f"{GRANTS}/revoke", admin_password, grant)
    for (resource_type, resource), permission in wanted.items():
        if held.get((resource_type, resource)) == permission:
            continue
        grant = {"username": username, "resource_type": resource_type, "resource_id": resource}
        if (resource_type, resource) in held:
            _call(base_url, "POST", f"{GRANTS}/revoke", admin_password, grant)
        _call(base_url, "POST", f"{GRANTS}/grant", admin_password, {**grant, "permission": permission})
