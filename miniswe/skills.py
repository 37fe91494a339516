"""Skills: folders of instructions, each with a SKILL.md (front matter: name and a one-line description),
listed in a short catalog in the system prompt and read on demand, with `miniswe skill NAME` from the shell or
the `skill` tool.

`agent.skills_dirs` names folders whose sub-folders are skills. A skill that cannot be used (no SKILL.md,
front matter missing or malformed, a name that is not its folder's, no description, a description over one
line, no body, a name taken by an earlier skill) is reported, one line each, and left out. Reads are jailed to
the skill's folder: absolute paths, `..` and symbolic links that lead out are refused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from miniswe.errors import UsageError

NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
DESCRIPTION_LIMIT = 300  # characters: one line of the catalog
READ_LIMIT = 100_000  # bytes of one skill file
SKILL_FILE = "SKILL.md"
ENV_VAR = "MINISWE_SKILLS"  # the skills folders, for `miniswe skill` in the commands miniswe runs


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    path: str  # the skill's folder, resolved


class SkillError(UsageError):
    """A skill read that cannot be done: an unknown name, a file outside the skill's folder, a missing file."""


def load_skills(dirs: Sequence[str]) -> tuple[list[Skill], list[str]]:
    """The usable skills under `dirs` (in order; the first of a name wins), and one line per problem found."""
    skills: list[Skill] = []
    problems: list[str] = []
    for root in dirs:
        if not os.path.isdir(root):
            problems.append(f"agent.skills_dirs: {root} is not a folder")
            continue
        if os.path.isfile(os.path.join(root, SKILL_FILE)):
            problems.append(f"agent.skills_dirs: {root} is a skill itself; give the folder that holds it "
                            f"({os.path.dirname(os.path.abspath(root))})")
            continue
        try:
            names = sorted(os.listdir(root))
        except OSError as error:
            problems.append(f"agent.skills_dirs: cannot list {root}: {error.strerror}")
            continue
        for name in names:
            folder = os.path.join(root, name)
            if not os.path.isdir(folder) or name.startswith("."):
                continue
            skill, problem = _load_one(folder, name)
            if problem:
                problems.append(f"skill {folder}: {problem}; left out")
            elif any(s.name == skill.name for s in skills):
                problems.append(f"skill {folder}: the name {skill.name} is taken by "
                                f"{next(s.path for s in skills if s.name == skill.name)}; left out")
            else:
                skills.append(skill)
    return skills, problems


def _load_one(folder: str, name: str) -> tuple[Skill | None, str | None]:
    path = os.path.join(folder, SKILL_FILE)
    if not os.path.isfile(path):
        return None, f"no {SKILL_FILE}"
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(READ_LIMIT + 1)
    except OSError as error:
        return None, f"cannot read {SKILL_FILE}: {error.strerror}"
    except UnicodeDecodeError:
        return None, f"{SKILL_FILE} is not UTF-8 text"
    front, body, problem = split_front_matter(text)
    if problem:
        return None, problem
    declared = front.get("name")
    description = front.get("description")
    if not isinstance(declared, str) or not declared:
        return None, "its front matter has no name"
    if declared != name:
        return None, f"its name {declared!r} is not its folder's ({name!r})"
    if not NAME.match(name) or len(name) > 64:
        return None, f"the name {name!r} must be lower-case letters and digits joined by single hyphens (at most 64)"
    if not isinstance(description, str) or not description.strip():
        return None, "its front matter has no description"
    if "\n" in description.strip() or len(description.strip()) > DESCRIPTION_LIMIT:
        return None, f"its description must be one line of at most {DESCRIPTION_LIMIT} characters"
    if not body.strip():
        return None, f"{SKILL_FILE} has no instructions after its front matter"
    return Skill(name, description.strip(), os.path.realpath(folder)), None


def split_front_matter(text: str) -> tuple[dict, str, str | None]:
    """(front matter, body, problem) of a SKILL.md: the front matter is YAML between two `---` lines."""
    import yaml

    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return {}, text, f"{SKILL_FILE} does not start with front matter (a line ---, name: and description:, a line ---)"
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
    if end is None:
        return {}, text, f"the front matter of {SKILL_FILE} is never closed (a line ---)"
    try:
        front = yaml.safe_load("".join(lines[1:end]))
    except yaml.YAMLError as error:
        return {}, text, f"its front matter is not valid YAML ({' '.join(str(error).split())[:120]})"
    except RecursionError:
        return {}, text, "its front matter is nested too deeply to read; write it flatter"
    if not isinstance(front, dict):
        return {}, text, "its front matter is not a mapping of name: and description:"
    return front, "".join(lines[end + 1:]), None


def find(skills: Sequence[Skill], name: str) -> Skill:
    for skill in skills:
        if skill.name == name:
            return skill
    import difflib

    close = difflib.get_close_matches(name, [s.name for s in skills], n=1)
    known = f"did you mean {close[0]!r}?" if close else (
        f"the skills are {', '.join(s.name for s in skills)}" if skills else "there are no skills")
    raise SkillError(f"no skill {name!r} ({known})")


def read_skill(skills: Sequence[Skill], name: str, file: str = "") -> str:
    """A skill's instructions (its SKILL.md body, with the list of its other files), or one file of its folder."""
    skill = find(skills, name)
    if not file or file == SKILL_FILE:
        text = _read(skill, os.path.join(skill.path, SKILL_FILE), SKILL_FILE)
        _, body, _ = split_front_matter(text)
        others = _files(skill.path)
        listing = ""
        if others:
            listing = (f"\n\nFiles of this skill (in {skill.path}; read one with the file argument, or run a script "
                       "from bash):\n" + "\n".join(f"- {f}" for f in others))
        return f"# skill {skill.name}: {skill.description}\n\n{body.strip()}{listing}\n"
    if os.path.isabs(file) or file.startswith("~"):
        raise SkillError(f"{file}: give a path relative to the skill's folder")
    full = os.path.realpath(os.path.join(skill.path, file))
    if not full.startswith(skill.path + os.sep):
        raise SkillError(f"{file}: outside the skill's folder {skill.path}; skills read only their own files")
    return _read(skill, full, file)


def _read(skill: Skill, full: str, shown: str) -> str:
    if os.path.isdir(full):
        raise SkillError(f"{shown} is a folder of skill {skill.name}; its files: {', '.join(_files(full)) or 'none'}")
    try:
        if os.path.getsize(full) > READ_LIMIT:
            raise SkillError(f"{shown} of skill {skill.name} is over {READ_LIMIT} bytes; read it from bash instead")
        with open(full, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        raise SkillError(f"skill {skill.name} has no file {shown} (its files: {', '.join(_files(skill.path)) or 'none'})") from None
    except OSError as error:
        raise SkillError(f"{shown} of skill {skill.name}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise SkillError(f"{shown} of skill {skill.name} is not UTF-8 text") from None


def _files(folder: str, limit: int = 50) -> list[str]:
    """The files under a skill's folder but its SKILL.md, relative, sorted; links leading out are left out."""
    root = os.path.realpath(folder)
    found = []
    for where, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            full = os.path.join(where, name)
            relative = os.path.relpath(full, folder)
            if relative == SKILL_FILE or name.startswith("."):
                continue
            if os.path.realpath(full).startswith(os.path.realpath(root) + os.sep):
                found.append(relative)
    return found[:limit]


def catalog(skills: Sequence[Skill]) -> list[dict[str, str]]:
    """What the system prompt lists: each skill's name and description."""
    return [{"name": skill.name, "description": skill.description} for skill in skills]
