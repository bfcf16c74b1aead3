"""The run's report page (pipelines.ads.distillation.report_page) from small hand-made inputs: the decision in its first
lines, the tables with their intervals, images inlined, nothing fetched; then in a real browser (headless Chromium,
as the deployment test drives it: deploy.screenshots), where it renders, its images load and the decision shows.
The page of a real run is checked by tests/pipelines/ads/test_pipeline.py."""

import base64
import json
import re
import shutil

import pytest

from pipelines.ads.distillation.report_page import PageContent, champion_line, render, teacher_summary
from pipelines.experiments.compare import report_pages
from pipelines.tracking import REPORT_TAG

# a 2x2 red PNG
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg=="
)


def figures(roc: float) -> dict:
    return {
        "pairs": 60,
        "accuracy": 0.5,
        "macro_f1": 0.4,
        "roc_auc_relevant": roc,
        "ndcg@10": 0.8,
        "ece": 0.1,
        "per_grade": {},
    }


def interval(difference: float, low: float, high: float) -> dict:
    return {"roc_auc_relevant": {"difference": difference, "low": low, "high": high, "samples_used": 100}}


REPORT = {
    "split": "test",
    "models": {"student": figures(0.91), "zero_shot": figures(0.70), "lexical": figures(0.85)},
    "differences": {
        "student - zero_shot": interval(0.21, 0.12, 0.30),
        "student - lexical": interval(0.06, 0.012, 0.11),
        "zero_shot - lexical": interval(-0.15, -0.25, -0.05),
    },
}
DECISION = {
    "model": "ads-relevance-student",
    "metric": "roc_auc_relevant",
    "candidate": "student",
    "version": 3,
    "promoted": True,
    "reason": "the pipeline's student is the candidate on roc_auc_relevant: it beats every simpler model",
    "teacher_skipped": None,
    "teacher_registration": {"model": "ads-relevance-student-teacher", "version": 2, "alias": "current"},
}


def page(decision=DECISION, report=REPORT, annotation=None, quarantine=None) -> str:
    teacher = {"status": "passed its gates", "figures": {"audit_accuracy_end": 0.6}, "registered": "registered"}
    return render(
        PageContent(
            run="week-7",
            decision=decision,
            report=report,
            confidence=0.95,
            plots=[("ranking curves", PNG), ("confusion", PNG)],
            data={
                "splits": {"train": {"pairs": 200, "gold": 200}, "test": {"pairs": 60, "gold": 60}},
                "annotation": annotation,
                "quarantine": quarantine,
            },
            teacher=teacher,
            links={"registration record": "student/registration.json"},
        )
    )


def test_the_decision_and_its_margin_come_first_then_every_model_and_interval_inlined_and_offline():
    html = page()
    first_lines = html.split("<body>", 1)[1].splitlines()[:3]
    assert "Run week-7: the pipeline&#x27;s student registered as version 3, promoted to champion" in first_lines[0]
    # by how much, against whom, with what interval: the strongest other model is the lexical matcher
    won = "student: roc_auc_relevant 0.9100; against the lexical matcher, the strongest other model on it: "
    assert won + "+0.060 [+0.012, +0.110]" in first_lines[1]
    assert "95% paired bootstrap interval on 60 gold test pairs" in first_lines[1]
    assert first_lines[2].startswith('<p class="reason"><b>Why:</b> the pipeline&#x27;s student is the candidate')
    assert "<th>model</th><th>accuracy</th><th>macro_f1</th><th>roc_auc_relevant</th><th>pr_auc_relevant</th>" in html
    for name in ("student", "zero-shot encoder", "lexical matcher"):
        assert f"<td>{name}</td>" in html
    assert "<tr class='chosen'><td>student</td>" in html  # the winner's row stands out
    assert "<td>student - lexical matcher</td><td>+0.060 [+0.012, +0.110]</td>" in html
    assert "<td>zero-shot encoder - lexical matcher</td><td>-0.150 [-0.250, -0.050]</td>" in html
    sources = re.findall(r'<img [^>]*src="([^"]*)"', html)
    assert len(sources) == 2 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert base64.b64decode(sources[0].split(",", 1)[1]) == PNG
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", html) and "http" not in html.lower()
    assert '<a href="student/registration.json">' in html and "<style>" in html


def test_a_loser_s_margin_is_read_from_the_difference_turned_round_and_nothing_registered_is_said():
    turned = {**DECISION, "candidate": "lexical"}
    kept = "lexical matcher: roc_auc_relevant 0.8500; against the pipeline&#x27;s student, the strongest other "
    assert kept + "model on it: -0.060 [-0.110, -0.012]" in page(turned)
    nothing = {**DECISION, "candidate": None, "version": None, "promoted": False, "reason": "no baseline was scored"}
    html = page(nothing, {**REPORT, "models": {}})
    assert "Run week-7: nothing registered</h1>" in html and 'class="decision none"' in html
    assert champion_line(nothing) == "nothing registered: no baseline was scored"
    assert champion_line(DECISION).startswith("the pipeline's student registered as version 3, promoted to champion (")


def test_the_data_section_counts_pairs_per_split_the_annotation_and_the_quarantine_by_reason():
    assert '<tr><td>train</td><td class="n">200</td><td class="n">200</td></tr>' in page()
    assert "annotation: none in this run" in page()
    annotated = page(annotation={"rows_in": 1210, "labels": 1203, "quarantined": 7}, quarantine={"empty_field": 3})
    assert '<tr><td>rows in</td><td class="n">1,210</td></tr>' in annotated
    assert '<tr><td>empty_field</td><td class="n">3</td></tr>' in annotated
    assert "nothing quarantined" in page(annotation={"rows_in": 10, "labels": 10, "quarantined": 0}, quarantine={})


def test_the_teacher_section_holds_the_gate_figures_or_why_it_was_skipped(tmp_path):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"audit_accuracy_end": 0.62}))
    used = teacher_summary(DECISION, summary, ("audit_accuracy_end", 0.5, 1.0, None))
    assert used["status"] == "passed its gates" and used["figures"] == {
        "audit_accuracy_end": 0.62,
        "gate_threshold": 0.5,
    }
    assert used["registered"] == "registered as ads-relevance-student-teacher version 2"
    skipped = {**DECISION, "teacher_skipped": {"step": "gate", "reason": "teacher audit accuracy 0.3 < 0.5"}}
    said = teacher_summary(skipped, tmp_path / "absent.json", ("audit_accuracy_end", 0.5, 1.0, None))
    assert said["status"] == "skipped at the gate step" and said["reason"] == "teacher audit accuracy 0.3 < 0.5"


def test_agpo_compare_names_each_run_s_report_page():
    rows = [
        {"run_key": "ads/a", REPORT_TAG: "file:///store/artifacts/1/abc/artifacts/report.html"},
        {"run_key": "ads/b"},
    ]
    listed = report_pages(rows).splitlines()
    assert listed[1] == "- ads/a: file:///store/artifacts/1/abc/artifacts/report.html"
    assert listed[2].startswith("- ads/b: none")


def test_the_page_renders_in_a_browser_with_its_images_loaded_and_the_decision_shown(tmp_path):
    pytest.importorskip("playwright", reason="Playwright is not installed (the project's .venv has it)")
    if shutil.which("chromium") is None:
        pytest.skip("Chromium is not installed: deploy/install-services.sh installs Debian's chromium package")
    from deploy.screenshots import local_page

    path = tmp_path / "report.html"
    path.write_text(page(), encoding="utf-8")
    check = local_page(path, tmp_path / "report.png")
    assert check.images == 2 and check.broken_images == () and check.refused == ()
    text = check.shot.text
    lines = [line for line in text.splitlines() if line.strip()]
    assert text.startswith("Run week-7: the pipeline's student registered as version 3, promoted to champion")
    assert "against the lexical matcher, the strongest other model on it: +0.060 [+0.012, +0.110]" in lines[1]
    png = check.shot.path.read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000  # a full page drawn, not a blank window
