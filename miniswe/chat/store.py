"""Where chat sessions live: the miniswe home (`~/.miniswe`, or $MINISWE_HOME) holds the line history and
`sessions/`, one trajectory file per session (`<id>.traj.json`) and the live one (`autosave.traj.json`)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from miniswe.errors import UsageError

AUTOSAVE = "autosave"
SUFFIX = ".traj.json"


def home() -> str:
    return os.environ.get("MINISWE_HOME") or os.path.join(os.path.expanduser("~"), ".miniswe")


def history_path() -> str:
    return os.path.join(home(), "history")


def sessions_dir() -> str:
    return os.path.join(home(), "sessions")


def session_path(session_id: str) -> str:
    return os.path.join(sessions_dir(), session_id + SUFFIX)


def autosave_path() -> str:
    return session_path(AUTOSAVE)


def new_id() -> str:
    """A new session id: the time, made unique in the sessions folder."""
    base = time.strftime("%Y%m%d-%H%M%S")
    candidate, n = base, 1
    while os.path.exists(session_path(candidate)):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def summary(task: str, status: str | None) -> str:
    """A session's summary line, made without the model: its first task and how its last turn ended."""
    first = " ".join((task or "").split())
    first = first[:70] + ("..." if len(first) > 70 else "")
    return f"{first or '(no task)'} · {status or 'unfinished'}"


@dataclass(frozen=True)
class Listed:
    id: str
    path: str
    mtime: float
    messages: int
    summary: str
    damaged: str | None = None  # why the file cannot be loaded (cut short, or not a session at all)


DAMAGED = "[damaged]"


def list_sessions() -> list[Listed]:
    """Every session file, newest first; one that cannot be loaded too, marked damaged (its summary says why),
    rather than hidden: /load says the same of it, and the file is still there to look at."""
    from miniswe.errors import TrajectoryError
    from miniswe.trajectory import read_document, upgrade

    try:
        names = [n for n in os.listdir(sessions_dir()) if n.endswith(SUFFIX) and not n.startswith(".")]
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        path = os.path.join(sessions_dir(), name)
        try:
            mtime = os.path.getmtime(path)
            data = upgrade(read_document(path), path)  # as /load reads it: the same checks
        except OSError:
            continue  # gone since the folder was listed
        except TrajectoryError as error:
            why = str(error).removeprefix(f"{path}: ").removeprefix(f"{path} ")
            found.append(Listed(name[: -len(SUFFIX)], path, mtime, 0, f"{DAMAGED} {why}", damaged=why))
            continue
        session = data.get("session") or {}
        found.append(Listed(name[: -len(SUFFIX)], path, mtime, len(data.get("messages") or []),
                            session.get("summary") or summary(data.get("task") or "", data.get("exit_status"))))
    return sorted(found, key=lambda s: s.mtime, reverse=True)


def resolve(given: str) -> Listed:
    """The session an id names: exactly, or as the unique prefix of one."""
    sessions = list_sessions()
    exact = [s for s in sessions if s.id == given]
    if exact:
        return exact[0]
    matches = [s for s in sessions if s.id.startswith(given)]
    if not matches:
        raise UsageError(f"no session {given!r}; /list shows them")
    if len(matches) > 1:
        raise UsageError(f"{given!r} names {len(matches)} sessions ({', '.join(s.id for s in matches[:5])}): give more of the id")
    return matches[0]


def file_away(path: str) -> str | None:
    """Keep the session in `path` (the last autosave) under its own id, so a new session can take the autosave;
    its id, or None when there was nothing to keep."""
    data = _read(path)
    if data is None or not (data.get("messages") or data.get("steps")):
        return None
    session = data.get("session") if isinstance(data.get("session"), dict) else {}
    session_id = session.get("id") or new_id()
    data["session"] = {**session, "id": session_id,
                       "summary": session.get("summary") or summary(data.get("task") or "", data.get("exit_status"))}
    from miniswe.atomic import write_atomic

    write_atomic(session_path(session_id), json.dumps(data, ensure_ascii=False) + "\n")
    return session_id


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
