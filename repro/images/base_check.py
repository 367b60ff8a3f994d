"""Check, inside the first build stage, that the base image is what the manifest declares
(``image.build.base``: ``python`` and ``ships``): the interpreter's version and each declared distribution's
version as pip lists it.

Written into every build context as ``repro-base-check.py`` and run by the base's own interpreter (Python
2.7 or 3), so it uses only the standard library of both. argv: the declared Python version (``3.6`` matches
3.6.x; empty: not checked), then ``name==version`` for each declared distribution. Exit 1 with one line
naming every difference.
"""

import platform
import re
import subprocess
import sys


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed():
    out = subprocess.check_output([sys.executable, "-m", "pip", "list", "--format=freeze"])
    found = {}
    for line in out.decode("utf-8", "replace").splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            found[normalize(name)] = version
    return found


def differences(python, ships, version, found):
    out = []
    if python and version.split(".")[:len(python.split("."))] != python.split("."):
        out.append("python %s, declared %s" % (version, python))  # noqa: UP031 - Python 2 too
    for item in ships:
        name, _, want = item.partition("==")
        have = found.get(normalize(name))
        if have is None:
            out.append("%s not installed, declared %s" % (name, want))  # noqa: UP031
        elif have != want:
            out.append("%s %s, declared %s" % (name, have, want))  # noqa: UP031
    return out


def main(argv):
    python, ships = (argv[0] if argv else ""), argv[1:]
    diff = differences(python, ships, platform.python_version(), installed() if ships else {})
    if diff:
        sys.stderr.write("repro: the base image is not the one image.build.base declares: %s\n"  # noqa: UP031
                         % "; ".join(diff))
        return 1
    sys.stdout.write("repro: base as declared: python %s%s\n" % (  # noqa: UP031
        platform.python_version(), "".join(", " + s for s in ships)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
