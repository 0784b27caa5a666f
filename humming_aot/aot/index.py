"""A PEP 503 simple index of wheels in a plain directory, for air-gapped clusters.

    DIR/index.html                         every project
    DIR/<project>/index.html               its files, each link with #sha256=
    DIR/<project>/<wheel>.whl

``pip install --index-url file://DIR 'humming_aot[sm89]'`` then resolves the core and the sm89
catalog from DIR alone (pip reads ``index.html`` of a file:// directory). Adding wheels keeps
those already there, so several builds (one per arch, or per CUDA major) share one index; the
pages are rewritten from the directory's content every time, in sorted order, so the same wheels
give the same bytes.
"""
from __future__ import annotations

import hashlib
import html
import shutil
from pathlib import Path

from humming_aot.distribution import normalize


def project_of(wheel: Path) -> str:
    """'humming_aot_kernels_sm89_cu13-0.1.0-py3-none-any.whl' -> 'humming-aot-kernels-sm89-cu13'."""
    return normalize(Path(wheel).name.split("-")[0])


def _page(title: str, links: list[tuple[str, str]]) -> bytes:
    body = "".join(f'    <a href="{html.escape(href)}">{html.escape(text)}</a><br/>\n' for href, text in links)
    return (f"<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" content=\"1.0\">"
            f"<title>{html.escape(title)}</title></head>\n  <body>\n{body}  </body>\n</html>\n").encode()


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def add_to_index(index_dir: Path, wheels: list[Path]) -> list[Path]:
    """Copy ``wheels`` into the index at ``index_dir`` (replacing same-named files) and rewrite its
    pages; returns the index's wheels."""
    index_dir = Path(index_dir)
    index_dir.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        project_dir = index_dir / project_of(wheel)
        project_dir.mkdir(exist_ok=True)
        target = project_dir / Path(wheel).name
        if Path(wheel).resolve() != target.resolve():
            shutil.copyfile(wheel, target.with_name(target.name + ".tmp"))
            target.with_name(target.name + ".tmp").replace(target)
    projects = sorted(p for p in index_dir.iterdir() if p.is_dir() and any(p.glob("*.whl")))
    for project_dir in projects:
        links = []
        for wheel in sorted(project_dir.glob("*.whl")):
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            links.append((f"{wheel.name}#sha256={digest}", wheel.name))
        _write(project_dir / "index.html", _page(f"Links for {project_dir.name}", links))
    _write(index_dir / "index.html", _page("Simple index", [(f"{p.name}/", p.name) for p in projects]))
    return [w for p in projects for w in sorted(p.glob("*.whl"))]
