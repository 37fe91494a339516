"""The file tools' worker, run where commands run (on this machine, or inside the container) as
`python3 -I -S -c SOURCE PAYLOAD`, through the environment like any command: the same user, the same
filesystem, the same confinement (policy.confine). Stdlib only, Python 3.6+, imports nothing of miniswe.

PAYLOAD is base64 of a JSON object {tool, args, max_chars}. The result is printed; exit 0 on success, 1 with
"error: ..." otherwise. Every path must resolve (symlinks followed) inside the working directory.
"""

import base64
import json
import os
import sys

EDIT_LIMIT = 1 << 20  # bytes: edit_file reads the whole file


class Refused(Exception):
    pass


def resolve(path):
    """The real path of `path` inside the working directory; Refused when it is not there."""
    if not isinstance(path, str) or not path.strip():
        raise Refused("`path` is empty")
    if "\0" in path:
        raise Refused("the path holds a NUL character")
    if path.startswith("~"):
        raise Refused("%s: write paths relative to the working directory (~ is not expanded)" % path)
    root = os.path.realpath(os.getcwd())
    full = os.path.realpath(os.path.join(root, path))
    if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
        how = " (through a symbolic link)" if os.path.normpath(os.path.join(root, path)) != full else ""
        raise Refused("%s resolves to %s%s, outside the working directory %s; the file tools work only inside it"
                      % (path, full, how, root))
    return full


def opened(full, flags, mode=0o666):
    try:
        return os.open(full, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as error:
        raise Refused("%s: %s" % (shown(full), error.strerror))


def shown(full):
    return os.path.relpath(full, os.path.realpath(os.getcwd()))


def text_of(data, full):
    if b"\0" in data[:8192]:
        raise Refused("%s is a binary file, not text; look at it with bash (xxd, file, ...)" % shown(full))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise Refused("%s is not UTF-8 text (byte %d); look at it with bash" % (shown(full), error.start))


def read_file(args, max_chars):
    full = resolve(args["path"])
    if os.path.isdir(full):
        raise Refused("%s is a directory; list it with bash (ls)" % shown(full))
    start = max(int(args.get("start_line") or 1), 1)
    end = args.get("end_line")
    end = None if end is None or int(end) < 0 else int(end)
    limit = max_chars if not args.get("max_chars") else max(1, min(int(args["max_chars"]), max_chars))
    numbered = bool(args.get("numbered"))
    fd = opened(full, os.O_RDONLY)
    shown_lines, size, last, total, cut = [], 0, start - 1, 0, False
    with os.fdopen(fd, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            total = number
            if number < start or (end is not None and number > end) or cut:
                continue
            line = text_of(raw, full)
            if numbered:
                line = "%6d\t%s" % (number, line)
            if size + len(line) > limit:
                if not shown_lines:  # one line longer than the limit: its head
                    shown_lines.append(line[:limit])
                    last = number
                cut = True
                continue
            shown_lines.append(line)
            size += len(line)
            last = number
    if total == 0:
        return "[read_file: %s is empty]" % shown(full)
    if start > total:
        raise Refused("%s has %d lines; start_line %d is past its end" % (shown(full), total, start))
    text = "".join(shown_lines)
    stop = total if end is None else min(end, total)
    if cut or last < stop:
        if not text.endswith("\n"):
            text += "\n"
        text += ("[read_file: lines %d-%d of %d shown (max_chars %d); read on with start_line=%d]"
                 % (start, last, total, limit, last + 1 if last >= start else start))
    return text


def write_file(args):
    full = resolve(args["path"])
    if os.path.isdir(full):
        raise Refused("%s is a directory" % shown(full))
    data = args["content"].encode("utf-8", "surrogatepass")
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        try:
            os.makedirs(parent)
        except OSError as error:
            raise Refused("%s: cannot create its folder: %s" % (shown(full), error.strerror))
    append = args.get("mode") == "append"
    fd = opened(full, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC))
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return "%s %d bytes to %s" % ("appended" if append else "wrote", len(data), shown(full))


def edit_file(args):
    full = resolve(args["path"])
    if not os.path.isfile(full):
        raise Refused("%s: no such file (create it with write_file)" % shown(full))
    if os.path.getsize(full) > EDIT_LIMIT:
        raise Refused("%s is larger than %d bytes; edit it with bash (sed, python3)" % (shown(full), EDIT_LIMIT))
    with os.fdopen(opened(full, os.O_RDONLY), "rb") as handle:
        text = text_of(handle.read(), full)
    action = args["action"]
    if action == "replace":
        old, new = args["old"], args["new"]
        if not old:
            raise Refused("`old` is empty; to add text use action insert")
        count = text.count(old)
        if count == 0:
            raise Refused("%s: `old` was not found; read the file again and copy the text exactly (spaces and "
                          "line breaks count)" % shown(full))
        if count > 1 and not args.get("all"):
            raise Refused("%s: `old` occurs %d times; include more of the text around it to make it unique, or set "
                          "all: true" % (shown(full), count))
        line = text[:text.index(old)].count("\n") + 1
        text = text.replace(old, new) if args.get("all") else text.replace(old, new, 1)
        what = "replaced %d occurrence%s (the first at line %d)" % (count if args.get("all") else 1,
                                                                  "s" if args.get("all") and count > 1 else "", line)
    else:
        lines = text.splitlines(True)
        if action == "insert":
            after = int(args["after_line"])
            if after < 0 or after > len(lines):
                raise Refused("%s has %d lines; after_line must be 0 to %d" % (shown(full), len(lines), len(lines)))
            insert = args["text"]
            if insert and not insert.endswith("\n"):
                insert += "\n"
            if after and not lines[after - 1].endswith("\n"):
                lines[after - 1] += "\n"
            lines[after:after] = [insert]
            what = "inserted %d line%s after line %d" % (insert.count("\n"), "" if insert.count("\n") == 1 else "s", after)
        else:
            start, end = int(args["start_line"]), int(args["end_line"])
            if not 1 <= start <= end <= len(lines):
                raise Refused("%s has %d lines; delete needs 1 <= start_line <= end_line <= %d"
                              % (shown(full), len(lines), len(lines)))
            del lines[start - 1:end]
            what = "deleted lines %d-%d" % (start, end)
        text = "".join(lines)
    with os.fdopen(opened(full, os.O_WRONLY | os.O_TRUNC), "wb") as handle:
        handle.write(text.encode("utf-8", "surrogatepass"))
    return "edited %s: %s" % (shown(full), what)


def main():
    request = json.loads(base64.b64decode(sys.argv[1]).decode("utf-8"))
    tool, args = request["tool"], request["args"]
    try:
        if tool == "read_file":
            result = read_file(args, int(request["max_chars"]))
        elif tool == "write_file":
            result = write_file(args)
        elif tool == "edit_file":
            result = edit_file(args)
        else:
            raise Refused("unknown file tool %r" % tool)
    except Refused as error:
        sys.stdout.write("error: %s\n" % error)
        return 1
    sys.stdout.write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
