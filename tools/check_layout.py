#!/usr/bin/env python3
"""Checks that the README's layout table matches the tree (tools/lint.sh runs it): every
top-level folder git tracks has a row, every folder a row names exists, and every subfolder
of a source folder is named in that folder's row (as `sub/`, or inside a path), so a new room
of the house cannot appear without the table saying what it is."""

import pathlib
import re
import subprocess
import sys

SOURCE_FOLDERS = ("proto", "shm", "cuda", "store", "daemon", "agent", "base", "client", "python")


def layout_rows(readme):
    """{folder: the row's text} of the table under "## Layout"."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| `([^`]+)/` \|(.*)\|$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                           check=True).stdout.split()
    folders = {f.split("/")[0] for f in files if "/" in f and not f.startswith(".")}
    rows = layout_rows((root / "README.md").read_text())
    problems = [f"folder {f}/ has no row in README.md's layout table"
                for f in sorted(folders - rows.keys())]
    problems += [f"README.md's layout table names {f}/, which git does not track"
                 for f in sorted(rows.keys() - folders)]
    for folder in SOURCE_FOLDERS:
        subfolders = {f.split("/")[1] for f in files
                      if f.startswith(folder + "/") and f.count("/") >= 2}
        for sub in sorted(subfolders):
            text = rows.get(folder, "")
            if f"`{sub}/" not in text and f"/{sub}" not in text:
                problems.append(f"{folder}/{sub}/ is not named in the layout row of {folder}/")
    for problem in problems:
        print(f"layout: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
