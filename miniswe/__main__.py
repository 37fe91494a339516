"""The `miniswe` program: help from the cache when it can (miniswe/help_cache.py), else the command line."""

import sys

from miniswe.help_cache import HelpRequest


def main() -> None:
    request = HelpRequest.of(sys.argv)
    if request is not None and request.serve():
        return
    from miniswe.cli import main as cli

    cli(request)


if __name__ == "__main__":
    main()
