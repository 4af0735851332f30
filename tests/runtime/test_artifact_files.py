"""Artifact folders: atomic writes, one folder per run, no name escapes the root."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import keel
from keel.core.artifacts import RunArtifacts
from keel.core.errors import InvalidId, NotInRun

ESCAPES = ["../x", "/etc/passwd", "..", ".", ".hidden", "a/../../b", "../../../../tmp/evil", "~"]


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def test_write_is_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    store = RunArtifacts(tmp_path / "root", "run-1")
    data = os.urandom(3 * 1024 * 1024)
    target = store.write_bytes("blob.bin", data)
    assert target == (tmp_path / "root" / "run-1" / "blob.bin").resolve()
    assert target.read_bytes() == data
    assert [p.name for p in store.folder.iterdir()] == ["blob.bin"]
    store.write_json("report.json", {"b": 1, "a": [1, 2]})
    assert store.read_bytes("report.json") == b'{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    assert [a.name for a in store.list()] == ["blob.bin", "report.json"]


def test_failed_write_keeps_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    store = RunArtifacts(tmp_path, "run-1")
    store.write_text("newsletter.md", "old, complete")
    with pytest.raises(TypeError):
        store.write_bytes("newsletter.md", "not bytes")  # type: ignore[arg-type]
    assert store.read_bytes("newsletter.md") == b"old, complete"
    assert sorted(p.name for p in store.folder.iterdir()) == ["newsletter.md"]


def test_reader_never_sees_a_half_written_file(tmp_path: Path) -> None:
    store = RunArtifacts(tmp_path, "run-1")
    size = 256 * 1024
    whole = {b"a" * size, b"b" * size}
    store.write_bytes("doc.txt", b"a" * size)
    seen: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.append(store.read_bytes("doc.txt"))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(40):
            store.write_bytes("doc.txt", b"ab"[i % 2 : i % 2 + 1] * size)
    finally:
        done.set()
        reader.join()
    assert seen
    assert {s for s in seen if s not in whole} == set()


@pytest.mark.parametrize("run_id", ESCAPES)
def test_run_id_cannot_put_a_folder_outside_the_root(tmp_path: Path, run_id: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    try:
        store = RunArtifacts(root, run_id)
    except InvalidId:
        assert files_under(tmp_path) == set()
        return
    store.write_text("x.txt", "data")
    assert store.folder.parent == root.resolve()
    assert files_under(tmp_path) == {store.folder / "x.txt"}


@pytest.mark.parametrize("name", [*ESCAPES, "sub/dir.txt", ""])
def test_artifact_name_cannot_write_outside_its_run_folder(tmp_path: Path, name: str) -> None:
    store = RunArtifacts(tmp_path / "root", "run-1")
    try:
        target = store.write_text(name, "data")
    except InvalidId:
        assert files_under(tmp_path) == set()
        return
    assert target.parent == store.folder
    assert files_under(tmp_path) == {target}


@pytest.mark.parametrize(
    "name", ["report:v1.txt", "report?v1.txt", "report v1.txt", "ré.txt", "a" * 201 + ".txt"]
)
def test_a_name_that_would_need_rewriting_is_refused_not_rewritten(
    tmp_path: Path, name: str
) -> None:
    store = RunArtifacts(tmp_path / "root", "run-1")
    store.write_text("report_v1.txt", "the original")
    with pytest.raises(InvalidId, match="artifact name"):
        store.write_text(name, "another report")
    assert store.read_bytes("report_v1.txt") == b"the original"
    assert [a.name for a in store.list()] == ["report_v1.txt"]


def test_a_name_of_200_characters_is_kept_whole(tmp_path: Path) -> None:
    name = "a" * 196 + ".txt"
    store = RunArtifacts(tmp_path / "root", "run-1")
    assert store.write_text(name, "x").name == name


def test_symlink_in_a_run_folder_cannot_redirect_a_write_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    store = RunArtifacts(tmp_path / "root", "run-1")
    store.folder.mkdir(parents=True)
    (store.folder / "report.md").symlink_to(outside)
    with pytest.raises(InvalidId, match="outside"):
        store.write_text("report.md", "overwritten")
    assert outside.read_text() == "precious"


def test_each_run_gets_its_own_folder(tmp_path: Path) -> None:
    a, b = RunArtifacts(tmp_path, "job-a1"), RunArtifacts(tmp_path, "job-b2")
    a.write_text("out.md", "from a")
    b.write_text("out.md", "from b")
    assert a.folder != b.folder
    assert (a.read_bytes("out.md"), b.read_bytes("out.md")) == (b"from a", b"from b")


def test_artifacts_outside_a_run_raise_not_in_run() -> None:
    with pytest.raises(NotInRun, match=r"keel\.artifacts\(\)"):
        keel.artifacts()
