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
