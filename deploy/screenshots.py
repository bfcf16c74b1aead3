"""The stack's UIs as a user sees them: headless Debian Chromium, driven by Playwright, takes PNGs.

- Airflow: the graph of one DAG run (its mapped shard tasks included), logged in as the stack's admin
  through the ``_token`` cookie that Airflow's own login form would set.
- MLflow: the run comparison page of two runs (e.g. the AGPO and the GRPO teacher), as a user of its
  basic-auth app (the browser answers the server's HTTP basic-auth challenge).
- A local, self-contained page (a run's report.html): rendered with every network request refused, its
  images checked loaded.

Each shot returns the page's visible text too, so that a test can check what the picture shows.
Playwright uses the browser installed by Debian's ``chromium`` package; it never downloads one.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from deploy.mlflow_auth import basic_auth

# Chromium on a closed network: no background connections, no first-run or update traffic
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1600, "height": 1000}


@dataclass(frozen=True)
class Shot:
    path: Path
    text: str  # the page's visible text when the picture was taken


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        raise RuntimeError("Chromium is not installed: run deploy/install-services.sh (Debian package chromium)")
    return path


def _browser(playwright):
    args = CHROMIUM_ARGS + (["--no-sandbox"] if os.geteuid() == 0 else [])  # Chromium's sandbox refuses root
    return playwright.chromium.launch(executable_path=chromium(), headless=True, args=args)


def _settle(page, must_show: list[str], timeout_ms: int) -> str:
    """Wait until every string of ``must_show`` is on the page, then a moment for charts and layout to draw
    (MLflow's UI keeps polling, so the network never goes idle); returns the page's text."""
    for text in must_show:
        page.get_by_text(text, exact=False).first.wait_for(state="visible", timeout=timeout_ms)
    page.wait_for_timeout(3000)
    return page.inner_text("body")


def airflow_run_graph(
    base_url: str, token: str, dag_id: str, run_id: str, out: Path, must_show: list[str], timeout_ms: int = 60_000
) -> Shot:
    """The graph view of DAG run ``run_id``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = _browser(playwright)
        context = browser.new_context(viewport=VIEWPORT)
        context.add_cookies([{"name": "_token", "value": token, "url": base_url}])
        # the UI keeps its grid/graph choice in localStorage: open runs in the graph view
        context.add_init_script("window.localStorage.setItem('default_dag_view', JSON.stringify('graph'))")
        page = context.new_page()
        page.goto(f"{base_url}/dags/{quote(dag_id)}/runs/{quote(run_id)}", wait_until="domcontentloaded")
        text = _settle(page, must_show, timeout_ms)
        page.screenshot(path=str(out))
        browser.close()
    return Shot(out, text)


@dataclass(frozen=True)
class PageCheck:
    shot: Shot
    images: int  # <img> elements on the page
    broken_images: tuple[str, ...]  # the alt text of each image that did not load (naturalWidth 0)
    refused: tuple[str, ...]  # every request the page made beyond its own file (none are let through)


def local_page(path: Path, out: Path, timeout_ms: int = 30_000) -> PageCheck:
    """A self-contained HTML file as a browser shows it, with no network: every request other than the file itself
    is refused and named; a full-page screenshot goes to ``out`` once the page and its images have loaded."""
    from playwright.sync_api import sync_playwright

    url, refused = Path(path).resolve().as_uri(), []

    def refuse_all_but_the_page(route) -> None:
        if route.request.url == url:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_playwright() as playwright:
        browser = _browser(playwright)
        page = browser.new_context(viewport=VIEWPORT).new_page()
        page.route("**/*", refuse_all_but_the_page)
        page.goto(url, wait_until="load", timeout=timeout_ms)
        broken = page.eval_on_selector_all(
            "img", "all => all.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt)"
        )
        images = page.locator("img").count()
        page.screenshot(path=str(out), full_page=True)
        text = page.inner_text("body")
        browser.close()
    return PageCheck(Shot(out, text), images, tuple(broken), tuple(refused))


@contextmanager
def _mlflow_page(base_url: str, user: tuple[str, str], fragment: str, height: int):
    """A page of MLflow's UI (``#/<fragment>``) opened as ``user`` (name, password), ``height`` pixels tall:
    the UI scrolls inside its own panel, so a full-page shot would stop at the window's edge."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = _browser(playwright)
        credentials = {"username": user[0], "password": user[1]}
        page = browser.new_context(viewport={"width": 1400, "height": height}, http_credentials=credentials).new_page()
        page.goto(f"{base_url}/#/{fragment}", wait_until="domcontentloaded")
        try:
            yield page
        finally:
            browser.close()


def mlflow_compare(
    base_url: str,
    user: tuple[str, str],
    experiment_id: str,
    run_ids: list[str],
    out: Path,
    must_show: list[str],
    timeout_ms: int = 60_000,
) -> Shot:
    """MLflow's comparison page of ``run_ids`` (params side by side, metric charts), as ``user`` (name, password)."""
    query = f"runs={quote(json.dumps(run_ids))}&experiments={quote(json.dumps([experiment_id]))}"
    with _mlflow_page(base_url, user, f"compare-runs?{query}", 1700) as page:
        text = _settle(page, must_show, timeout_ms)
        assistant = page.get_by_text("MLflow Assistant")
        if assistant.count():  # a chat side panel that hides half of the comparison: close it
            page.locator("button[aria-label='Close'], button[aria-label='close']").first.click(timeout=5000)
        diff_only = page.get_by_text("Show diff only")
        if diff_only.count():  # parameters that differ (the algorithm), not the dozens that are equal
            diff_only.first.click(timeout=5000)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(out))
    return Shot(out, text)


def mlflow_model_card(
    base_url: str, user: tuple[str, str], model: str, out: Path, must_show: list[str], timeout_ms: int = 60_000
) -> Shot:
    """The registry page of ``model``'s newest version, whose description is its model card."""
    found = _mlflow_api(base_url, user)(f"/api/2.0/mlflow/registered-models/get?name={quote(model)}")
    version = max(int(v["version"]) for v in found["registered_model"]["latest_versions"])
    with _mlflow_page(base_url, user, f"models/{quote(model)}/versions/{version}", 1500) as page:
        text = _settle(page, must_show, timeout_ms)
        page.screenshot(path=str(out))
    return Shot(out, text)


def _mlflow_api(base_url: str, user: tuple[str, str]):
    """A caller of MLflow's REST API as ``user`` (name, password): ``call(path, body=None) -> JSON``."""
    headers = {"Content-Type": "application/json", "Authorization": basic_auth(*user)}

    def call(path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{base_url}{path}", data=data, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    return call


def stage_runs(
    base_url: str, user: tuple[str, str], experiment: str, run_keys: list[str], stage: str
) -> tuple[str, list[str]]:
    """The experiment id and the MLflow run ids of ``stage`` (e.g. ``train``) in each pipeline run of
    ``run_keys`` (``<dag_id>/<run name>``), through MLflow's REST API as ``user`` (name, password)."""
    call = _mlflow_api(base_url, user)
    experiment_id = call(f"/api/2.0/mlflow/experiments/get-by-name?experiment_name={quote(experiment)}")["experiment"][
        "experiment_id"
    ]
    run_ids = []
    for key in run_keys:
        found = call(
            "/api/2.0/mlflow/runs/search",
            {
                "experiment_ids": [experiment_id],
                "filter": f"tags.`agpo.run_key` = '{key}' and tags.`agpo.stage` = '{stage}'",
            },
        ).get("runs", [])
        if len(found) != 1:
            raise RuntimeError(
                f"expected one {stage!r} run of {key} in MLflow experiment {experiment}, found {len(found)}"
            )
        run_ids.append(found[0]["info"]["run_id"])
    return experiment_id, run_ids
