"""`torchls check` at scale: the result cache and the worker pool change how fast, never what.

- The findings are identical with and without the cache, serial and parallel, on the bundled
  examples and on every rule fixture (the real command, as a user runs it).
- An entry stops counting when the file, a project module its analysis read, the
  configuration or the project's module layout changes (checked in-process, counting the
  analyses that really ran).
- Corrupted, truncated and foreign entries are ignored, and an unwritable cache folder is
  ignored quietly; `--no-cache` neither reads nor writes; the folder carries a `.gitignore`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchls import checker
from torchls.cache import CACHE_DIR_NAME
from torchls.checker import CheckOptions, ConfigResolver, check_paths, discover

from .conftest import Project

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
FIXTURES = REPO / "tests" / "rules" / "fixtures"

TWO_FILES_TRAIN = (EXAMPLES / "two_files" / "train.py").read_text(encoding="utf-8")
TWO_FILES_MODELS = (EXAMPLES / "two_files" / "models.py").read_text(encoding="utf-8")
SOFTMAX_RETURN = "return F.softmax(logits, dim=-1)"


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.json"))


# --- the same findings, whatever the mode --------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The examples and the rule fixtures, copied so caches and fixes never touch the repo."""
    root = tmp_path_factory.mktemp("corpus")
    shutil.copytree(EXAMPLES, root / "examples")
    shutil.copytree(FIXTURES, root / "fixtures", ignore=shutil.ignore_patterns("*.expected"))
    (root / "pyproject.toml").write_text("", encoding="utf-8")
    return Project(root)


def findings(project: Project, *args: str) -> list[dict]:
    result = project.run("check", "--output-format", "json", "--exit-zero", *args, ".")
    assert result.returncode == 0, result.stderr
    return result.json()


def test_findings_are_identical_with_and_without_the_cache_serial_and_parallel(corpus: Project):
    cache = corpus.root / "custom-cache"
    reference = findings(corpus, "--no-cache", "--jobs", "1")
    assert len({row["filename"] for row in reference}) > 50  # the fixtures really were checked
    assert {"TL101", "TL301", "TL602"} <= {row["code"] for row in reference}
    assert findings(corpus, "--no-cache", "--jobs", "2") == reference
    assert findings(corpus, "--cache-dir", str(cache), "--jobs", "2") == reference  # cold
    written = entries(cache)
    assert len(written) > 50
    assert findings(corpus, "--cache-dir", str(cache), "--jobs", "1") == reference  # warm
    assert findings(corpus, "--cache-dir", str(cache), "--jobs", "2") == reference
    assert entries(cache) == written
    # The default place: beside the nearest pyproject.toml, ignored by git.
    assert findings(corpus) == reference
    assert (corpus.root / CACHE_DIR_NAME / ".gitignore").read_text().splitlines()[-1] == "*"


def test_text_output_and_exit_status_are_the_same_from_the_cache(corpus: Project):
    cold = corpus.run("check", "--cache-dir", str(corpus.root / "text-cache"), "examples")
    warm = corpus.run("check", "--cache-dir", str(corpus.root / "text-cache"), "examples")
    uncached = corpus.run("check", "--no-cache", "examples")
    assert cold.returncode == warm.returncode == uncached.returncode == 1
    assert cold.stdout == warm.stdout == uncached.stdout
    assert warm.stderr == uncached.stderr


# --- what invalidates an entry (in-process, counting analyses) -----------------------------


@pytest.fixture
def analyses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The files the checker really analyses (not those it takes from the cache)."""
    seen: list[str] = []
    real = checker.analyze

    def counting(source, filename, *args, **kwargs):
        seen.append(Path(filename).name)
        return real(source, filename, *args, **kwargs)

    monkeypatch.setattr(checker, "analyze", counting)
    yield seen


def two_file_project(project: Project) -> Project:
    project.write("pyproject.toml", "")
    project.write("models.py", TWO_FILES_MODELS)
    project.write("train.py", TWO_FILES_TRAIN)
    project.write("other.py", "import torch\n\n\ndef load(path):\n    return torch.load(path)\n")
    return project


def check(project: Project, **options) -> dict[str, list[str]]:
    """{file name: codes found} for one in-process `check .` of the project."""
    resolver = ConfigResolver(None)
    files = discover([str(project.root)], resolver).files
    base = CheckOptions(root=project.root, jobs=1, cache_dir=project.root / "cache")
    reports = check_paths(files, resolver, _replace(base, **options))
    return {Path(r.filename).name: [f.code for f in r.findings] for r in reports}


def _replace(options: CheckOptions, **changes) -> CheckOptions:
    from torchls.records import replace

    return replace(options, **changes)


def test_an_unchanged_project_is_not_analysed_again(project: Project, analyses: list[str]):
    two_file_project(project)
    first = check(project)
    assert "TL101" in first["train.py"] and "TL302" in first["other.py"]
    assert sorted(analyses) == ["models.py", "other.py", "train.py"]
    analyses.clear()
    assert check(project) == first
    assert analyses == []


def test_editing_a_file_re_analyses_it_and_the_files_that_searched_it(
    project: Project, analyses: list[str]
):
    two_file_project(project)
    check(project)
    analyses.clear()
    project.write(
        "other.py",
        "import torch\n\n\ndef load(path):\n    return torch.load(path, map_location='cpu')\n",
    )
    after = check(project)
    # train.py's `train(batches, ...)` has no caller in its own file, so TL802 searched every
    # project file for one (other.py could gain `train(loader)`): it depends on other.py.
    # models.py asked nothing of other.py and comes from the cache.
    assert sorted(analyses) == ["other.py", "train.py"]
    assert "TL302" not in after["other.py"]


def test_editing_an_imported_module_re_analyses_its_importers(
    project: Project, analyses: list[str]
):
    two_file_project(project)
    assert "TL101" in check(project)["train.py"]
    analyses.clear()
    project.write("models.py", TWO_FILES_MODELS.replace(SOFTMAX_RETURN, "return logits"))
    after = check(project)
    assert sorted(analyses) == ["models.py", "train.py"]  # other.py imports nothing from it
    assert "TL101" not in after["train.py"]


VALIDATION = """\
def validate(generator, loader):
    generator.eval()
    total = 0.0
    for mel, audio in loader:
        total += (generator(mel) - audio).abs().mean().item()
    return total
"""
TRAIN_WITH_VALIDATION = """\
import torch
from validation import validate


def fit(generator, train_loader, val_loader, optimizer, epochs):
    for epoch in range(epochs):
        generator.train()
        for mel, audio in train_loader:
            optimizer.zero_grad()
            (generator(mel) - audio).abs().mean().backward()
            optimizer.step()
        with torch.no_grad():
            validate(generator, val_loader)
"""


def test_a_helper_s_findings_follow_its_callers_in_other_files(
    project: Project, analyses: list[str]
):
    # validate() runs without no_grad itself, but its only caller wraps it in no_grad: no
    # TL202 there. The caller is a file the helper's analysis read: editing it (the no_grad
    # removed) re-analyses the helper, and the finding appears.
    project.write("pyproject.toml", "")
    project.write("validation.py", VALIDATION)
    project.write("train.py", TRAIN_WITH_VALIDATION)
    assert "TL202" not in check(project)["validation.py"]
    analyses.clear()
    unguarded = TRAIN_WITH_VALIDATION.replace(
        "        with torch.no_grad():\n            validate", "        validate"
    )
    project.write("train.py", unguarded)
    after = check(project)
    assert sorted(analyses) == ["train.py", "validation.py"]
    assert "TL202" in after["validation.py"]


def test_changing_the_configuration_re_analyses(project: Project, analyses: list[str]):
    two_file_project(project)
    check(project)
    analyses.clear()
    project.write("pyproject.toml", '[tool.torchls]\nignore = ["TL302"]\n')
    after = check(project)
    assert "other.py" in analyses
    assert "TL302" not in after["other.py"]
    analyses.clear()
    assert "TL101" not in check(project, ignore=("TL101",))["train.py"]  # the command line too
    assert "train.py" in analyses


def test_a_new_module_re_analyses(project: Project, analyses: list[str]):
    """A module that appears can change where an import resolves."""
    two_file_project(project)
    check(project)
    analyses.clear()
    project.write("helpers.py", "def helper():\n    return 1\n")
    check(project)
    assert "train.py" in analyses


def test_no_cache_neither_reads_nor_writes(project: Project, analyses: list[str]):
    two_file_project(project)
    check(project, cache=False)
    assert not (project.root / "cache").exists()
    check(project)
    analyses.clear()
    check(project, cache=False)
    assert sorted(analyses) == ["models.py", "other.py", "train.py"]


# --- entries that must not be trusted --------------------------------------------------------


def damaged(text: str, how: str, foreign: str) -> str:
    if how == "truncated":
        return text[: len(text) // 2]
    if how == "garbage":
        return "\x00not json at all"
    if how == "wrong shape":
        return json.dumps({"schema": 1, "check": "x", "body": 3})
    if how == "tampered":  # parses, but the checksum no longer matches the body
        entry = json.loads(text)
        entry["body"] = entry["body"].replace("{", "{ ", 1)
        return json.dumps(entry)
    if how == "bad body":  # a consistent checksum over a body of the wrong shape
        from torchls.cache import digest

        body = json.dumps({"key": 1, "dependencies": [], "report": {"findings": "no"}})
        return json.dumps({"schema": 1, "check": digest(body.encode()), "body": body})
    return foreign  # another file's entry under this file's name


@pytest.mark.parametrize(
    "how", ["truncated", "garbage", "wrong shape", "tampered", "bad body", "foreign"]
)
def test_damaged_entries_are_ignored(project: Project, analyses: list[str], how: str):
    two_file_project(project)
    reference = check(project, cache=False)
    check(project)
    written = entries(project.root / "cache")
    texts = [path.read_text(encoding="utf-8") for path in written]
    for index, path in enumerate(written):
        path.write_text(damaged(texts[index], how, texts[index - 1]), encoding="utf-8")
    analyses.clear()
    assert check(project) == reference
    assert sorted(analyses) == ["models.py", "other.py", "train.py"]
    analyses.clear()
    assert check(project) == reference  # the entries were rewritten whole
    assert analyses == []


def test_a_damaged_cache_never_changes_the_command_output(project: Project):
    two_file_project(project)
    uncached = project.run("check", "--no-cache", ".")
    project.run("check", ".")
    for path in entries(project.root / CACHE_DIR_NAME):
        path.write_bytes(path.read_bytes()[:-7])
    damaged_run = project.run("check", ".")
    assert (damaged_run.returncode, damaged_run.stdout, damaged_run.stderr) == (
        uncached.returncode,
        uncached.stdout,
        uncached.stderr,
    )


def test_an_unwritable_cache_folder_is_ignored_quietly(project: Project):
    two_file_project(project)
    project.write("not-a-folder", "a file where the cache folder would go")
    uncached = project.run("check", "--no-cache", ".")
    result = project.run("check", "--cache-dir", "not-a-folder/cache", ".")
    assert (result.returncode, result.stdout, result.stderr) == (
        uncached.returncode,
        uncached.stdout,
        uncached.stderr,
    )


# --- fixes and the cache ---------------------------------------------------------------------

BUGGY = (
    "import torch.nn.functional as F\n\n\ndef loss_of(logits, y):\n"
    "    probs = F.softmax(logits, dim=1)\n    return F.cross_entropy(probs, y)\n"
)


def test_fix_applies_fixes_to_files_whose_findings_came_from_the_cache(project: Project):
    path = project.write("train.py", BUGGY)
    project.write("pyproject.toml", "")
    assert project.codes("--select", "TL101", "train.py") == ["TL101"]  # now cached
    fixed = project.run("check", "--select", "TL101", "--fix", "train.py")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "F.cross_entropy(logits, y)" in path.read_text(encoding="utf-8")
    # The fixed text's analysis was cached as it was written: clean, now and from the cache.
    assert project.codes("--select", "TL101", "train.py") == []
    path.write_text(BUGGY, encoding="utf-8")  # back to the buggy text: its entry is gone
    assert project.codes("--select", "TL101", "train.py") == ["TL101"]


# --- one read and one parse per file version --------------------------------------------------


def test_a_project_check_parses_each_file_once_and_finds_what_separate_analyses_find(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # train.py imports models.py and both are checked: the module's own check and the import
    # followed into it stand on one parse (and one syntax index), which changes nothing found.
    from torchls.analysis import Workspace, analyze
    from torchls.analysis import source as source_module

    shutil.copytree(EXAMPLES / "two_files", tmp_path / "project")
    root = tmp_path / "project"
    (root / "pyproject.toml").write_text("", encoding="utf-8")
    files = [root / "models.py", root / "train.py"]
    separate = {}
    for path in files:
        result = analyze(path.read_bytes(), str(path), workspace=Workspace(root))
        separate[path.name] = [(f.code, f.span.start.row) for f in result.findings]
    assert separate["train.py"], "the example has findings that follow the import"

    parsed: list[str] = []
    real_parse = source_module.parse_source

    def counting(text: str):
        parsed.append(text)
        return real_parse(text)

    monkeypatch.setattr(source_module, "parse_source", counting)
    options = CheckOptions(root=root, jobs=1, cache=False)
    reports = check_paths(files, ConfigResolver(root / "pyproject.toml"), options)
    together = {
        Path(report.filename).name: [(f.code, f.span.start.row) for f in report.findings]
        for report in reports
    }
    assert together == separate
    assert sorted(parsed) == sorted(path.read_text(encoding="utf-8") for path in files)


def test_the_read_recorder_reads_a_file_again_only_when_it_changed(tmp_path: Path) -> None:
    from torchls.cache import MISSING
    from torchls.project import ReadRecorder

    recorder = ReadRecorder()
    module = tmp_path / "helpers.py"
    module.write_text("scale = 1\n", encoding="utf-8")
    first = recorder(module)
    assert first == "scale = 1\n"
    assert recorder(module) is first  # not read, hashed and decoded again
    before = recorder.digests[str(module)]
    module.write_text("scale = 22\n", encoding="utf-8")
    assert recorder(module) == "scale = 22\n"
    assert recorder.digests[str(module)] != before
    module.unlink()
    assert recorder(module) is None
    assert recorder.digests[str(module)] == MISSING
