"""`--fix` and `--unsafe-fixes`: files are rewritten, stay valid Python, and only the fixes
the flags allow go in. The remaining findings and the "Fixed N errors." line are reported.
"""

from __future__ import annotations

import ast

# The findings of `data/buggy.py` these tests assert on: selected, so that a new rule firing on
# the sample (and its fix) does not change what a test about the fix plumbing sees.
BUGGY = ("--select", "TL101,TL106,TL302,TL303")


def test_fix_applies_safe_fixes_and_keeps_unsafe_ones_reported(project):
    path = project.copy("buggy.py")
    result = project.run("check", *BUGGY, "--fix", "buggy.py")
    assert result.returncode == 1  # TL302 (unsafe fix) and TL303 (no fix) remain
    assert "Fixed 2 findings." in result.lines
    assert "Found 2 findings (1 warning, 1 advice)." in result.lines
    assert result.lines[-1] == (
        "No fixes available (1 hidden fix can be enabled with the --unsafe-fixes option)."
    )
    text = path.read_text(encoding="utf-8")
    ast.parse(text)
    assert "F.cross_entropy(logits, y)" in text
    assert "y.long()" in text
    assert "torch.load(path)  #" in text  # the unsafe fix was not applied
    assert project.codes(*BUGGY, "buggy.py") == ["TL302", "TL303"]


def test_remaining_findings_are_reported_at_their_new_positions(project):
    project.copy("buggy.py")
    rows = project.run("check", *BUGGY, "--fix", "--output-format", "json", "buggy.py").json()
    line, column = project.locate("buggy.py", "torch.load(path)")
    first = rows[0]
    assert (first["code"], first["location"]["row"], first["location"]["column"]) == (
        "TL302",
        line,
        column,
    )


def test_fix_with_unsafe_fixes_applies_unsafe_ones_too(project):
    path = project.copy("buggy.py")
    result = project.run("check", *BUGGY, "--fix", "--unsafe-fixes", "buggy.py")
    assert result.returncode == 1  # TL303 has no fix
    assert "Fixed 3 findings." in result.lines
    text = path.read_text(encoding="utf-8")
    ast.parse(text)
    assert 'torch.load(path, map_location="cpu")' in text
    assert project.codes(*BUGGY, "buggy.py") == ["TL303"]


def test_fixing_everything_exits_0(project):
    path = project.write(
        "train.py",
        "import torch.nn.functional as F\n\n\ndef loss_of(logits, y):\n"
        "    probs = F.softmax(logits, dim=1)\n    return F.cross_entropy(probs, y)\n",
    )
    result = project.run("check", "--select", "TL101", "--fix", "train.py")
    assert result.returncode == 0
    assert result.lines == ["Fixed 1 finding.", "All checks passed!"]
    assert "F.cross_entropy(logits, y)" in path.read_text(encoding="utf-8")


def test_fix_leaves_clean_files_untouched(project):
    path = project.copy("clean.py")
    before = path.stat().st_mtime_ns, path.read_bytes()
    result = project.run("check", "--fix", "clean.py")
    assert result.returncode == 0
    assert result.lines == ["All checks passed!"]
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before


def test_without_fix_nothing_is_written(project):
    path = project.copy("buggy.py")
    before = path.read_bytes()
    project.run("check", "--unsafe-fixes", "buggy.py")
    assert path.read_bytes() == before


def test_fix_keeps_line_endings_and_encoding(project):
    crlf = project.write(
        "crlf.py",
        b"from torch import nn\r\n\r\ncriterion = nn.CrossEntropyLoss()\r\n"
        b"for x, y in loader:\r\n    loss = criterion(model(x), y.float())\r\n",
    )
    latin = project.write(
        "latin.py",
        "# -*- coding: latin-1 -*-\n# caf\xe9\nimport torch\nstate = torch.load(p)\n".encode(
            "latin-1"
        ),
    )
    bom = project.write("bom.py", b"\xef\xbb\xbfimport torch\nstate = torch.load(p)\n")
    result = project.run("check", "--select", "TL106,TL302", "--fix", "--unsafe-fixes", ".")
    assert result.returncode == 0, result.stdout + result.stderr
    assert crlf.read_bytes().endswith(b"criterion(model(x), y.long())\r\n")
    assert b"\r\n\r\n" in crlf.read_bytes()
    assert latin.read_bytes().startswith("# -*- coding: latin-1 -*-\n# caf\xe9\n".encode("latin-1"))
    assert bom.read_bytes().startswith(b"\xef\xbb\xbf")
    assert b'map_location="cpu"' in bom.read_bytes()


def test_file_with_a_syntax_error_is_not_rewritten(project):
    text = "import torch\n\ndef half_typed(:\n    pass\n\nstate = torch.load(path)\n"
    path = project.write("broken.py", text)
    result = project.run("check", "--select", "TL302", "--fix", "--unsafe-fixes", "broken.py")
    assert result.returncode == 1
    assert path.read_text(encoding="utf-8") == text
    assert "syntax error" in result.stderr


def test_statistics_text(project):
    project.copy("buggy.py", "a.py")
    project.copy("buggy.py", "b.py")
    result = project.run("check", *BUGGY, "--statistics")
    assert result.returncode == 1
    table = [line.split("\t") for line in result.lines if "\t" in line]
    assert [(row[0].strip(), row[1].strip(), row[2]) for row in table] == [
        ("2", "TL101", "[*] softmax-before-cross-entropy"),
        ("2", "TL106", "[*] class-targets-cast-to-float"),
        ("2", "TL302", "[ ] load-without-map-location"),
        ("2", "TL303", "[ ] load-weights-only-false"),
    ]
    assert "Found 8 findings (4 errors, 2 warnings, 2 advice)." in result.lines
    assert not any(line.startswith("a.py:") for line in result.lines)
