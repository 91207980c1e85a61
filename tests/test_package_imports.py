"""What importing fastdata costs: the package, the CLI and a local conversion never import torch."""

from __future__ import annotations

from pathlib import Path


def test_the_package_and_a_local_conversion_do_not_import_torch(tmp_path: Path) -> None:
    # torch takes ~2 s to import: `import fastdata`, `fastdata --help` and converting a local corpus
    # must not pay it (the datasets import it when first used)
    import subprocess
    import sys

    from tests.datagen import make_image_folder

    make_image_folder(tmp_path / "corpus", classes=2, per_class=3, seed=0)
    script = (
        "import sys, fastdata, fastdata.cli\n"
        "from fastdata.convert import convert\n"
        f"convert({str(tmp_path / 'corpus')!r}, {str(tmp_path / 'out')!r}, progress=False)\n"
        "print(sorted(m for m in ('torch', 'boto3', 'h5py') if m in sys.modules))\n"
        "fastdata.TarShardDataset\n"
        "print('torch' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[:2] == ["[]", "True"]  # and a dataset name does import it
    assert (tmp_path / "out" / "manifest.json").exists()


def test_the_convert_command_does_not_import_the_inspectors(tmp_path: Path) -> None:
    # every command's parser is built at start-up: `fastdata convert` must not pay for `inspect`'s
    # readers (numpy's video stack, ~150 ms: a tenth of converting 20,000 small files)
    import subprocess
    import sys

    from tests.datagen import make_image_folder

    make_image_folder(tmp_path / "corpus", classes=2, per_class=3, seed=0)
    script = (
        "import sys\n"
        "from fastdata.cli import main\n"
        f"code = main(['convert', {str(tmp_path / 'corpus')!r}, {str(tmp_path / 'out')!r}, '--no-fsync'])\n"
        "heavy = ('fastdata.inspection.', 'fastdata.formats.video')\n"
        "print(code, sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[0] == "0 ['fastdata.inspection._command']"
    assert (tmp_path / "out" / "manifest.json").exists()
