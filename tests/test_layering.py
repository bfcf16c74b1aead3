"""The dependency direction of docs/design.md, read from the source: dags -> pipelines -> {agpo, evaluation ->
student} -> {durable, compute}, with deploy/ beside dags importing none of them; agpo imports neither student nor
evaluation, the student library never imports the evaluation room, and
only pipelines/tracking.py imports mlflow, with the student's MLflow model beside it
(pipelines/ads/serving/student_model.py logs and loads it; student_pyfunc.py beside it is the served code,
a ``mlflow.pyfunc.PythonModel`` that MLflow copies into the model, so it must import mlflow itself).
Inside pipelines/: the framework at its root (cli, config, steps, io, tracking, launch, plots, rl/, ...)
imports no pipeline; the ads and math pipelines never import each other; only the cross-run
experiments may import both. Module rules inside agpo/: it holds no experiment (the toy policy is in
pipelines/experiments/), and only agpo/pretrained/ (the GGUF model cache) imports agpo.pretrained."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "durable": {"agpo", "student", "evaluation", "compute", "pipelines", "dags", "mlflow", "airflow"},
    # where a model runs (Placement), below both libraries beside durable
    "compute": {"agpo", "student", "evaluation", "durable", "pipelines", "dags", "mlflow", "airflow"},
    "agpo": {"student", "evaluation", "pipelines", "dags", "mlflow", "airflow"},
    "student": {"agpo", "evaluation", "pipelines", "dags", "mlflow", "airflow"},
    # the evaluation room judges students (and a student is one of its baselines): above student, below pipelines
    "evaluation": {"agpo", "pipelines", "dags", "mlflow", "airflow"},
    "pipelines": {"dags", "airflow", "deploy"},
    # the deployment drives services through their CLIs and REST APIs, beside dags/
    "deploy": {"agpo", "student", "evaluation", "compute", "pipelines", "dags", "mlflow"},
}


# pipelines.<sub-package> -> the sub-packages it must not import
PIPELINES = {"ads": {"math", "experiments"}, "math": {"ads", "experiments"}, "experiments": set()}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, dotted (``from pipelines.ads.teacher import train`` gives
    pipelines.ads.teacher.train)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def imported_packages(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(path)}


def imported_pipelines(path: Path) -> set[str]:
    """The pipeline sub-packages (ads, math, experiments) a file imports."""
    parts = [name.split(".") for name in imported_modules(path)]
    return {p[1] for p in parts if len(p) > 2 and p[0] == "pipelines" and p[1] in PIPELINES}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_only_downward(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    wrong = {
        str(f.relative_to(ROOT)): sorted(imported_packages(f) & FORBIDDEN[package])
        for f in files
        if imported_packages(f) & FORBIDDEN[package]
    }
    assert not wrong, wrong


MLFLOW_IMPORTERS = {
    "pipelines/tracking.py",
    "pipelines/ads/serving/student_model.py",
    "pipelines/ads/serving/student_pyfunc.py",
}


def test_only_the_tracking_modules_import_mlflow():
    importers = [
        str(f.relative_to(ROOT))
        for package in ("agpo", "student", "evaluation", "durable", "compute", "pipelines")
        for f in (ROOT / package).rglob("*.py")
        if "mlflow" in imported_packages(f)
    ]
    assert set(importers) <= MLFLOW_IMPORTERS, importers


def test_agpo_holds_the_rl_library_and_no_experiment():
    """The toy policy and its training loop are an experiment: pipelines/experiments/toy_policy.py (and its
    config), run by the ``agpo toy`` stage. That no agpo module imports pipelines is the package rule above,
    checked file by file."""
    assert not sorted((ROOT / "agpo").rglob("toy*.py"))
    assert (ROOT / "pipelines" / "experiments" / "toy_policy.py").is_file()


def test_only_the_model_cache_imports_itself_inside_agpo():
    """agpo/pretrained/ (base models packaged as GGUF in wheels) serves the stages that resolve ``base_model``;
    the trainer, losses, engines and the rest of agpo never depend on it."""
    cache = ROOT / "agpo" / "pretrained"
    wrong = [
        str(f.relative_to(ROOT))
        for f in sorted((ROOT / "agpo").rglob("*.py"))
        if cache not in f.parents and any(m.startswith("agpo.pretrained") for m in imported_modules(f))
    ]
    assert not wrong, wrong


def test_the_pipelines_framework_imports_no_pipeline():
    framework = sorted([*(ROOT / "pipelines").glob("*.py"), *(ROOT / "pipelines" / "rl").glob("*.py")])
    assert len(framework) > 5
    wrong = {str(f.relative_to(ROOT)): sorted(imported_pipelines(f)) for f in framework if imported_pipelines(f)}
    assert not wrong, wrong


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_pipelines_import_only_the_framework_and_themselves(pipeline):
    files = sorted((ROOT / "pipelines" / pipeline).rglob("*.py"))
    assert files, pipeline
    wrong = {
        str(f.relative_to(ROOT)): sorted(imported_pipelines(f) & PIPELINES[pipeline])
        for f in files
        if imported_pipelines(f) & PIPELINES[pipeline]
    }
    assert not wrong, wrong


def test_every_cli_stage_is_a_module_named_after_its_command_with_its_config_beside_it():
    """A command's module is named after the whole command (``agpo math-train``: math/math_train), or sits in the
    room named after it (``agpo teacher``: teacher/warm_start)."""
    from pipelines.cli import STAGES

    for command, stage in STAGES.items():
        *_, room, module = stage.module.split(".")
        assert command.replace("-", "_") in (module, room), (command, stage.module)
        if command.startswith("math-"):
            assert stage.module.split(".")[1] == "math", (command, stage.module)
        assert (ROOT / Path(*stage.module.split("."))).with_suffix(".py").is_file(), stage.module
        assert stage.config_module in (stage.module, f"{stage.module}_config"), (command, stage.config_module)


def test_no_two_library_modules_share_a_file_name():
    """A reader, or a tool that reads imports by their last name, never mixes two modules up (``student/distil.py``
    and the stage's ``distil.py`` were two); and no room of pipelines/ads/ is named like a library."""
    where: dict[str, list[str]] = {}
    for package in LIBRARIES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "__init__.py":
                where.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, shared
    assert not {p.name for p in (ROOT / "pipelines" / "ads").iterdir() if p.is_dir()} & set(LIBRARIES)


LIBRARIES = ("agpo", "student", "evaluation", "durable", "compute", "pipelines", "dags", "deploy")


def test_no_module_imports_another_modules_private_names():
    """A leading underscore means "this module's own": another module that needs it gets a public name."""
    wrong = []
    for package in ("agpo", "student", "evaluation", "durable", "compute", "pipelines", "dags", "deploy", "benchmarks"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                    wrong += [f"{path.relative_to(ROOT)}: {node.module}.{name}" for name in private]
    assert not wrong, wrong


MAX_MODULE_DOCSTRING_LINES = 40


def test_every_module_docstring_reads_at_a_glance():
    """A module docstring says what the module does and why, in at most MAX_MODULE_DOCSTRING_LINES lines (quotes
    included); measurements and their history live in docs/, with the command that made them."""
    long = []
    for package in ("agpo", "student", "evaluation", "durable", "compute", "pipelines", "dags", "deploy", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
            if docstring.count("\n") + 1 > MAX_MODULE_DOCSTRING_LINES:
                long.append(f"{path.relative_to(ROOT)}: {docstring.count(chr(10)) + 1} lines")
    assert not long, long


MAX_LIBRARY_MODULE_LINES = 450


def test_no_library_module_is_longer_than_the_house_allows():
    """A library module holds one job in at most MAX_LIBRARY_MODULE_LINES lines (docs/design.md): a longer one is two
    jobs, split by what each does (benchmarks and tests are scripts, not library)."""
    long = {
        str(path.relative_to(ROOT)): lines
        for package in LIBRARIES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LIBRARY_MODULE_LINES
    }
    assert not long, long


def module_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (at module level, in functions or under TYPE_CHECKING)."""
    files = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        imported = imported_modules(path)
        candidates = imported | {n.rsplit(".", 1)[0] for n in imported}  # `from m import f`: m
        graph[name] = {m for m in candidates if m in files and m != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_baseline_plugins_the_registry_imports_by_name_stay_in_the_evaluation_room():
    """evaluation.baseline_registry imports its PLUGINS with importlib (after its own classes), which the AST
    checks above do not see: each must be an evaluation module, so the room's direction holds for them too."""
    from evaluation.baseline_registry import PLUGINS, REGISTRY_CODE

    assert PLUGINS and all(plugin.split(".")[0] == "evaluation" for plugin in PLUGINS), PLUGINS
    for plugin in PLUGINS:
        path = (ROOT / Path(*plugin.split("."))).with_suffix(".py")
        assert not imported_packages(path) & FORBIDDEN["evaluation"], plugin
        assert path.name in REGISTRY_CODE["evaluation"]  # a served baseline carries every plugin the registry imports


def test_no_import_circle_among_the_projects_modules():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check sees one
    assert import_cycles(module_graph(LIBRARIES)) == []


# module-level rules inside the RL library: module prefix -> the agpo modules it may import
AGPO_MODULE_RULES = {
    # the rollout engines: generation only, no trainer, reward or relevance code (the answer grammar is a
    # DecodingConstraint the ads pipeline passes in)
    "agpo.rollout": ("agpo.rollout", "agpo.models", "agpo.engine_options"),
    "agpo.rewards": ("agpo.rewards",),
}


@pytest.mark.parametrize("prefix", sorted(AGPO_MODULE_RULES))
def test_agpo_modules_import_only_what_their_rule_allows(prefix):
    graph = module_graph(("agpo",))
    allowed = AGPO_MODULE_RULES[prefix]
    modules = [m for m in graph if m == prefix or m.startswith(prefix + ".")]
    assert modules, prefix
    wrong = {m: sorted(d for d in graph[m] if not d.startswith(allowed)) for m in modules}
    assert not {m: d for m, d in wrong.items() if d}, wrong


def test_the_rl_library_holds_no_relevance_module():
    """The answer format, its grammar and the relevance reward are the ads pipeline's (pipelines/ads)."""
    names = {p.stem for p in (ROOT / "agpo").rglob("*.py")}
    assert not names & {"relevance", "grammar", "grade_scoring"}, names


ROOMS = ("intake", "teacher", "annotation", "distillation", "serving", "studies")  # pipelines/ads/, docs/design.md


def modules_in(folder: Path, recursive: bool = False) -> list[str]:
    """The modules of ``folder`` (dotted below it when ``recursive``: a sub-folder is no way round a limit)."""
    found = folder.rglob("*.py") if recursive else folder.glob("*.py")
    return sorted(".".join(p.relative_to(folder).with_suffix("").parts) for p in found if p.name != "__init__.py")


def test_the_ads_pipeline_is_in_rooms_and_no_folder_is_a_long_flat_list():
    """pipelines/ holds the framework (at most 16 modules at its root); pipelines/ads/ holds its rooms and the
    pipeline that runs them, each room at most 12 modules, its sub-folders' counted: a newcomer finds "the teacher"
    as a folder. The student library and the evaluation room hold at most 16 each (student/ held 18 before the
    evaluation room took its metrics, intervals and baselines)."""
    ads = ROOT / "pipelines" / "ads"
    assert sorted(p.name for p in ads.iterdir() if (p / "__init__.py").is_file()) == sorted(ROOMS)
    assert modules_in(ads) == ["pipeline", "pipeline_config"]
    assert len(modules_in(ROOT / "pipelines")) <= 16, modules_in(ROOT / "pipelines")
    sizes = {room: len(modules_in(ads / room, recursive=True)) for room in ROOMS}
    assert not {room: size for room, size in sizes.items() if size > 12}, sizes
    libraries = {name: len(modules_in(ROOT / name, recursive=True)) for name in ("student", "evaluation")}
    assert not {name: size for name, size in libraries.items() if size > 16}, libraries


ROOM_ORDER = ("intake", "teacher", "annotation", "distillation", "serving", "pipeline", "studies")  # docs/design.md


def room_of(module: str) -> str | None:
    """The ads room of a dotted module (``pipeline`` for pipelines.ads.pipeline and its config), else None."""
    parts = module.split(".")
    if parts[:2] != ["pipelines", "ads"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ROOMS else "pipeline"


def test_each_ads_room_imports_only_the_rooms_before_it():
    ads = ROOT / "pipelines" / "ads"
    wrong = {}
    for path in ads.rglob("*.py"):
        room = room_of(".".join(path.relative_to(ROOT).with_suffix("").parts))
        allowed = ROOM_ORDER[: ROOM_ORDER.index(room) + 1]
        later = sorted({r for r in map(room_of, imported_modules(path)) if r is not None and r not in allowed})
        if later:
            wrong[str(path.relative_to(ROOT))] = later
    assert not wrong, wrong
