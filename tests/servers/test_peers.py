"""The jobs on one machine that use one server, seen by each other: the files each leaves, on real files
and a fake clock, and the table the closed loop uses in their place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import orjson
import pytest

from pipeline.servers.peers import (
    FORGOTTEN_S,
    STALE_S,
    FileBoard,
    Peer,
    PeerTable,
    TableBoard,
    peers_dir,
    server_key,
    still_sending,
)
from tests.support.clock import FakeClock


def test_every_spelling_of_one_servers_url_is_one_server_and_another_port_another() -> None:
    same = {
        server_key(url)
        for url in (
            "http://127.0.0.1:8000/v1",
            "http://localhost:8000/v1/",
            "http://LOCALHOST:8000",
            "http://127.0.0.1:8000/",
        )
    }
    assert len(same) == 1
    assert server_key("http://127.0.0.1:8001/v1") not in same
    assert server_key("http://gpu-box-2:8000/v1") not in same
    assert server_key("http://127.0.0.1:8000/other/v1") not in same  # a proxy's second server


def test_two_jobs_on_one_server_see_what_each_other_holds_and_not_a_job_on_another(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    first = FileBoard("http://127.0.0.1:8000/v1", tmp_path, clock)
    clock.now += 0.5
    second = FileBoard("http://localhost:8000", tmp_path, clock)
    elsewhere = FileBoard("http://127.0.0.1:9000/v1", tmp_path, clock)
    assert first.exchange(0, 64) == ()  # the first to come
    elsewhere.exchange(50, 50)
    assert second.exchange(30, 32) == (Peer(0, 64, earlier=True),)
    assert first.exchange(64, 64) == (Peer(30, 32, earlier=False),)
    assert second.exchange(31, 32) == (Peer(64, 64, earlier=True),)
    first.leave()
    assert second.exchange(31, 32) == () and not first.path.exists()
    second.leave()
    assert not second.folder.exists()  # the last to leave leaves no empty directory behind
    assert elsewhere.folder.exists()
    shutil.rmtree(elsewhere.folder)  # a cleaner of the temporary directory
    assert elsewhere.exchange(50, 50) == () and elsewhere.path.exists()


def test_the_jobs_on_one_server_are_told_in_the_order_they_came_whatever_their_names(tmp_path: Path) -> None:
    """The one that came first leads the others' level (beside_others.follow): every job must agree."""
    clock = FakeClock(1_000_000.0)
    boards = []
    for _ in range(4):
        boards.append(FileBoard("http://127.0.0.1:8000/v1", tmp_path, clock))
        clock.now += 1.0
    for index, board in enumerate(boards):
        board.exchange(index, 10 + index)
    for index, board in enumerate(boards):
        said = board.exchange(index, 10 + index)
        others = [i for i in range(4) if i != index]
        assert said == tuple(Peer(i, 10 + i, earlier=i < index) for i in others)
    boards[0].leave()
    assert boards[2].exchange(2, 12)[0] == Peer(1, 11, earlier=True)  # the next one leads now


def test_a_job_that_stopped_saying_or_whose_process_is_gone_counts_for_nothing(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    board = FileBoard("http://127.0.0.1:8000/v1", tmp_path, clock)
    quiet = FileBoard("http://127.0.0.1:8000/v1", tmp_path, clock)
    quiet.exchange(40, 40)
    clock.now += STALE_S + 1  # a run frozen, or killed where its pid cannot be asked
    assert board.exchange(10, 10) == ()
    assert quiet.path.exists()  # it may come back: a frozen run that resumes says again
    clock.now += FORGOTTEN_S
    board.exchange(10, 10)
    assert not quiet.path.exists()  # long gone: removed by whoever sees it

    dead = next(pid for pid in range(4_194_303, 1, -1) if not _runs(pid))
    killed = board.folder / f"{dead}-0000.json"  # a run killed a moment ago
    killed.write_bytes(orjson.dumps({"in_flight": 64, "limit": 64, "at": clock.now}))
    assert board.exchange(10, 10) == () and not killed.exists()


def test_in_a_directory_machines_share_another_machines_job_lives_while_it_says(tmp_path: Path) -> None:
    """Its pid means nothing here (asked, it would be gone): it counts until it stops saying."""
    clock = FakeClock(1_000_000.0)
    board = FileBoard("http://gpu-box:8000/v1", tmp_path, clock)
    assert board.exchange(10, 10) == ()
    dead = next(pid for pid in range(4_194_303, 1, -1) if not _runs(pid))
    remote = board.folder / f"{dead}-0000.json"
    said = {"in_flight": 64, "limit": 64, "at": clock.now, "since": clock.now - 60, "host": "other-box"}
    remote.write_bytes(orjson.dumps(said))
    assert board.exchange(10, 10) == (Peer(64, 64, earlier=True),)
    clock.now += STALE_S + 1
    assert board.exchange(10, 10) == () and remote.exists()


def test_a_file_that_does_not_say_when_its_job_came_is_a_job_in_no_order(tmp_path: Path) -> None:
    """An earlier version's: read by when it last wrote, it would lead one second and follow the next."""
    clock = FakeClock(1_000_000.0)
    board = FileBoard("http://127.0.0.1:8000/v1", tmp_path, clock)
    assert board.exchange(10, 10) == ()
    older = board.folder / f"{os.getpid()}-0000.json"
    older.write_bytes(orjson.dumps({"in_flight": 30, "limit": 32, "at": clock.now}))
    assert board.exchange(10, 10) == (Peer(30, 32, earlier=None),)


def test_each_machines_own_loopback_server_is_its_own_in_a_shared_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    here = server_key("http://localhost:8000/v1")
    monkeypatch.setattr("pipeline.servers.peers.HOST", "other-box")
    assert server_key("http://127.0.0.1:8000/v1") != here
    assert server_key("http://gpu-box:8000/v1") == server_key("http://gpu-box:8000")


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def test_a_garbled_or_half_written_file_is_no_job(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    board = FileBoard("http://127.0.0.1:8000/v1", tmp_path, clock)
    board.exchange(1, 1)
    (board.folder / f"{os.getpid()}-bad.json").write_text("{not json")
    (board.folder / f"{os.getpid()}-odd.json").write_bytes(
        orjson.dumps({"in_flight": "many", "at": clock.now})
    )
    (board.folder / f".{os.getpid()}-next.tmp").write_text("{")  # being written
    assert board.exchange(2, 2) == ()


def test_a_file_in_place_of_the_directory_is_an_os_error(tmp_path: Path) -> None:
    (tmp_path / "in-the-way").write_text("")
    with pytest.raises((FileExistsError, NotADirectoryError)):  # OSErrors: the endpoint goes on without
        FileBoard("http://127.0.0.1:8000/v1", tmp_path / "in-the-way").exchange(1, 1)


def test_the_place_is_the_users_own_unless_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIPELINE_PEERS_DIR", str(tmp_path / "set"))
    assert peers_dir() == tmp_path / "set"
    monkeypatch.delenv("PIPELINE_PEERS_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    assert peers_dir() == tmp_path / "run" / "pipeline" / "peers"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert peers_dir().name == "peers" and str(os.getuid()) in peers_dir().parent.name


def test_the_table_of_jobs_in_one_process_says_and_reads_as_the_files_do() -> None:
    clock, table = FakeClock(1_000_000.0), PeerTable()
    first, second = TableBoard(table, 0, clock), TableBoard(table, 1, clock)
    first.exchange(0, 8)
    assert second.exchange(30, 30) == (Peer(0, 8, earlier=True),)
    assert first.exchange(20, 40) == (Peer(30, 30, earlier=False),)
    clock.now += STALE_S
    assert second.exchange(31, 30) == ()  # the first said nothing for too long
    second.leave()
    assert first.exchange(1, 40) == ()


@pytest.mark.parametrize(
    ("in_flight", "limit", "still"),
    [(64, 64, True), (58, 64, True), (70, 64, True), (57, 64, False), (0, 8, False)],
)
def test_a_job_sends_while_it_keeps_its_limit_full(in_flight: int, limit: int, still: bool) -> None:
    """Above its limit it drains a cut (still sending); well under it its records ran out."""
    assert still_sending(in_flight, limit) is still
    assert Peer(in_flight, limit).sending is still
    assert Peer(in_flight, limit).holds == max(in_flight, limit)  # a cut drains, a raise is sent
    assert Peer(in_flight).sending and Peer(in_flight).holds == in_flight  # one that said no limit
