#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every source file of the project says its licence in its first lines, as SPDX names it, and the
licence it names is the one in LICENSE.

Usage: python3 spdx_test.py SOURCE_DIR
"""

import os
import sys

LINE = "SPDX-License-Identifier: Apache-2.0"
CODE = (".cpp", ".hpp", ".h", ".proto", ".go", ".lua", ".py", ".sh", ".cmake", ".in", ".service")
NAMED = ("CMakeLists.txt", "Makefile", "run", "deps", "postinst", "postrm", "prerm")
SKIPPED = {".git", "fuzz/corpus"}  # data, not code


def sources(root):
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = [x for x in dirs if not x.startswith("build") and os.path.normpath(os.path.join(rel, x)) not in SKIPPED]
        for f in files:
            if f.endswith(CODE) or f in NAMED:
                yield os.path.join(d, f)


def main():
    root = sys.argv[1]
    missing = [p for p in sources(root) if LINE not in "".join(open(p, errors="replace").readlines()[:3])]
    for p in missing:
        print("no '%s' in the first lines of %s" % (LINE, os.path.relpath(p, root)))
    with open(os.path.join(root, "LICENSE")) as f:
        licence = f.read()
    if "Apache License" not in licence or "Version 2.0, January 2004" not in licence:
        print("LICENSE is not the Apache License 2.0")
        return 1
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
