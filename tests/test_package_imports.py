"""What importing fastdata costs: the package, the CLI and a local conversion never import torch, and a
conversion from the CLI never imports the other commands' heavy modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.datagen import make_image_folder


def converted_in_a_fresh_interpreter(tmp_path: Path, convert_line: str, report: str) -> list[str]:
    """The lines ``report`` printed after ``convert_line`` (which may use ``CORPUS`` and ``OUT``) converted
    a small image folder in a new interpreter; the conversion's manifest is checked to exist."""
    make_image_folder(tmp_path / "corpus", classes=2, per_class=3, seed=0)
    script = (
        f"import sys\nCORPUS, OUT = {str(tmp_path / 'corpus')!r}, {str(tmp_path / 'out')!r}\n{convert_line}\n{report}\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "out" / "manifest.json").exists()
    return run.stdout.split("\n")


def test_the_package_and_a_local_conversion_do_not_import_torch(tmp_path: Path) -> None:
    # torch takes ~2 s to import: `import fastdata`, `fastdata --help` and converting a local corpus
    # must not pay it (the datasets import it when first used)
    lines = converted_in_a_fresh_interpreter(
        tmp_path,
        "import fastdata, fastdata.cli\nfrom fastdata.convert import convert\nconvert(CORPUS, OUT, progress=False)",
        "print(sorted(m for m in ('torch', 'boto3', 'h5py') if m in sys.modules))\n"
        "fastdata.TarShardDataset\n"
        "print('torch' in sys.modules)",
    )
    assert lines[:2] == ["[]", "True"]  # and a dataset name does import it


def test_the_convert_command_does_not_import_the_inspectors(tmp_path: Path) -> None:
    # every command's parser is built at start-up: `fastdata convert` must not pay for `inspect`'s
    # readers (numpy's video stack, ~150 ms: a tenth of converting 20,000 small files)
    lines = converted_in_a_fresh_interpreter(
        tmp_path,
        "from fastdata.cli import main\ncode = main(['convert', CORPUS, OUT, '--no-fsync'])",
        "heavy = ('fastdata.inspection.', 'fastdata.formats.video')\n"
        "print(code, sorted(m for m in sys.modules if m.startswith(heavy)))",
    )
    assert lines[0] == "0 ['fastdata.inspection._command']"
